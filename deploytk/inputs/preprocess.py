"""An artifact's input pipeline as data (the manifest's ``preprocess``), and the one implementation that applies it.

Export records what the model family's own eval preprocessing does (``ModelFamily.preprocess_record``: timm's
transform, a transformers image processor), so a deployed artifact takes a JPEG, a PIL image or a uint8 array without
torch, timm or transformers: Pillow resizes (the same resampling torchvision applies to a PIL image), numpy crops,
scales and normalises. Every command and ``Artifact.preprocess`` / ``runner`` go through ``ImagePipeline.apply``.

An image record::

    {"kind": "image", "from": "timm", "channel_order": "RGB", "layout": "CHW",
     "resize": {"mode": "shorter" | "exact" | "keep_ratio", "size": 248 | [H, W], "interpolation": "bicubic"} | null,
     "crop": [H, W] | null, "rescale": 0.00392156862745098, "mean": [...] | null, "std": [...] | null}

``resize.mode``: ``shorter``, the shorter side to ``size`` pixels, the aspect kept (torchvision's ``Resize(int)``);
``exact``, to [H, W]; ``keep_ratio``, scaled by one factor so that the side nearer its target meets it (timm's
``ResizeKeepRatio`` for a non-square input). ``crop``: a centre crop. ``rescale``: the factor pixels 0..255 are
multiplied by.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from deploytk.errors import DeploytkError
from deploytk.inputs.image import read_rgb, rgb

#: the interpolation names a record uses -> Pillow's filters (torchvision maps its InterpolationMode to the same ones)
INTERPOLATIONS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


RESIZE_MODES = ("shorter", "exact", "keep_ratio")


@dataclasses.dataclass(frozen=True)
class ImagePipeline:
    """An image record, checked; ``apply`` turns one image into the model's input for it, ``[3, H, W]`` float32."""

    size: int | tuple[int, int] | None
    mode: str
    interpolation: str
    crop: tuple[int, int] | None
    rescale: float
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    source: str = ""

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ImagePipeline:
        if record.get("kind") != "image" or record.get("channel_order", "RGB") != "RGB" or record.get("layout", "CHW") != "CHW":
            raise DeploytkError(f"the manifest's preprocess record {record!r} is not an RGB image pipeline this deploytk applies.")
        try:
            return cls._checked(record)
        except (KeyError, IndexError, TypeError, ValueError) as err:
            raise DeploytkError(
                f"the preprocess record {record!r} is malformed ({type(err).__name__}: {err}).",
                hint="Write it as `Artifact.preprocessing` shows one: resize {mode, size, interpolation}, crop [H, W], rescale, mean, std.",
            ) from None

    @classmethod
    def _checked(cls, record: dict[str, Any]) -> ImagePipeline:
        resize = record.get("resize")
        interpolation = (resize or {}).get("interpolation", "bilinear")
        if interpolation not in INTERPOLATIONS:
            raise DeploytkError(f"the manifest's preprocess interpolation {interpolation!r} is not one of {', '.join(INTERPOLATIONS)}.")
        size = None if resize is None else resize["size"] if isinstance(resize["size"], int) else tuple(int(v) for v in resize["size"])
        mode = (resize or {}).get("mode", "shorter" if isinstance(size, int) else "exact")
        if size is not None and (
            mode not in RESIZE_MODES or (mode == "shorter") != isinstance(size, int) or (not isinstance(size, int) and len(size) != 2)
        ):
            raise DeploytkError(
                f"the manifest's preprocess resize {resize!r} is not one this deploytk applies (modes: {', '.join(RESIZE_MODES)}; "
                "shorter takes one int, exact and keep_ratio [H, W])."
            )
        if "rescale" not in record:  # 1.0 by default would normalise 0..255 pixels with a [0, 1] mean and std
            raise DeploytkError(f"the preprocess record {record!r} has no `rescale` (1/255 for pixels into [0, 1], 1.0 to keep 0..255).")
        crop = record.get("crop")
        mean, std = record.get("mean"), record.get("std")
        if (mean is None) != (std is None) or (mean is not None and (len(mean) != 3 or len(std) != 3)):
            raise DeploytkError(f"the preprocess record's mean {mean!r} and std {std!r} must both be three numbers (R, G, B) or both null.")
        return cls(
            size=size,
            mode=mode,
            interpolation=interpolation,
            crop=None if crop is None else (int(crop[0]), int(crop[1])),
            rescale=float(record["rescale"]),
            mean=None if mean is None else tuple(float(v) for v in mean),
            std=None if std is None else tuple(float(v) for v in std),
            source=str(record.get("from", "")),
        )

    def record(self) -> dict[str, Any]:
        size = self.size if isinstance(self.size, int) else None if self.size is None else list(self.size)
        resize = None if size is None else {"mode": self.mode, "size": size, "interpolation": self.interpolation}
        return {
            "kind": "image",
            "from": self.source,
            "channel_order": "RGB",
            "layout": "CHW",
            "resize": resize,
            "crop": None if self.crop is None else list(self.crop),
            "rescale": self.rescale,
            "mean": None if self.mean is None else list(self.mean),
            "std": None if self.std is None else list(self.std),
        }

    def apply(self, image: Image.Image) -> np.ndarray:
        """One RGB image -> ``[3, H, W]`` float32, as the family's own eval preprocessing makes it."""
        if self.size is not None:
            image = image.resize(_resized(image.size, self.size, self.mode), INTERPOLATIONS[self.interpolation])
        if self.crop is not None:
            image = _center_crop(image, self.crop)
        pixels = np.asarray(image, dtype=np.float32) * np.float32(self.rescale)
        chw = np.ascontiguousarray(pixels.transpose(2, 0, 1))
        if self.mean is not None and self.std is not None:
            mean = np.asarray(self.mean, dtype=np.float32)[:, None, None]
            std = np.asarray(self.std, dtype=np.float32)[:, None, None]
            chw = (chw - mean) / std
        return chw.astype(np.float32, copy=False)

    def apply_all(self, images: list[Image.Image]) -> np.ndarray:
        """Several images as one float32 batch ``[N, 3, H, W]``."""
        return np.stack([self.apply(image) for image in images])

    def describe(self) -> str:
        steps = []
        if self.size is not None:
            size = f"shorter side {self.size}" if isinstance(self.size, int) else f"{self.size[0]}x{self.size[1]}"
            size += ", aspect kept" if self.mode == "keep_ratio" else ""
            steps.append(f"resize to {size} ({self.interpolation})")
        if self.crop is not None:
            steps.append(f"centre crop {self.crop[0]}x{self.crop[1]}")
        steps.append(f"x {self.rescale:g}")
        if self.mean is not None:
            steps.append(f"mean {_short(self.mean)}, std {_short(self.std or ())}")
        return ", ".join(steps)


