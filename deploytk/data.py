"""Input batches for validation, profiling and calibration: seeded synthetic ones, or a folder of real files.

What one sample is (its shape, its file types, how a file is decoded) is its input kind's
(``deploytk.inputs``); here the samples are only counted, batched and stacked. A decoded file then goes
through the model family's preprocessing (``ModelFamily.input_transform``: the pipeline an artifact records, which
equals timm's eval transform for a timm model; transformers' processor where none is recorded).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from deploytk.inputs import InputKind
from deploytk.inputs.image import IMAGE_SUFFIXES, read_rgb

__all__ = ["IMAGE_SUFFIXES", "folder_batches", "load_samples", "read_rgb", "synthetic_batches"]


def synthetic_batches(count: int, batch_size: int, kind: InputKind, seed: int = 0) -> list[np.ndarray]:
    """``count`` normalised-input-like samples (standard normal) of ``kind`` in batches, reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    batches, left = [], count
    while left > 0:
        b = min(batch_size, left)
        batches.append(kind.synthetic(b, rng))
        left -= b
    return batches


def load_samples(files: list[Path], transform: Callable[[Any], Any], kind: InputKind) -> np.ndarray:
    """``files`` decoded by ``kind`` and preprocessed by ``transform``, stacked to float32 [N, *kind.shape]."""
    return np.stack([np.asarray(transform(kind.read(f))) for f in files]).astype(np.float32)


def folder_batches(folder: Path, count: int, batch_size: int, transform, kind: InputKind, what: str = "images") -> list[np.ndarray]:
    """Up to ``count`` samples from ``folder`` (recursively), decoded by ``kind`` and preprocessed by ``transform`` (the
    model family's own)."""
    files = kind.files(folder, count, what)  # sorted; a missing folder, or one without such files, refused naming `what`
    return [load_samples(files[i : i + batch_size], transform, kind) for i in range(0, len(files), batch_size)]
