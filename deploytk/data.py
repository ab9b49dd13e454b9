"""Input batches for validation and profiling: seeded synthetic images, or a folder of real ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np

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


def folder_batches(folder: Path, num_images: int, batch_size: int, vit) -> list[np.ndarray]:
    """Up to ``num_images`` images from ``folder`` (recursively), preprocessed as timm would for ``vit``."""
    from PIL import Image
    from timm.data import create_transform, resolve_data_config

    folder = Path(folder)
    if not folder.is_dir():
        raise DeploytkError(f"image folder {folder} does not exist (--images).")
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)[:num_images]
    if not files:
        raise DeploytkError(f"image folder {folder} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))}).")
    transform = create_transform(**resolve_data_config({}, model=vit))
    images = []
    for f in files:
        try:
            images.append(transform(Image.open(f).convert("RGB")).numpy())
        except Exception as err:
            raise DeploytkError(f"image {f} could not be read ({err}).") from None
    return [np.stack(images[i : i + batch_size]).astype(np.float32) for i in range(0, len(images), batch_size)]
