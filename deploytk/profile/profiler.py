"""`deploytk profile`: merged vs dense latency on this machine, alternating runs after warm-up.

Both models see the same input, and their runs alternate, so drift in machine load hits
both equally; the speedup is the ratio of the medians. How a backend times (host clock
around a synchronous run, or CUDA events on the GPU) is its own and is reported.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from deploytk.backends import BACKENDS, Backend, get_backend
from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import Artifact
from deploytk.progress import SILENT, Progress

#: the fewest timed runs that back a tail percentile: with fewer, "p99" is only the largest run (20 runs: the
#: 99th percentile interpolates between the two slowest), so the report leaves it out and shows ``max``
MIN_SAMPLES = {"p50": 1, "p90": 10, "p99": 100}


def latency_stats(seconds: list[float], batch_size: int) -> dict:
    """p50, mean, max and the number of runs; p90 / p99 only where MIN_SAMPLES runs back them."""
    ms = np.asarray(seconds) * 1e3
    p50 = float(np.percentile(ms, 50))
    latency = {"p50": round(p50, 3), "mean": round(float(ms.mean()), 3), "max": round(float(ms.max()), 3), "samples": len(ms)}
    for name in ("p90", "p99"):
        if len(ms) >= MIN_SAMPLES[name]:
            latency[name] = round(float(np.percentile(ms, int(name[1:]))), 3)
    return {"latency_ms": latency, "throughput": round(batch_size / (p50 / 1e3), 2)}


def parse_batch_sizes(spec: str) -> list[int]:
    """``batch_sizes`` as text, '1,8,32' -> [1, 8, 32]."""
    try:
        return [int(v) for v in spec.split(",") if v.strip()]
    except ValueError:
        raise DeploytkError(f"`batch_sizes={spec!r}` must be comma-separated ints, e.g. 1,8,32.") from None


def slower_than_dense(results: list[dict], backend: Backend, r) -> list[dict]:
    """One warning per batch size where the reduced model is slower than dense (speedup < 1), with what to try.

    A profile that only prints 0.85x leaves the user to guess whether the export is broken: on a small model at a small
    batch the merge ops' fixed cost can exceed what the removed tokens save, and what helps is known.
    """
    others = [n for n, b in BACKENDS.items() if b.validates and n != backend.name and b.device() == backend.device()]
    warnings = []
    for row in results:
        b, speedup = row["batch_size"], row["speedup_vs_dense"]
        if speedup >= 1:
            continue
        schedule = f"a lower r than {r}" if r is not None else "a milder schedule (a higher keep rate)"
        suggestions = [
            f"a larger batch than {b} (`batch_sizes=`): the merge ops' fixed cost per run is shared by more images, and the "
            "tokens they remove save more",
            f"{schedule}: on a small model the merge ops can cost more than the tokens they remove (deploytk tune finds the "
            "least aggressive schedule that meets a latency budget)",
        ]
        if others:
            suggestions.append("the other runtime: " + " or ".join(f"`backend={n}`" for n in others))
        warnings.append(
            {
                "batch_size": b,
                "speedup_vs_dense": speedup,
                "message": f"at batch {b} the reduced model is slower than dense ({speedup:.2f}x on {backend.name})",
                "suggestions": suggestions,
            }
        )
    return warnings


def profile(
    directory: Path, backend: str | Backend, batch_sizes: list[int], warmup: int, iterations: int, progress: Progress = SILENT
) -> dict:
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise DeploytkError(f"`batch_sizes={batch_sizes}` must be a comma-separated list of ints >= 1.")
    if warmup < 0 or iterations < 1:
        raise DeploytkError("`warmup=` must be >= 0 and `iterations=` >= 1.")
    backend = get_backend(backend) if isinstance(backend, str) else backend
    artifact = Artifact.open(directory)
    merged, dense = backend.load_for_timing(artifact, batch_sizes, progress)
    results = []
    for b in batch_sizes:
        run_merged, run_dense = merged.timer(b), dense.timer(b)
        progress.start(warmup, f"batch {b}: {warmup} warm-up runs of each model")
        for _ in range(warmup):
            run_merged()
            run_dense()
            progress.advance()
        merged_t, dense_t = [], []
        progress.start(iterations, f"batch {b}: {iterations} timed runs of each model, alternating")
        for _ in range(iterations):
            merged_t.append(run_merged())
            dense_t.append(run_dense())
            progress.advance()
        merged_s, dense_s = latency_stats(merged_t, b), latency_stats(dense_t, b)
        speedup = round(dense_s["latency_ms"]["p50"] / merged_s["latency_ms"]["p50"], 3)
        results.append({"batch_size": b, **merged_s, "speedup_vs_dense": speedup, "dense": dense_s})
    manifest = artifact.manifest
    return {
        "artifact": str(artifact.directory),
        "model": manifest["model"]["name"],
        "method": manifest["config"]["merge"]["method"],
        "r": manifest["config"]["merge"].get("r"),  # None for the keep-rate methods (their manifests have no merge.r)
        "method_options": manifest["method"]["options"],
        "precision": artifact.numerics,
        "gflops": manifest["gflops"],
        "dense_gflops": manifest["dense_gflops"],
        "device": backend.describe(),
        "timing": backend.timing,
        "runtime_settings": merged.settings(),
        "dense_runtime_settings": dense.settings(),  # what the baseline ran as (e.g. the fused dense copy on ONNX Runtime)
        "warmup": warmup,
        "iterations": iterations,
        "results": results,
        "warnings": slower_than_dense(results, backend, manifest["config"]["merge"].get("r")),
    }
