"""`deploytk doctor`: what this environment can run."""

from __future__ import annotations

import platform

import onnxruntime as ort
import torch
from deploytk_plugins.aot import ARCHES

from deploytk.export.manifest import package_versions
from deploytk.optional import MIN_TENSORRT, TENSORRT_INSTALL_HINT, tensorrt_version, triton_version, version_tuple


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
    return report
