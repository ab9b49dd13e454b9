"""Images: ``input`` float32 ``[batch, 3, H, W]``, read from image files by Pillow.

Real images are read in one place, :func:`read_rgb` (every command: validate's ``images``, eval, calibrate,
tune's ``data``, visualize), and then go through the model family's own eval preprocessing
(``ModelFamily.eval_transform``: timm's for a timm model, at the model's actual input size).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from deploytk.errors import DeploytkError
from deploytk.inputs.base import Canvas, InputKind, PatchGrid, register_kind, tiles

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"})
#: Pillow modes of more than 8 bits per sample whose range is 0..65535; Pillow's convert("RGB") clips them at 255
#: (a 16-bit image turns white), so they are scaled as Pillow itself reads 16-bit RGB and LA PNGs: the high byte
_SIXTEEN_BIT = {"I;16", "I;16L", "I;16B", "I;16N"}


@register_kind
@dataclasses.dataclass(frozen=True)
class ImageInput(InputKind):
    """One RGB image, channels first, as timm and transformers' image models take it."""

    channels: int
    height: int
    width: int

    kind = "image"
    onnx_name = "input"
    axes = ("channels", "height", "width")
    noun, nouns = "image", "images"
    suffixes = IMAGE_SUFFIXES
    drawn = True
    file_help = "a PNG or JPG file (anything Pillow reads)"

    @classmethod
    def of_size(cls, size: tuple[int, int]) -> ImageInput:
        """An RGB image of ``size`` (H, W)."""
        return cls(3, int(size[0]), int(size[1]))

    def preprocessing(self) -> str:
        return (
            f"An image is decoded to RGB (EXIF orientation applied) and preprocessed as for the PyTorch model: the model "
            f"family's own eval transform to {self.height}x{self.width} (a timm model's resize, crop and mean/std "
            "normalisation; a transformers model's saved image processor)."
        )

    def read(self, path: Path) -> Image.Image:
        return read_rgb(path)

    def canvas(self, sample: np.ndarray, normalization: tuple, grid: PatchGrid) -> Canvas:
        """The image as the model saw it (mean/std undone), its patches tiling it."""
        background = unnormalised(sample, normalization)
        return Canvas(background, tiles(background.shape[:2], grid), f"input ({grid.rows}x{grid.cols} patches)")


def unnormalised(sample: np.ndarray, normalization: tuple) -> np.ndarray:
    """One normalised RGB sample [3, H, W] back in [0, 1] as [H, W, 3] (mean/std undone)."""
    mean, std = (np.asarray(v, dtype=np.float32)[:, None, None] for v in normalization)
    return np.clip(np.asarray(sample, dtype=np.float32) * std + mean, 0, 1).transpose(1, 2, 0)


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
    return _as_rgb(img, f"image {path}")


def rgb(img: Image.Image, what: str) -> Image.Image:
    """A PIL image a caller holds as 8-bit RGB by ``read_rgb``'s rules (EXIF orientation applied, 16-bit samples scaled
    by their range, not clipped); ``what`` names it in a refusal."""
    return _as_rgb(ImageOps.exif_transpose(img), what)


def _as_rgb(img: Image.Image, what: str) -> Image.Image:
    if img.mode in _SIXTEEN_BIT or img.mode == "I":
        values = np.asarray(img, dtype=np.int64)
        if values.size and (values.min() < 0 or values.max() > 65535):
            raise DeploytkError(
                f"{what} has 32-bit integer pixels from {values.min()} to {values.max()}, outside 0..65535: there is no "
                "faithful 8-bit RGB for them.",
                hint="Save it as 8- or 16-bit (PNG, TIFF) first.",
            )
        img = Image.fromarray((values >> 8).astype(np.uint8))  # 2-D uint8: mode L
    elif img.mode == "F":
        raise DeploytkError(
            f"{what} has 32-bit floating-point pixels, which have no defined range to map to 8-bit RGB.",
            hint="Save it as 8- or 16-bit (PNG, TIFF) first.",
        )
    try:
        return img.convert("RGB")
    except ValueError as err:
        raise DeploytkError(f"{what} (Pillow mode {img.mode}) cannot be converted to RGB ({err}).") from None
