"""`deploytk doctor`: what this environment can run."""

from __future__ import annotations

import platform

import onnxruntime as ort
import torch

from deploytk.export.manifest import package_versions
from deploytk.optional import TENSORRT_INSTALL_HINT, tensorrt_version, triton_version


def environment_report() -> dict:
    report = {"python": platform.python_version(), "platform": platform.platform(), "packages": package_versions()}
    report["onnxruntime_providers"] = ort.get_available_providers()
    report["torch_cuda_build"] = torch.version.cuda
    report["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    trt = tensorrt_version()
    report["tensorrt"] = trt
    report["tensorrt_hint"] = None if trt else TENSORRT_INSTALL_HINT
    report["triton"] = triton_version()
    return report
