"""Input batches for validation and profiling: seeded synthetic images, or a folder of real ones.

Real images always go through :func:`timm_eval_transform` (timm's own eval preprocessing for
the model, at the model's actual input size); ``deploytk validate --images`` and
``deploytk eval`` share it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image
from timm.data import create_transform, resolve_data_config

from deploytk.errors import DeploytkError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}


def synthetic_batches(num_images: int, batch_size: int, img_size, seed: int = 0) -> list[np.ndarray]:
    """Normalised-image-like inputs (standard normal), reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    batches, left = [], num_images
    while left > 0:
        b = min(batch_size, left)
        batches.append(rng.standard_normal((b, 3, *img_size), dtype=np.float32))
        left -= b
    return batches


def model_input_size(vit) -> tuple[int, int] | None:
    """(H, W) the model was built for (``export.img_size``), or None if it does not say."""
    img = getattr(getattr(vit, "patch_embed", None), "img_size", None)
    if img is None:
        return None
    return (int(img), int(img)) if isinstance(img, int) else (int(img[0]), int(img[1]))


def timm_eval_transform(vit):
    """timm's eval transform for ``vit``: ``resolve_data_config({}, model=vit)`` + ``create_transform``.

    The input size is the model's own (``patch_embed.img_size``): a model built with a
    non-default ``img_size`` keeps its pretrained_cfg's 224, which would not fit it. Resize
    ratio (crop_pct), interpolation, mean and std stay timm's.
    """
    size = model_input_size(vit)
    args = {"input_size": (3, *size)} if size else {}
    return create_transform(**resolve_data_config(args, model=vit))


def load_images(files: list[Path], transform) -> np.ndarray:
    """``files`` read as RGB and preprocessed by ``transform``, stacked to float32 [N, 3, H, W]."""
    images = []
    for f in files:
        try:
            with Image.open(f) as img:
                images.append(transform(img.convert("RGB")).numpy())
        except Exception as err:
            raise DeploytkError(f"image {f} could not be read ({err}).") from None
    return np.stack(images).astype(np.float32)


def folder_batches(folder: Path, num_images: int, batch_size: int, vit) -> list[np.ndarray]:
    """Up to ``num_images`` images from ``folder`` (recursively), preprocessed as timm would for ``vit``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DeploytkError(f"image folder {folder} does not exist (--images).")
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)[:num_images]
    if not files:
        raise DeploytkError(f"image folder {folder} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))}).")
    transform = timm_eval_transform(vit)
    return [load_images(files[i : i + batch_size], transform) for i in range(0, len(files), batch_size)]
