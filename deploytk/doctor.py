"""`deploytk doctor`: what this environment can run."""

from __future__ import annotations

import platform

from deploytk.backends.trt import INSTALL_HINT, tensorrt_version
from deploytk.export.manifest import package_versions


def environment_report() -> dict:
    import torch

    report = {"python": platform.python_version(), "platform": platform.platform(), "packages": package_versions()}
    try:
        import onnxruntime as ort

        report["onnxruntime_providers"] = ort.get_available_providers()
    except Exception as err:  # pragma: no cover - reported, not raised
        report["onnxruntime_providers"] = f"unavailable: {err}"
    report["torch_cuda_build"] = torch.version.cuda
    report["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    trt = tensorrt_version()
    report["tensorrt"] = trt
    report["tensorrt_hint"] = None if trt else INSTALL_HINT
    try:
        import triton

        report["triton"] = triton.__version__
    except Exception:
        report["triton"] = None
    return report
