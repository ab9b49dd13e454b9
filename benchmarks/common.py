"""Timing and bookkeeping shared by the GPU benchmarks: CUDA-event medians, device facts, JSON output."""

from __future__ import annotations

import json
import platform
import re
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from deploytk.files import FileOutput, claim_file

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: --dtype choices of the GPU benchmarks
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def add_run_arguments(parser, *, warmup: int, iterations: int, smoke: str) -> None:
    """The options every benchmark script takes: --dtype, --warmup, --iterations, --smoke, --output."""
    parser.add_argument("--dtype", choices=list(DTYPES), default=None, help="fp16 on a GPU; --smoke: fp32 unless given")
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--iterations", type=int, default=iterations)
    parser.add_argument("--smoke", action="store_true", help=smoke)
    parser.add_argument("--output", type=Path, default=None)


def device_facts(device: str) -> dict:
    """What the numbers were measured on (GPU name, compute capability, memory, versions)."""
    import triton

    info = {
        "device": device,
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info |= {
            "gpu": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
        }
    return info


def time_ms(fn, device: str, warmup: int, iterations: int) -> list[float]:
    """Per-call milliseconds: CUDA events around each call on a GPU, perf_counter on a CPU."""
    for _ in range(warmup):
        fn()
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(iterations):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(iterations):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def median(values: list[float]) -> float:
    return float(torch.tensor(values, dtype=torch.float64).median())


def peak_bandwidth_gbs(device: str, mib: int = 1024, iterations: int = 20) -> float:
    """Measured device-to-device copy bandwidth (read + write bytes / time): the bound the kernels are held to."""
    n = mib * 2**20 // 4
    src = torch.empty(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    ms = median(time_ms(lambda: dst.copy_(src), device, 3, iterations))
    return 2 * src.numel() * 4 / (ms / 1e3) / 1e9


def result_output(prefix: str, device: str, output: Path | None) -> FileOutput:
    """The result file, claimed before the benchmark runs (deploytk.files: a file deploytk did not write is refused);
    default benchmarks/results/<prefix>_<gpu or device>.json."""
    env = device_facts(device)
    where = re.sub(r"[^a-z0-9]+", "_", env.get("gpu", env["device"]).lower()).strip("_")
    return claim_file(output or RESULTS / f"{prefix}_{where}.json", f"deploytk benchmarks/{prefix}.py")


def cpu_result_output(prefix: str, script: str, output: Path | None) -> FileOutput:
    """The result file of a CPU benchmark, claimed before it runs: default benchmarks/results/<prefix>_<cpu name>.json."""
    from deploytk.machine import host

    cpu = re.sub(r"[^a-z0-9]+", "_", host()["cpu"].lower()).strip("_")[:40]
    return claim_file(output or RESULTS / f"{prefix}_{cpu}.json", f"deploytk benchmarks/{script}")


def deploytk(*args: str) -> tuple[dict, float]:
    """``deploytk ARGS --json`` as a child process, as a user runs it: (its JSON, seconds). Exit 1 with a report is a
    result (validate's failed check); any other failure stops the benchmark with the command's stderr."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", "from deploytk.cli import main; main()", *args, "--json"], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode not in (0, 1) or not done.stdout.strip():
        raise SystemExit(f"deploytk {' '.join(args)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout), seconds


def exponent(x: float) -> str:
    """3.159e-06 -> 3.2e-6 (0 -> 0): how the results tables write a small difference."""
    if x == 0:
        return "0"
    mantissa, power = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(power)}"


def write_result(out: FileOutput, payload: dict) -> Path:
    """JSON with the command and a timestamp; prints the path."""
    payload = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        **payload,
    }
    out.write_json(payload)
    print(f"wrote {out.path}")
    return out.path
