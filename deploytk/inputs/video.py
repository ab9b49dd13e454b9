"""Video clips: ``pixel_values`` float32 ``[batch, frames, 3, H, W]``, as transformers' video models (VideoMAE, ViViT)
take them, read from video files by PyAV.

A clip file is decoded whole and ``frames`` frames are taken from it at evenly spaced positions over its full length
(``numpy.linspace(0, n - 1, frames)`` rounded; a clip shorter than ``frames`` repeats frames), the same rule for every
command, so a clip always gives the same input. The family's processor (``VideoMAEImageProcessor``, ...) then resizes,
crops and normalises those frames.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from deploytk.errors import DeploytkError
from deploytk.inputs.base import InputKind, register_kind

VIDEO_SUFFIXES = frozenset({".mp4", ".webm", ".avi", ".mkv", ".mov"})


@register_kind
@dataclasses.dataclass(frozen=True)
class VideoInput(InputKind):
    """``frames`` RGB frames of one clip, frames first, channels second."""

    frames: int
    channels: int
    height: int
    width: int

    kind = "video"
    onnx_name = "pixel_values"
    axes = ("frames", "channels", "height", "width")
    noun, nouns = "clip", "clips"
    suffixes = VIDEO_SUFFIXES

    @classmethod
    def of_size(cls, frames: int, size: tuple[int, int]) -> VideoInput:
        return cls(int(frames), 3, int(size[0]), int(size[1]))

    def label(self) -> str:
        return f"{self.frames}-frame {self.height}x{self.width} clip"

    def preprocessing(self) -> str:
        return (
            f"A clip gives {self.frames} RGB frames at evenly spaced positions over its whole length (a shorter clip repeats "
            f"frames), preprocessed as for the PyTorch model: the model's video processor (saved with it, else its class's "
            f"defaults) resizes, crops to {self.height}x{self.width} and normalises each frame; frames first, then channels."
        )

    def read(self, path: Path) -> list[np.ndarray]:
        """``frames`` frames of the clip at ``path`` as H x W x 3 uint8 RGB arrays (evenly spaced; see the module)."""
        return read_frames(Path(path), self.frames)


def read_frames(path: Path, count: int) -> list[np.ndarray]:
    """``count`` evenly spaced frames of the video at ``path`` (RGB uint8, decoded by PyAV); refused with its name."""
    try:
        import av  # optional: deploytk[media]
    except ImportError:
        raise DeploytkError(
            f"clip {path} is a video, and PyAV (the `av` package) is not installed.", hint="pip install 'deploytk[media]'"
        ) from None
    if path.is_dir():
        raise DeploytkError(f"clip {path} is a directory, not a video file.")
    try:
        with av.open(str(path)) as container:
            stream = next(iter(container.streams.video), None)
            if stream is None:
                raise DeploytkError(f"clip {path} holds no video stream.")
            decoded = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
    except DeploytkError:
        raise
    except Exception as err:  # PyAV's errors (InvalidDataError, ...) and OS errors alike: the file is unreadable
        raise DeploytkError(f"clip {path} could not be decoded ({err}).") from None
    if not decoded:
        raise DeploytkError(f"clip {path} has no frames.")
    positions = np.linspace(0, len(decoded) - 1, count).round().astype(int)
    return [decoded[i] for i in positions]
