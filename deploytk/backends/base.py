"""The Backend interface: how validate, profile and eval run an artifact on a runtime, without naming it.

A backend loads an artifact's merged model for its outputs (``load``; validate and eval), or the
merged model and the same weights unmerged for latency (``load_for_timing``; profile), and says
where it ran (``describe``). Each runtime's own rules (ONNX Runtime's bf16 emulation on CPU,
TF32 off on CUDA, TensorRT's engine checks) live in its backend and nowhere else.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import torch
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

from deploytk.exporter.artifacts import Artifact
from deploytk.inputs import InputKind
from deploytk.machine import host
from deploytk.progress import SILENT, Progress


class LoadedModel(ABC):
    """A model a backend has loaded: run a batch, or time a batch size."""

    #: how it runs the graph when not as is (bf16 on ONNX Runtime CPU); None otherwise
    emulation: str | None = None

    @abstractmethod
    def run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        """Every output of the graph (``logits``, and probes where the graph has them) for a float32 batch."""

    @abstractmethod
    def timer(self, batch_size: int) -> Callable[[], float]:
        """A callable that runs one seeded batch of ``batch_size`` and returns the seconds it took."""

    def settings(self) -> dict:
        """How the runtime was set up to run it (threads, hints, providers), for the reports."""
        return {}

    def quantized_choices(self) -> list[str]:
        """Where an int8 graph quantizes a matching op or its inputs (its choices would be made on int8-rounded values);
        empty when every discrete choice is computed in fp32, as `deploytk quantize` keeps them."""
        return []

    def check_batch(self, size: int, what: str) -> None:  # noqa: B027 (most runtimes take any batch the graph allows)
        """Refuse a batch of ``size`` (``what`` names it) the loaded model cannot run, before the runtime does (a TensorRT
        engine's optimization profile)."""

    def activate(self) -> None:  # noqa: B027 (most runtimes need nothing)
        """Acquire what running needs (a TensorRT context); ``run`` happens between activate and deactivate."""

    def deactivate(self) -> None:  # noqa: B027
        """Release it."""


class Backend(ABC):
    """One runtime. ``name`` is what ``backend`` takes."""

    name: str = ""
    #: what reports call it ("ONNX Runtime", "TensorRT")
    display_name: str = ""
    #: how ``profile`` times it (reported with the latencies)
    timing: str = "host clock around a synchronous run"
    #: True: it runs an ONNX graph it is handed (validate adds probe outputs to it); False: a built engine
    runs_onnx: bool = True
    #: False: it computes the PyTorch reference itself, so validate and eval have nothing to compare
    validates: bool = True

    @abstractmethod
    def device(self) -> str:
        """Where it computes here: "cuda" or "cpu"."""

    def needs_build(self, directory: Path) -> bool:
        """Whether the export at ``directory`` needs a build step (`deploytk build`) before this backend can time it."""
        return False

    def graph(self, artifact: Artifact) -> tuple[onnx.ModelProto, str | None]:
        """The ONNX graph this backend runs for ``artifact`` (and how it emulates it, if it does); ``runs_onnx`` backends only."""
        return onnx.load(str(artifact.onnx_path)), None

    @abstractmethod
    def load(
        self, artifact: Artifact, batch_sizes: list[int], graph: onnx.ModelProto | None = None, progress: Progress = SILENT
    ) -> LoadedModel:
        """The merged model, for outputs; ``graph``: run this (prepared by ``graph``, probes added) instead of the artifact's."""

    @abstractmethod
    def load_for_timing(self, artifact: Artifact, batch_sizes: list[int], progress: Progress = SILENT) -> tuple[LoadedModel, LoadedModel]:
        """(merged, unmerged) with the same weights and precision, for latency."""

    def describe(self) -> dict:
        """The machine, and the GPU only when the backend ran on it (``device``: cuda or cpu)."""
        device = self.device()
        info = {"backend": self.name, "device": device, **host()}
        if device == "cuda" and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
        return info


def host_timer(run: Callable, x, synchronize: Callable[[], None] = lambda: None) -> Callable[[], float]:
    """Seconds of one run on the host clock; ``synchronize`` waits for queued GPU work (before and after)."""

    def timed() -> float:
        synchronize()
        t0 = time.perf_counter()
        run(x)
        synchronize()
        return time.perf_counter() - t0

    return timed


def seeded_batch(batch_size: int, kind: InputKind) -> np.ndarray:
    """The input every timed run of a profile sees (merged and unmerged alike)."""
    return kind.synthetic(batch_size, np.random.default_rng(0))


class ModelRunner(BaseRunner):
    """A loaded model as a Polygraphy runner, so any backend plugs into Polygraphy's Comparator."""

    def __init__(self, model: LoadedModel, kind: InputKind, name: str, on_batch: Callable[[int], None] | None = None):
        """``on_batch(samples)`` after each batch: how the validator counts samples done."""
        super().__init__(name=name, prefix="deploytk-runner")
        self.model = model
        self.kind = kind
        self.on_batch = on_batch

    def get_input_metadata_impl(self):
        return TensorMetadata().add(self.kind.onnx_name, dtype=np.float32, shape=("batch", *self.kind.shape))

    def activate_impl(self):
        self.model.activate()

    def deactivate_impl(self):
        self.model.deactivate()

    def infer_impl(self, feed_dict):
        start = time.perf_counter()
        batch = np.ascontiguousarray(feed_dict[self.kind.onnx_name])
        out = self.model.run(batch)
        self.inference_time = time.perf_counter() - start
        if self.on_batch is not None:
            self.on_batch(len(batch))
        return OrderedDict(out)
