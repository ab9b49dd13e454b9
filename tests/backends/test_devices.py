"""Where each backend computes, what the report says about it, and ONNX Runtime's providers."""

import onnxruntime
import pytest
import torch

from deploytk.backends import BACKENDS
from deploytk.backends.base import host_timer
from deploytk.backends.ort import ort_providers
from deploytk.errors import DeploytkError


def fake_gpu(monkeypatch, present: bool):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: present)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")


@pytest.mark.parametrize(
    "backend, with_gpu, device",
    [
        ("torch", True, "cuda"),
        ("torch", False, "cpu"),
        ("ort", True, "cpu"),
        ("ort-cuda", True, "cuda"),
        ("trt", True, "cuda"),
    ],
)
def test_the_report_names_the_gpu_only_when_the_backend_ran_on_it(monkeypatch, backend, with_gpu, device):
    fake_gpu(monkeypatch, with_gpu)
    info = BACKENDS[backend].describe()
    assert BACKENDS[backend].device() == device and info["device"] == device and info["backend"] == backend
    assert ("gpu" in info) == (device == "cuda") and info.get("gpu", "NVIDIA H200") == "NVIDIA H200"


def test_host_timer_waits_for_queued_gpu_work_before_and_after():
    events = []
    timed = host_timer(lambda x: events.append("run"), None, lambda: events.append("sync"))
    assert timed() >= 0 and events == ["sync", "run", "sync"]


def test_ort_cuda_runs_fp32_without_tf32(monkeypatch):
    """ORT's CUDA provider defaults to TF32 for fp32 MatMul/Conv: 10-bit mantissas fail fp32 validation."""
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert ort_providers("ort-cuda") == [("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]
    assert ort_providers("ort") == ["CPUExecutionProvider"]


def test_ort_cuda_without_the_cuda_provider_says_what_to_install(monkeypatch):
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(DeploytkError, match="needs onnxruntime-gpu's CUDAExecutionProvider") as err:
        ort_providers("ort-cuda")
    assert "Install onnxruntime-gpu" in err.value.hint