def _short(values: tuple[float, ...]) -> str:
    return "(" + ", ".join(f"{v:.4g}" for v in values) + ")"


def _resized(size: tuple[int, int], target: int | tuple[int, int], mode: str) -> tuple[int, int]:
    """Pillow's (width, height) for ``target``: [H, W] as given (``exact``), or scaled by the smaller of the two ratios
    and rounded as timm's ``ResizeKeepRatio`` does (``keep_ratio``); an int the shorter side, the longer one scaled and
    truncated as torchvision's ``Resize(int)`` computes it."""
    width, height = size
    if mode == "keep_ratio" and not isinstance(target, int):
        ratio = min(height / target[0], width / target[1])
        return round(width / ratio), round(height / ratio)
    if not isinstance(target, int):
        return int(target[1]), int(target[0])
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = target, int(target * long / short)
    return (new_short, new_long) if width <= height else (new_long, new_short)


def _center_crop(image: Image.Image, crop: tuple[int, int]) -> Image.Image:
    """torchvision's ``CenterCrop`` of a PIL image: an image smaller than the crop is first padded with black as it pads
    (left and top get the floor of half), then the offsets rounded as it rounds them (timm's crop_pct > 1 crops so)."""
    height, width = crop
    if image.height < height or image.width < width:
        pad_w, pad_h = max(width - image.width, 0), max(height - image.height, 0)
        padded = Image.new(image.mode, (image.width + pad_w, image.height + pad_h))
        padded.paste(image, (pad_w // 2, pad_h // 2))
        image = padded
    top = int(round((image.height - height) / 2.0))
    left = int(round((image.width - width) / 2.0))
    return image.crop((left, top, left + width, top + height))


def as_images(value: Any) -> list[Image.Image] | None:
    """``value`` as RGB images when it is images (a path, a PIL image, a uint8 [H, W, 3] or [N, H, W, 3] array, or a
    list of these), else None (a float array or tensor: the model's own input)."""
    if isinstance(value, (str, Path)):
        return [read_rgb(Path(value))]
    if isinstance(value, Image.Image):
        return [rgb(value, "the PIL image")]  # as a file of it is read: EXIF orientation, 16-bit scaled, not clipped
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (str, Path, Image.Image, np.ndarray)) for v in value):
        images = [as_images(v) for v in value]
        if all(i is None for i in images):
            return None  # model-ready float arrays, stacked by the caller
        if any(i is None for i in images):
            raise DeploytkError("a list of inputs mixes images with model-ready float arrays; pass one kind.")
        return [image for group in images for image in group or []]
    if isinstance(value, np.ndarray) and value.dtype == np.uint8:
        if value.ndim == 3 and value.shape[-1] == 3:
            return [Image.fromarray(value, "RGB")]
        if value.ndim == 4 and value.shape[-1] == 3:
            return [Image.fromarray(v, "RGB") for v in value]
        raise DeploytkError(
            f"a uint8 array of shape {list(value.shape)} is not an image deploytk can preprocess: uint8 pixels come as "
            "[H, W, 3] or [N, H, W, 3] (RGB, channels last, as Pillow and OpenCV after cvtColor give them).",
            hint="Pass the pixels channels last, or the model's input itself as float32 (already resized and normalised).",
        )
    return None
