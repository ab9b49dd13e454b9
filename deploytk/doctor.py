"""`deploytk doctor`: what this environment can run."""

from __future__ import annotations

import platform

import onnxruntime as ort
import torch
from deploytk_plugins.aot import ARCHES

from deploytk.export.manifest import package_versions
from deploytk.optional import (
    MIN_TENSORRT,
    OPENVINO_INSTALL_HINT,
    TENSORRT_INSTALL_HINT,
    openvino_version,
    tensorrt_version,
    triton_version,
    version_tuple,
)


def environment_report() -> dict:
    report = {"python": platform.python_version(), "platform": platform.platform(), "packages": package_versions()}
    report["onnxruntime_providers"] = ort.get_available_providers()
    report["torch_cuda_build"] = torch.version.cuda
    report["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    report["compute_capability"] = None
    report["plugin_kernels_for_this_gpu"] = None
    if report["gpu"]:
        major, minor = torch.cuda.get_device_capability(0)
        report["compute_capability"] = f"{major}.{minor}"
        report["plugin_kernels_for_this_gpu"] = f"sm_{major}{minor}" in ARCHES
    trt = tensorrt_version()
    report["tensorrt"] = trt
    report["tensorrt_hint"] = None if trt else TENSORRT_INSTALL_HINT
    parsed = version_tuple(trt) if trt else None
    if parsed is not None and parsed < MIN_TENSORRT:
        report["tensorrt_hint"] = f"deploytk's plugins need TensorRT >= {'.'.join(map(str, MIN_TENSORRT))} (ahead-of-time plugins)."
    report["triton"] = triton_version()
    report.update(openvino_report())
    return report


def openvino_report() -> dict:
    """OpenVINO's version and what its CPU plugin can compute in (bf16/fp16 arithmetic decides how low-precision graphs run)."""
    version = openvino_version()
    if version is None:
        return {"openvino": None, "openvino_hint": OPENVINO_INSTALL_HINT, "openvino_cpu_capabilities": None}
    import openvino  # optional: present, checked above

    capabilities = list(openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    return {"openvino": version, "openvino_hint": None, "openvino_cpu_capabilities": capabilities}
