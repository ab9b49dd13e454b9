"""Input batches for validation and profiling: seeded synthetic images, or a folder of real ones.

Real images are read in one place, :func:`read_rgb` (every command: validate's ``images``, eval,
calibrate, tune's ``data``, visualize), and then go through the model family's own eval preprocessing
(``ModelFamily.eval_transform``: timm's for a timm model, at the model's actual input size).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from deploytk.errors import DeploytkError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}
#: Pillow modes of more than 8 bits per sample whose range is 0..65535; Pillow's convert("RGB") clips them at 255
#: (a 16-bit image turns white), so they are scaled as Pillow itself reads 16-bit RGB and LA PNGs: the high byte
_SIXTEEN_BIT = {"I;16", "I;16L", "I;16B", "I;16N"}


def read_rgb(path: Path) -> Image.Image:
    """The image at ``path`` as 8-bit RGB, as its pixels mean it: EXIF orientation applied, then Pillow's own conversion
    (palette, grayscale, CMYK, alpha dropped as timm's and torchvision's loaders drop it), 16-bit samples scaled to
    8 bits by their range (the high byte, Pillow's rule for 16-bit RGB) instead of clipped. Anything else is refused
    with the file name."""
    if Path(path).is_dir():  # Pillow's own message would be "[Errno 21] Is a directory" inside "could not be read"
        raise DeploytkError(f"image {path} is a directory, not an image file.")
    try:
        with Image.open(path) as opened:
            img = ImageOps.exif_transpose(opened)
            img.load()
    except Exception as err:
        raise DeploytkError(f"image {path} could not be read ({err}).") from None
    if img.mode in _SIXTEEN_BIT or img.mode == "I":
        values = np.asarray(img, dtype=np.int64)
        if values.size and (values.min() < 0 or values.max() > 65535):
            raise DeploytkError(
                f"image {path} has 32-bit integer pixels from {values.min()} to {values.max()}, outside 0..65535: there is no "
                "faithful 8-bit RGB for them.",
                hint="Save it as 8- or 16-bit (PNG, TIFF) first.",
            )
        img = Image.fromarray((values >> 8).astype(np.uint8))  # 2-D uint8: mode L
    elif img.mode == "F":
        raise DeploytkError(
            f"image {path} has 32-bit floating-point pixels, which have no defined range to map to 8-bit RGB.",
            hint="Save it as 8- or 16-bit (PNG, TIFF) first.",
        )
    try:
        return img.convert("RGB")
    except ValueError as err:
        raise DeploytkError(f"image {path} (Pillow mode {img.mode}) cannot be converted to RGB ({err}).") from None


def synthetic_batches(num_images: int, batch_size: int, img_size, seed: int = 0) -> list[np.ndarray]:
    """Normalised-image-like inputs (standard normal), reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    batches, left = [], num_images
    while left > 0:
        b = min(batch_size, left)
        batches.append(rng.standard_normal((b, 3, *img_size), dtype=np.float32))
        left -= b
    return batches


def load_images(files: list[Path], transform) -> np.ndarray:
    """``files`` read by ``read_rgb`` and preprocessed by ``transform``, stacked to float32 [N, 3, H, W]."""
    return np.stack([transform(read_rgb(f)).numpy() for f in files]).astype(np.float32)


def image_files(folder: Path, num_images: int) -> list[Path]:
    """Up to ``num_images`` image files under ``folder`` (recursively, sorted); a missing or imageless folder is refused."""
    folder = Path(folder)
    if not folder.is_dir():
        problem = "does not exist" if not folder.exists() else "is a file, not a folder of images"
        raise DeploytkError(f"image folder {folder} {problem} (`images=`).")
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)[:num_images]
    if not files:
        raise DeploytkError(f"image folder {folder} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))}).")
    return files


def folder_batches(folder: Path, num_images: int, batch_size: int, transform) -> list[np.ndarray]:
    """Up to ``num_images`` images from ``folder`` (recursively), preprocessed by ``transform`` (the model family's own)."""
    files = image_files(folder, num_images)
    return [load_images(files[i : i + batch_size], transform) for i in range(0, len(files), batch_size)]
