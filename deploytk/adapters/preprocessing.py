"""A family's eval preprocessing written down as data (``deploytk.inputs.preprocess``): what export records in the
manifest, so that the artifact applies it without torch, timm or transformers.

A torchvision pipeline (timm's ``create_transform``, the transformers families' fallback) is read step by step; a step
this module does not know gives the reason instead, and the artifact records no pipeline rather than a wrong one. A
saved transformers image processor is not recorded: transformers 5 resizes with torchvision's tensor kernels, which
Pillow does not reproduce (measured here: up to 0.56 apart after normalisation for a CLIPImageProcessor, 0.008 for a
ViTImageProcessor), and the pipeline must equal the model's own.
"""

from __future__ import annotations

from typing import Any

from deploytk.inputs.preprocess import INTERPOLATIONS, ImagePipeline


class NotRecordable(Exception):
    """A preprocessing step with no data form here: the reason is the message."""


def from_torchvision(transform: Any, source: str) -> ImagePipeline:
    """A torchvision ``Compose`` of Resize / timm's ResizeKeepRatio, CenterCrop, ToTensor (timm's MaybeToTensor) and
    Normalize, as a pipeline; anything else raises NotRecordable."""
    from torchvision import transforms as T

    if not isinstance(transform, T.Compose):
        raise NotRecordable(f"the eval transform is a {type(transform).__name__}, not a torchvision Compose")
    size: int | tuple[int, int] | None = None
    mode, interpolation, crop, rescale, mean, std = "exact", "bilinear", None, None, None, None
    for step in transform.transforms:
        name = type(step).__name__
        if isinstance(step, T.Resize):
            if step.max_size is not None:
                raise NotRecordable("Resize with max_size")
            given = step.size
            if isinstance(given, int) or len(given) == 1:
                size, mode = int(given if isinstance(given, int) else given[0]), "shorter"
            else:
                size, mode = (int(given[0]), int(given[1])), "exact"
            interpolation = step.interpolation.value
        elif name == "ResizeKeepRatio":
            random = step.random_scale_prob or step.random_aspect_prob
            if step.longest != 0 or random:
                raise NotRecordable("ResizeKeepRatio with longest or random scaling")
            size, mode = (int(step.size[0]), int(step.size[1])), "keep_ratio"
            interpolation = step.interpolation.value if hasattr(step.interpolation, "value") else str(step.interpolation)
        elif isinstance(step, T.CenterCrop):
            crop = (int(step.size[0]), int(step.size[1]))
        elif isinstance(step, T.ToTensor) or name == "MaybeToTensor":
            rescale = 1.0 / 255.0
        elif isinstance(step, T.Normalize):
            mean, std = _floats(step.mean), _floats(step.std)
        else:
            raise NotRecordable(f"the step {name}")
    if rescale is None:
        raise NotRecordable("no ToTensor step")
    if interpolation not in INTERPOLATIONS:
        raise NotRecordable(f"the interpolation {interpolation}")
    return ImagePipeline(size, mode, interpolation, crop, rescale, mean, std, source)


def _floats(values: Any) -> tuple[float, ...]:
    values = values.tolist() if hasattr(values, "tolist") else values
    return tuple(float(v) for v in (values if isinstance(values, (list, tuple)) else [values] * 3))


def record_or_reason(make) -> dict[str, Any]:
    """``make()``'s pipeline as the manifest's record, or ``{"kind": None, "reason": ...}`` where it cannot be one."""
    try:
        return make().record()
    except NotRecordable as err:
        return {"kind": None, "reason": f"not recorded: {err} has no data form in deploytk.inputs.preprocess"}
