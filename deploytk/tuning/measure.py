"""`tune`'s measurement of one candidate: its export (cached by config hash, built when the backend needs it), one
`deploytk profile` run at the batch size (merged and dense alternating), and with ``data`` its top-1."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from deploytk.backends import Backend
from deploytk.build.builder import build_engine
from deploytk.build.options import build_options
from deploytk.config import DeployConfig, config_from_dict
from deploytk.errors import DeploytkError
from deploytk.evaluation.accuracy import ImageFolder, exported_accuracy
from deploytk.exporter.artifacts import Artifact
from deploytk.exporter.baseline import share_baseline
from deploytk.exporter.pipeline import run_export
from deploytk.profile.profiler import profile
from deploytk.progress import SILENT, Progress
from deploytk.tuning.candidates import Candidate


def config_hash(data: dict) -> str:
    """Cache key of an export: the whole config, and the checkpoint file's identity (path, size, mtime)."""
    key = dict(data)
    if data.get("checkpoint"):
        st = os.stat(data["checkpoint"])
        key["checkpoint"] = [str(Path(data["checkpoint"]).resolve()), st.st_size, st.st_mtime_ns]
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def export_cached(cfg: DeployConfig, directory: Path, backend: Backend, batch: int, progress: Progress) -> None:
    """Export (and for TensorRT build) unless the cache holds this config's export."""
    try:
        Artifact.open(directory)
    except DeploytkError:
        if directory.exists():
            raise DeploytkError(
                f"tune cache {directory} holds an unreadable export (interrupted?).", hint=f"Remove it: rm -r {directory}"
            ) from None
        run_export(cfg, directory, progress)
    if backend.needs_build(directory):
        build_engine(directory, build_options(f"1,{batch},{batch}"), progress)


@dataclass
class Measure:
    """``measure(i)`` for the search: one more profile run of candidate i (exported on first use), its top-1 once."""

    candidates: list[Candidate]
    cache: Path
    backend: Backend
    batch: int
    warmup: int
    iterations: int
    percentile: str
    folder: ImageFolder | None = None
    progress: Progress = SILENT
    #: the backend's description, from the first profile run
    device: dict | None = None
    _dense_dir: list[Path] = field(default_factory=list)

    def __call__(self, i: int) -> None:
        c, progress = self.candidates[i], self.progress
        directory = self.cache / config_hash(c.data)
        progress.step(f"candidate {c.label}: export")
        export_cached(config_from_dict(c.data, f"(candidate {c.label})"), directory, self.backend, self.batch, progress)
        if self._dense_dir:  # every candidate shares the first one's dense baseline: the same weights and settings
            share_baseline(Artifact.open(self._dense_dir[0], verify=False), Artifact.open(directory, verify=False))
        progress.step(f"candidate {c.label}: profile at batch {self.batch} ({self.backend.name})")
        result = profile(directory, self.backend, [self.batch], self.warmup, self.iterations, progress)
        row = result["results"][0]
        c.latencies.append(row["latency_ms"][self.percentile])
        c.dense_latencies.append(row["dense"]["latency_ms"][self.percentile])
        c.gflops, c.dense_gflops, c.artifact = result["gflops"], result["dense_gflops"], str(directory)
        self.device = result["device"]
        self._dense_dir[:] = self._dense_dir or [directory]
        if self.folder is not None and c.accuracy is None:
            c.accuracy = exported_accuracy(directory, self.folder, batch_size=64, backend=self.backend, progress=progress)
