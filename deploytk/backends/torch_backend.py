"""PyTorch: the reference model itself, on the GPU when there is one (the deploytk ops then run as the
Triton kernels), else on the CPU. For latency only: it computes the reference, so it validates nothing.
"""

from __future__ import annotations

import numpy as np
import torch

from deploytk.backends.base import Backend, LoadedModel, host_timer, seeded_batch
from deploytk.errors import DeploytkError
from deploytk.exporter.baseline import dense_model
from deploytk.inputs import InputKind
from deploytk.merging.precision import to_precision
from deploytk.models import build_reference
from deploytk.progress import SILENT, Progress


class TorchModel(LoadedModel):
    def __init__(self, module: torch.nn.Module, kind: InputKind, device: str, output_names: list[str] | None = None):
        self.module = module.eval()
        self.kind = kind
        self.device = device
        #: the names its outputs are compared under (an artifact's, which an older export may name otherwise)
        self.output_names = output_names or getattr(module, "output_names", ["logits"])

    def run(self, batch):
        with torch.inference_mode():
            out = self.module(torch.from_numpy(batch).to(self.device))
        outputs = out if isinstance(out, tuple) else (out,)
        # a head-less model returns a view of its token tensor (the class token's row): Polygraphy needs it contiguous
        return {name: np.ascontiguousarray(t.cpu().numpy()) for name, t in zip(self.output_names, outputs, strict=True)}

    def timer(self, batch_size):
        sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)

        def run(x):
            with torch.inference_mode():
                self.module(x)

        return host_timer(run, torch.from_numpy(seeded_batch(batch_size, self.kind)).to(self.device), sync)


class TorchBackend(Backend):
    name = "torch"
    display_name = "PyTorch (deploytk's Triton kernels on a GPU)"
    runs_onnx = False
    validates = False

    def device(self) -> str:
        return "cuda" if torch.cuda.is_available() else "cpu"

    def load(self, artifact, batch_sizes, graph=None, progress: Progress = SILENT) -> TorchModel:
        raise DeploytkError("backend torch runs the PyTorch reference itself: there is nothing to validate against it.")

    def load_for_timing(self, artifact, batch_sizes, progress: Progress = SILENT) -> tuple[TorchModel, TorchModel]:
        artifact.require_runtime(f"`backend={self.name}` (it times the PyTorch reference, never an int8 graph)", ())
        device, precision = self.device(), artifact.precision
        merged = build_reference(artifact.reference_config)
        dense = dense_model(merged, precision).to(device)
        merged = to_precision(merged, precision).to(device)
        return TorchModel(merged, artifact.input_kind, device), TorchModel(dense, artifact.input_kind, device)
