"""engine.json: what an engine was built from and for; engines that do not match are refused.

A TensorRT engine is only valid for the TensorRT version and the GPU (compute capability) it
was built with, and it encodes one ONNX file: loading it elsewhere fails deep inside
TensorRT or, worse, runs a stale model. The manifest lets deploytk refuse with a reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import ENGINE_FILE, ENGINE_MANIFEST_FILE


def engine_manifest(
    *,
    onnx_sha256: str,
    tensorrt: str,
    gpu: str,
    compute_capability: str,
    options: dict,
    plugin_ops: list[str],
    build_seconds: float,
    created: str,
    baseline: dict | None = None,
) -> dict:
    """``baseline``: {"file", "onnx_sha256", "build_seconds"} of the baseline engine, None if not built."""
    return {
        "format": "deploytk-engine/1",
        "created": created,
        "onnx_sha256": onnx_sha256,
        "tensorrt": tensorrt,
        "gpu": gpu,
        "compute_capability": compute_capability,
        "build": options,
        "plugin_ops": plugin_ops,
        "build_seconds": round(build_seconds, 1),
        "baseline": baseline,
    }


def read_engine_manifest(directory: Path) -> dict:
    path = Path(directory) / ENGINE_MANIFEST_FILE
    if not path.exists() or not (Path(directory) / ENGINE_FILE).exists():
        raise DeploytkError(
            f"{directory} has no TensorRT engine ({ENGINE_FILE} + {ENGINE_MANIFEST_FILE}).",
            hint=f"Build one with `deploytk build {directory}`.",
        )
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DeploytkError(f"{path} is not valid JSON ({err}).", hint=f"Rebuild with `deploytk build {directory}`.") from None


def onnx_mismatch(manifest: dict, onnx_sha256: str) -> str | None:
    """Why the engine is not this model.onnx's (None when it is): what any use of an engine checks first."""
    if manifest.get("onnx_sha256") == onnx_sha256:
        return None
    built_from = str(manifest.get("onnx_sha256"))[:12]
    return f"it was built from a different model.onnx (sha256 {built_from}..., the artifact's is {onnx_sha256[:12]}...)"


def check_engine(manifest: dict, *, onnx_sha256: str, tensorrt: str, compute_capability: str, gpu: str) -> None:
    """Refuse an engine built from another ONNX file, with another TensorRT, or for another GPU; list every reason."""
    reasons = [r for r in (onnx_mismatch(manifest, onnx_sha256),) if r]
    if manifest.get("tensorrt") != tensorrt:
        reasons.append(
            f"it was built with TensorRT {manifest.get('tensorrt')}, this is TensorRT {tensorrt} "
            "(engines are not portable across TensorRT versions)"
        )
    if manifest.get("compute_capability") != compute_capability:
        reasons.append(
            f"it was built for {manifest.get('gpu')} (compute capability {manifest.get('compute_capability')}), "
            f"this GPU is {gpu} ({compute_capability}); engines are specific to the GPU architecture"
        )
    if reasons:
        raise DeploytkError(
            "the TensorRT engine does not match: " + "; ".join(reasons) + ".",
            hint='Rebuild it here with `deploytk build DIR` (same options: see engine.json\'s "build").',
        )


def gpu_identity() -> tuple[str, str]:
    """(GPU name, compute capability 'major.minor') of device 0: what an engine is specific to."""
    if not torch.cuda.is_available():
        raise DeploytkError("building a TensorRT engine needs an NVIDIA GPU, and CUDA reports none here.")
    major, minor = torch.cuda.get_device_capability(0)
    return torch.cuda.get_device_name(0), f"{major}.{minor}"
