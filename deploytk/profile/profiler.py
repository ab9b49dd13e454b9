"""`deploytk profile`: merged vs dense latency on this machine, alternating runs after warm-up.

Both models see the same input, and their runs alternate, so drift in machine load hits
both equally; the speedup is the ratio of the medians.
"""

from __future__ import annotations

import copy
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
from deploytk.export.onnx_export import INPUT_NAME, export_model
from deploytk.merging.patch import MergedViT
from deploytk.merging.precision import to_precision
from deploytk.models import build_reference

BASELINE_DIR = ".baseline"  # dense ONNX exported from the same weights, cached per model.onnx sha256


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


def device_info(backend: str) -> dict:
    info = {"backend": backend, "machine": platform.machine(), "cpu_count": os.cpu_count(), "processor": platform.processor()}
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if names:
            info["cpu"] = names[0]
    except OSError:
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def dense_onnx(directory: Path, manifest: dict, dense_model, img) -> Path:
    """The unmerged model exported by torch.onnx from the same weights (cached in the artifact dir)."""
    cache = directory / BASELINE_DIR / f"dense-{manifest['onnx']['sha256'][:16]}.onnx"
    if not cache.is_file():
        cache.parent.mkdir(exist_ok=True)
        tmp = cache.with_suffix(".tmp")
        export_model(dense_model, img, manifest["config"]["export"]["batch_size"], manifest["onnx"]["opset"], tmp)
        tmp.rename(cache)
    return cache


def dense_model(merged: MergedViT, precision: str):
    """The unmerged baseline in the artifact's precision: timm's model itself in fp32; in low
    precision the same weights without reduction or proportional attention, cast by the same rules."""
    if precision == "fp32":
        return merged.vit
    return to_precision(MergedViT(copy.deepcopy(merged.vit), [0] * len(merged.vit.blocks), prop_attn=False), precision)


def _runners(backend: str, directory: Path, manifest: dict, step):
    cfg = config_from_dict(manifest["config"], f"{directory}/manifest.json")
    precision = cfg.export.precision
    if backend == "ort" and precision == "bf16":
        raise DeploytkError(
            f"{directory} is a bf16 graph, and ONNX Runtime's CPU provider has no bf16 kernels: its latency cannot be measured here.",
            hint="Profile it with --backend trt or --backend ort-cuda on a GPU, or export with --precision fp16/fp32 for CPU.",
        )
    merged = build_reference(cfg)
    dense = dense_model(merged, precision)
    merged = to_precision(merged, precision)
    img = tuple(manifest["model"]["img_size"])
    if backend == "torch":
        def torch_fn(model):
            def run(x):
                with torch.inference_mode():
                    model(x)
            return run

        return torch_fn(merged), torch_fn(dense), lambda b: torch.randn(b, 3, *img)
    if backend in ("ort", "ort-cuda"):
        from deploytk.backends.ort import ort_session

        step("exporting the unmerged baseline (cached after the first run)")
        dense_path = dense_onnx(directory, manifest, dense, img)
        sessions = [ort_session(directory / MODEL_FILE, backend, spinning=False), ort_session(dense_path, backend, spinning=False)]

        def ort_fn(session):
            return lambda x: session.run(None, {INPUT_NAME: x})

        return ort_fn(sessions[0]), ort_fn(sessions[1]), lambda b: np.random.default_rng(0).standard_normal((b, 3, *img), dtype=np.float32)
    if backend == "trt":
        from deploytk.backends.trt import require_tensorrt

        require_tensorrt("profile --backend trt")
        raise DeploytkError("profile --backend trt: TensorRT engines are not built by this version yet.")
    raise DeploytkError(f"unknown backend {backend!r} (--backend); allowed: ort, ort-cuda, torch, trt.")


def profile(directory: Path, backend: str, batch_sizes: list[int], warmup: int, iterations: int, step=lambda m: None) -> dict:
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise DeploytkError(f"--batch-sizes {batch_sizes} must be a comma-separated list of ints >= 1.")
    if warmup < 0 or iterations < 1:
        raise DeploytkError("--warmup must be >= 0 and --iterations >= 1.")
    directory = require_artifact_dir(directory)
    manifest = read_manifest(directory)
    run_merged, run_dense, make_input = _runners(backend, directory, manifest, step)
    results = []
    for b in batch_sizes:
        x = make_input(b)
        step(f"batch {b}: warm-up")
        for _ in range(warmup):
            run_merged(x)
            run_dense(x)
        merged_t, dense_t = [], []
        step(f"batch {b}: {iterations} alternating iterations")
        for _ in range(iterations):
            t0 = time.perf_counter()
            run_merged(x)
            t1 = time.perf_counter()
            run_dense(x)
            t2 = time.perf_counter()
            merged_t.append(t1 - t0)
            dense_t.append(t2 - t1)
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
        "warmup": warmup,
        "iterations": iterations,
        "results": results,
    }
