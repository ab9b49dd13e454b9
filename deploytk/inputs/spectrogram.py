"""Spectrograms: ``input_values`` float32 ``[batch, time, mel]``, as transformers' Audio Spectrogram Transformer takes
them, made from sound files read by soundfile.

A sound file is decoded to float32 samples, its channels averaged to mono; the family's feature extractor
(``ASTFeatureExtractor``) resamples it to its own rate and turns it into log-mel filter banks of ``time`` frames
(padded or cut) and ``mel`` bins.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from deploytk.errors import DeploytkError
from deploytk.inputs.base import Canvas, InputKind, PatchGrid, register_kind, tiles

AUDIO_SUFFIXES = frozenset({".wav", ".flac", ".ogg"})
#: the colour map a spectrogram is drawn in, low to high (viridis' anchors, interpolated linearly)
COLORMAP = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], dtype=np.float32) / 255


@dataclasses.dataclass(frozen=True)
class Waveform:
    """A decoded sound: mono float32 samples and their rate."""

    samples: np.ndarray
    rate: int


@register_kind
@dataclasses.dataclass(frozen=True)
class SpectrogramInput(InputKind):
    """``time`` frames of ``mel`` log-mel filter banks of one sound."""

    time: int
    mel: int

    kind = "spectrogram"
    onnx_name = "input_values"
    axes = ("time", "mel")
    noun, nouns = "sound", "sounds"
    suffixes = AUDIO_SUFFIXES
    drawn = True
    file_help = "a sound file soundfile decodes (" + ", ".join(sorted(AUDIO_SUFFIXES)) + ")"

    def preprocessing(self) -> str:
        return (
            "A sound is decoded to mono samples (channels averaged) and preprocessed as for the PyTorch model: the model's "
            f"feature extractor resamples it to its own rate and makes {self.time} frames (padded or cut) of {self.mel} "
            "log-mel filter banks, normalised; time first, then mel bins."
        )

    def read(self, path: Path) -> Waveform:
        return read_waveform(Path(path))

    def canvas(self, sample: np.ndarray, normalization: tuple, grid: PatchGrid) -> Canvas:
        """The log-mel spectrogram (mean/std undone) in a colour map: time along x, frequency along y with the low bins
        at the bottom. The patch grid's rows are frequencies, its columns times (``grid.rows`` x ``grid.cols``); where
        patches overlap each is drawn in its own stride cell."""
        (mean,), (std,) = normalization
        plane = (np.asarray(sample, dtype=np.float32) * std + mean).T[::-1]  # [mel, time], the highest bin first
        low, high = np.percentile(plane, [1, 99])
        level = np.clip((plane - low) / max(float(high - low), 1e-6), 0, 1) * (len(COLORMAP) - 1)
        below = np.minimum(level.astype(np.int64), len(COLORMAP) - 2)
        share = (level - below)[..., None]
        background = (1 - share) * COLORMAP[below] + share * COLORMAP[below + 1]
        patch = tiles((self.mel, self.time), grid)[::-1]  # the grid's row 0 holds the lowest bins
        return Canvas(background, patch, f"input: log-mel spectrogram, {grid.rows}x{grid.cols} patches (frequency x time)")


def read_waveform(path: Path) -> Waveform:
    """The sound at ``path`` as mono float32 (channels averaged), decoded by soundfile; refused with its name."""
    try:
        import soundfile  # optional: deploytk[media]
    except ImportError:
        raise DeploytkError(
            f"sound {path} is an audio file, and soundfile is not installed.", hint="pip install 'deploytk[media]'"
        ) from None
    if path.is_dir():
        raise DeploytkError(f"sound {path} is a directory, not an audio file.")
    try:
        samples, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except Exception as err:  # soundfile.LibsndfileError and OS errors alike: the file is unreadable
        raise DeploytkError(f"sound {path} could not be decoded ({err}).") from None
    if not len(samples):
        raise DeploytkError(f"sound {path} has no samples.")
    return Waveform(samples.mean(axis=1).astype(np.float32), int(rate))
