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
from deploytk.inputs.base import InputKind, register_kind

AUDIO_SUFFIXES = frozenset({".wav", ".flac", ".ogg"})


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

    def label(self) -> str:
        return f"{self.time}x{self.mel} spectrogram"

    def preprocessing(self) -> str:
        return (
            "A sound is decoded to mono samples (channels averaged) and preprocessed as for the PyTorch model: the model's "
            f"feature extractor resamples it to its own rate and makes {self.time} frames (padded or cut) of {self.mel} "
            "log-mel filter banks, normalised; time first, then mel bins."
        )

    def read(self, path: Path) -> Waveform:
        return read_waveform(Path(path))


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
