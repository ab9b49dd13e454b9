"""`deploytk profile`: merged vs dense latency on this machine, alternating runs after warm-up.

Both models see the same input, and their runs alternate, so drift in machine load hits
both equally; the speedup is the ratio of the medians. ONNX Runtime and PyTorch are timed
on the host clock around a synchronous run; TensorRT with CUDA events on the GPU (see
``backends.trt.EngineTimer``).
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from deploytk.config import config_from_dict
from deploytk.errors import DeploytkError
from deploytk.export.artifacts import MODEL_FILE, require_artifact_dir
from deploytk.export.manifest import read_manifest
from deploytk.export.onnx_export import INPUT_NAME
from deploytk.merging.precision import to_precision
from deploytk.models import build_reference
from deploytk.profile.baseline import baseline_onnx, dense_model


def latency_stats(seconds: list[float], batch_size: int) -> dict:
    ms = np.asarray(seconds) * 1e3
    p50 = float(np.percentile(ms, 50))
    return {
        "latency_ms": {
            "p50": round(p50, 3),
            "p90": round(float(np.percentile(ms, 90)), 3),
            "p99": round(float(np.percentile(ms, 99)), 3),
            "mean": round(float(ms.mean()), 3),
        },
        "throughput": round(batch_size / (p50 / 1e3), 2),
    }


def runs_on(backend: str) -> str:
    """Where a backend computes: TensorRT and ort-cuda on the GPU; torch on the GPU when CUDA is there."""
    if backend in ("trt", "ort-cuda") or (backend == "torch" and torch.cuda.is_available()):
        return "cuda"
    return "cpu"


def device_info(backend: str) -> dict:
    """The machine, and the GPU only when the backend ran on it (``device``: cuda or cpu)."""
    device = runs_on(backend)
    info = {
        "backend": backend,
        "device": device,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "processor": platform.processor(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if names:
            info["cpu"] = names[0]
    except OSError:
        pass
    if device == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _host_timer(run, x, synchronize=lambda: None):
    """Seconds of one run on the host clock; ``synchronize`` waits for queued GPU work (before and after)."""

    def timed() -> float:
        synchronize()
        t0 = time.perf_counter()
        run(x)
        synchronize()
        return time.perf_counter() - t0

    return timed


def _timers(backend: str, directory: Path, manifest: dict, batch_sizes: list[int], step):
    """(merged, dense): each maps a batch size to a callable that runs once and returns seconds."""
    cfg = config_from_dict(manifest["config"], f"{directory}/manifest.json")
    precision = cfg.export.precision
    img = tuple(manifest["model"]["img_size"])
    if backend == "trt":
        return _trt_timers(directory, batch_sizes, img, step)
    if backend == "ort" and precision == "bf16":
        raise DeploytkError(
            f"{directory} is a bf16 graph, and ONNX Runtime's CPU provider has no bf16 kernels: its latency cannot be measured here.",
            hint="Profile it with --backend trt or --backend ort-cuda on a GPU, or export with --precision fp16/fp32 for CPU.",
        )
    if backend not in ("torch", "ort", "ort-cuda"):
        raise DeploytkError(f"unknown backend {backend!r} (--backend); allowed: ort, ort-cuda, torch, trt.")
    merged = build_reference(cfg)
    if backend == "torch":  # on the GPU when there is one: the deploytk ops then run as the Triton kernels
        device = runs_on(backend)
        dense = dense_model(merged, precision).to(device)
        merged = to_precision(merged, precision).to(device)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

        def torch_timer(model):
            def run(x):
                with torch.inference_mode():
                    model(x)

            return lambda b: _host_timer(run, torch.randn(b, 3, *img, generator=torch.Generator().manual_seed(0)).to(device), sync)

        return torch_timer(merged), torch_timer(dense)
    from deploytk.backends.ort import ort_session

    step("exporting the unmerged baseline (cached after the first run)")
    dense_path = baseline_onnx(directory, manifest, merged)
    sessions = [ort_session(directory / MODEL_FILE, backend, spinning=False), ort_session(dense_path, backend, spinning=False)]

    def ort_timer(session):
        def run(x):
            session.run(None, {INPUT_NAME: x})

        return lambda b: _host_timer(run, np.random.default_rng(0).standard_normal((b, 3, *img), dtype=np.float32))

    return ort_timer(sessions[0]), ort_timer(sessions[1])


def _trt_timers(directory: Path, batch_sizes: list[int], img, step):
    """CUDA-event timers of the merged engine and the baseline engine built with it."""
    from deploytk.backends.trt import EngineTimer, check_batch_sizes, checked_engine_manifest, read_engine

    what = "profile --backend trt"
    check_batch_sizes(checked_engine_manifest(directory, what), batch_sizes, what)
    step("loading the TensorRT engines")
    engines = [EngineTimer(read_engine(directory, what, baseline), INPUT_NAME) for baseline in (False, True)]

    def trt_timer(engine):
        def for_batch(b):
            engine.prepare(b, (3, *img))
            return engine.time_once

        return for_batch

    return trt_timer(engines[0]), trt_timer(engines[1])


def profile(directory: Path, backend: str, batch_sizes: list[int], warmup: int, iterations: int, step=lambda m: None) -> dict:
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise DeploytkError(f"--batch-sizes {batch_sizes} must be a comma-separated list of ints >= 1.")
    if warmup < 0 or iterations < 1:
        raise DeploytkError("--warmup must be >= 0 and --iterations >= 1.")
    directory = require_artifact_dir(directory)
    manifest = read_manifest(directory)
    merged_timer, dense_timer = _timers(backend, directory, manifest, batch_sizes, step)
    results = []
    for b in batch_sizes:
        run_merged, run_dense = merged_timer(b), dense_timer(b)
        step(f"batch {b}: warm-up")
        for _ in range(warmup):
            run_merged()
            run_dense()
        merged_t, dense_t = [], []
        step(f"batch {b}: {iterations} alternating iterations")
        for _ in range(iterations):
            merged_t.append(run_merged())
            dense_t.append(run_dense())
        merged_s, dense_s = latency_stats(merged_t, b), latency_stats(dense_t, b)
        results.append(
            {
                "batch_size": b,
                **merged_s,
                "speedup_vs_dense": round(dense_s["latency_ms"]["p50"] / merged_s["latency_ms"]["p50"], 3),
                "dense": dense_s,
            }
        )
    return {
        "artifact": str(directory),
        "model": manifest["model"]["name"],
        "method": manifest["config"]["merge"]["method"],
        "r": manifest["config"]["merge"]["r"],
        "precision": manifest["config"].get("export", {}).get("precision", "fp32"),
        "gflops": manifest["gflops"],
        "dense_gflops": manifest["dense_gflops"],
        "device": device_info(backend),
        "timing": "CUDA events around execute_async_v3 (CUDA graph when capturable)"
        if backend == "trt"
        else "host clock around a synchronous run",
        "warmup": warmup,
        "iterations": iterations,
        "results": results,
    }
