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
from deploytk.inputs.base import GAP, Canvas, InputKind, PatchGrid, register_kind, tiles
from deploytk.inputs.image import unnormalised

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
    drawn = True
    file_help = "a video file PyAV decodes (" + ", ".join(sorted(VIDEO_SUFFIXES)) + ")"

    @classmethod
    def of_size(cls, frames: int, size: tuple[int, int]) -> VideoInput:
        return cls(int(frames), 3, int(size[0]), int(size[1]))

    def preprocessing(self) -> str:
        return (
            f"A clip gives {self.frames} RGB frames at evenly spaced positions over its whole length (a shorter clip repeats "
            f"frames), preprocessed as for the PyTorch model: the model's video processor (saved with it, else its class's "
            f"defaults) resizes, crops to {self.height}x{self.width} and normalises each frame; frames first, then channels."
        )

    def read(self, path: Path) -> list[np.ndarray]:
        """``frames`` frames of the clip at ``path`` as H x W x 3 uint8 RGB arrays (evenly spaced; see the module)."""
        return read_frames(Path(path), self.frames)

    def canvas(self, sample: np.ndarray, normalization: tuple, grid: PatchGrid) -> Canvas:
        """The clip as one row of frames, one per tubelet group (the first frame of its tubelets), mean/std undone, a white
        gap between them; group g's patches are tokens g x rows x cols onwards (time first)."""
        tubelet = self.frames // grid.time_groups
        frames = [unnormalised(sample[g * tubelet], normalization) for g in range(grid.time_groups)]
        h, w = frames[0].shape[:2]
        gap = max(1, w // 16)
        background = np.ones((h, grid.time_groups * (w + gap) - gap, 3), dtype=np.float32)
        patch = np.full(background.shape[:2], GAP, dtype=np.int64)
        plane = tiles((h, w), grid)
        for g, frame in enumerate(frames):
            x = g * (w + gap)
            background[:, x : x + w] = frame
            patch[:, x : x + w] = np.where(plane >= 0, g * grid.rows * grid.cols + plane, plane)
        shown = ", ".join(str(g * tubelet) for g in range(grid.time_groups))
        frames = f"frame{'s' * (grid.time_groups > 1)} {shown}"
        title = f"input: {frames} (the first of each {tubelet}-frame tubelet), {grid.rows}x{grid.cols} patches each"
        return Canvas(background, patch, title)


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
