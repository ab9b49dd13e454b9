"""Input kinds: what one sample of a model's input is (an image, a video clip, a spectrogram), in one place.

An input kind owns everything that depends on the layout of the model's input: the ONNX input's name
and shape (batch first, symbolic), seeded synthetic batches, the file types it reads and how it decodes
them (before the model family's own processor turns them into model input), the Triton tensor spec and
how ``visualize`` lays a sample out. A model family declares its kind (``ModelFamily.input_kind``); an
artifact's manifest records it (``inputs[0]``), and ``input_from_record`` rebuilds it from there. Nothing
outside this package knows that an image is ``[3, H, W]``. A new kind is one file here with ``@register_kind``.
"""

from __future__ import annotations

import importlib
import pkgutil

from deploytk.inputs.base import GAP, KINDS, NO_PATCH, Canvas, InputKind, PatchGrid, input_from_record, register_kind

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

from deploytk.inputs.image import ImageInput  # noqa: E402 (registered above; re-exported for the families)
from deploytk.inputs.spectrogram import SpectrogramInput  # noqa: E402
from deploytk.inputs.video import VideoInput  # noqa: E402

__all__ = [
    "GAP",
    "KINDS",
    "NO_PATCH",
    "Canvas",
    "ImageInput",
    "InputKind",
    "PatchGrid",
    "SpectrogramInput",
    "VideoInput",
    "input_from_record",
    "register_kind",
]
