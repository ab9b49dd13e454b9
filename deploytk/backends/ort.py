"""ONNX Runtime sessions for deploytk models (the custom ops run through their local functions)."""

from __future__ import annotations

from pathlib import Path

from deploytk.errors import DeploytkError

#: ONNX Runtime's CUDA provider runs fp32 MatMul/Conv in TF32 by default (10-bit mantissa), far
#: outside fp32's validation tolerances; fp32 graphs are meant to be fp32 (export fp16/bf16 for
#: tensor-core speed), so it is switched off
CUDA_PROVIDER_OPTIONS = {"use_tf32": "0"}


def ort_providers(backend: str = "ort") -> list:
    """Execution providers for a session: CPU, or CUDA (TF32 off) with the CPU fallback."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if backend == "ort-cuda":
        if "CUDAExecutionProvider" not in available:
            raise DeploytkError(
                "backend ort-cuda needs onnxruntime-gpu's CUDAExecutionProvider, which is not available "
                f"(providers: {', '.join(available)}).",
                hint="Install onnxruntime-gpu on a machine with CUDA, or use --backend ort.",
            )
        return [("CUDAExecutionProvider", dict(CUDA_PROVIDER_OPTIONS)), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def ort_session(path: Path | bytes, backend: str = "ort", spinning: bool = True):
    """A session with full graph optimisation, for a model file or serialized model bytes.

    ``spinning=False`` stops idle intra-op threads from busy-waiting: when two sessions run
    alternately (profiling), one session's spinning threads would otherwise steal cores
    from the other.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path if isinstance(path, bytes) else str(path), options, providers=ort_providers(backend))
