"""ONNX Runtime, on CPU (``ort``) or CUDA (``ort-cuda``): the deploytk ops run through their local functions.

Its rules: the CUDA provider runs fp32 graphs without TF32; the CPU provider has no bf16
kernels, so a bf16 graph is emulated for outputs (``bf16_emulation``) and refused for latency.
On the CPU, an export with ONNX Runtime's fused copy (``fmt='onnx-ort'``: model.ort.onnx) runs that
copy, for outputs and for latency, against the dense baseline fused the same way.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort

from deploytk.backends.base import Backend, LoadedModel, host_timer, seeded_batch
from deploytk.backends.bf16_emulation import EMULATION_NOTE, emulate_bf16
from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import Artifact
from deploytk.exporter.baseline import baseline_onnx, fused_baseline_onnx
from deploytk.exporter.onnx_io import runnable
from deploytk.exporter.probes import choice_inputs_quantized
from deploytk.inputs import InputKind
from deploytk.progress import SILENT, Progress

#: ONNX Runtime's CUDA provider runs fp32 MatMul/Conv in TF32 by default (10-bit mantissa), far
#: outside fp32's validation tolerances; fp32 graphs are meant to be fp32 (export fp16/bf16 for
#: tensor-core speed), so it is switched off
CUDA_PROVIDER_OPTIONS = {"use_tf32": "0"}


def ort_providers(backend: str = "ort") -> list:
    """Execution providers for a session: CPU, or CUDA (TF32 off) with the CPU fallback."""
    available = ort.get_available_providers()
    if backend == "ort-cuda":
        if "CUDAExecutionProvider" not in available:
            raise DeploytkError(
                "backend ort-cuda needs onnxruntime-gpu's CUDAExecutionProvider, which is not available "
                f"(providers: {', '.join(available)}).",
                hint="Install onnxruntime-gpu on a machine with CUDA, or use `backend=ort`.",
            )
        return [("CUDAExecutionProvider", dict(CUDA_PROVIDER_OPTIONS)), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def ort_session(path: Path | bytes, backend: str = "ort", spinning: bool = True):
    """A session with full graph optimisation, for a model file or serialized model bytes.

    ``spinning=False`` stops idle intra-op threads from busy-waiting: when two sessions run
    alternately (profiling), one session's spinning threads would otherwise steal cores
    from the other.
    """
    options = ort.SessionOptions()
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path if isinstance(path, bytes) else str(path), options, providers=ort_providers(backend))


class OrtModel(LoadedModel):
    def __init__(
        self, session, kind: InputKind, emulation: str | None = None, graph: onnx.ModelProto | None = None, file: str | None = None
    ):
        self.session = session
        self.graph = graph
        self.file = file  # the graph's file name, for the report
        self.kind = kind
        self.emulation = emulation
        self.output_names = [o.name for o in session.get_outputs()]

    def run(self, batch):
        return dict(zip(self.output_names, self.session.run(None, {self.kind.onnx_name: batch}), strict=True))

    def timer(self, batch_size):
        return host_timer(lambda x: self.session.run(None, {self.kind.onnx_name: x}), seeded_batch(batch_size, self.kind))

    def quantized_choices(self) -> list[str]:
        return choice_inputs_quantized(self.graph) if self.graph is not None else []

    def settings(self) -> dict:
        options = self.session.get_session_options()
        return {
            "runtime": f"onnxruntime {ort.__version__}",
            "providers": self.session.get_providers(),
            "intra_op_num_threads": options.intra_op_num_threads or "default (one per physical core)",
            "graph_optimization_level": str(options.graph_optimization_level).rsplit(".", 1)[-1],
            **({"graph": self.file} if self.file else {}),
        }


class OrtBackend(Backend):
    def __init__(self, name: str):
        self.name = name  # "ort" (CPU provider) or "ort-cuda" (CUDA provider, CPU fallback)
        self.display_name = "ONNX Runtime CUDA" if name == "ort-cuda" else "ONNX Runtime"

    def device(self) -> str:
        return "cuda" if self.name == "ort-cuda" else "cpu"

    def graph(self, artifact: Artifact) -> tuple[onnx.ModelProto, str | None]:
        artifact.require_runtime(f"`backend={self.name}`", ("ort", "trt"))  # a trt Q/DQ graph runs here as the check of its numbers
        proto = onnx.load(str(self.graph_path(artifact)))
        if self.device() == "cpu" and artifact.precision == "bf16":  # the CPU provider has no bf16 kernels
            return emulate_bf16(proto), EMULATION_NOTE
        return proto, None

    def graph_path(self, artifact: Artifact) -> Path:
        """What this backend runs: on the CPU, ONNX Runtime's fused copy when the export wrote one; else model.onnx."""
        fused = artifact.ort_path if self.device() == "cpu" else None
        return fused or artifact.onnx_path

    def load(self, artifact, batch_sizes, graph=None, progress: Progress = SILENT) -> OrtModel:
        emulation = None
        if graph is None:
            graph, emulation = self.graph(artifact)
        with runnable(graph) as source:  # bytes, or a temporary file with external data past protobuf's limit
            session = ort_session(source, self.name)
        return OrtModel(session, artifact.input_kind, emulation, graph, self.graph_path(artifact).name)

    def load_for_timing(self, artifact, batch_sizes, progress: Progress = SILENT) -> tuple[OrtModel, OrtModel]:
        artifact.require_runtime(f"`backend={self.name}`", ("ort", "trt"))
        if self.device() == "cpu" and artifact.precision == "bf16":
            raise DeploytkError(
                f"{artifact.directory} is a bf16 graph, and ONNX Runtime's CPU provider has no bf16 kernels: its latency cannot be "
                "measured here.",
                hint="Profile it with `backend=trt` or `backend=ort-cuda` on a GPU, or export with `precision=fp16`/fp32 for CPU.",
            )
        progress.step("exporting the unmerged baseline (cached after the first run)")
        merged_path = self.graph_path(artifact)
        dense_path = fused_baseline_onnx(artifact) if merged_path != artifact.onnx_path else baseline_onnx(artifact)
        sessions = [ort_session(path, self.name, spinning=False) for path in (merged_path, dense_path)]
        merged, dense = (OrtModel(s, artifact.input_kind, file=p.name) for s, p in zip(sessions, (merged_path, dense_path), strict=True))
        return merged, dense
