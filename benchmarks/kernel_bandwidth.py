"""Each Triton kernel's time against its memory-bandwidth bound (bytes moved / measured peak bandwidth).

ViT-B/16 shapes at batch 64 by default (197 tokens, 768 channels, 12 heads of 64, ToMe r=16):
TokenAggregate (the merge), ProportionalAttention and every matching op (ToMeMatch, MctfMatch,
SizeSplitMatch, TopKSelect, CrucialMatch), in fp16 by default. The bound counts the bytes each
kernel must move at least (inputs read once, output written once); peak bandwidth is a
measured device-to-device copy. Attention is also given in TFLOP/s next to PyTorch's fused
SDPA on the same shape (no size bias), the merge next to PyTorch's scatter_add reference, and
each matching op next to its eager PyTorch reference (``merging``). The matching ops do
O(N^2 D) work on little data, so they sit far above the bandwidth bound by nature; their
column to read is the reference time. Writes benchmarks/results/kernel_bandwidth_<gpu>.json.

    python benchmarks/kernel_bandwidth.py                       # on a CUDA GPU
    TRITON_INTERPRET=1 python benchmarks/kernel_bandwidth.py --smoke --output /tmp/k.json   # CPU: does it run
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import DTYPES, add_run_arguments, device_facts, median, peak_bandwidth_gbs, result_output, time_ms, write_result  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--tokens", type=int, default=197)
    p.add_argument("--channels", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--r", type=int, default=16)
    add_run_arguments(
        p, warmup=20, iterations=200, smoke="Tiny shapes, 1 iteration, CPU under TRITON_INTERPRET=1: checks the script, measures nothing."
    )
    return p.parse_args(argv)


def main(argv=None) -> dict:
    from deploytk.ops import OPS, kernel_common

    # each op's torch launcher (launch.tome_match) and eager reference (ref.tome_match)
    launch = SimpleNamespace(**{spec.torch_name: spec.kernel_module().launch for spec in OPS.values()})
    ref = SimpleNamespace(**{spec.torch_name: spec.reference for spec in OPS.values()})
    args = parse_args(argv)
    if args.smoke:
        if not kernel_common.interpreting():
            raise SystemExit("--smoke runs the kernels in Triton's interpreter: set TRITON_INTERPRET=1.")
        device, args.batch, args.tokens, args.channels, args.heads, args.r = "cpu", 2, 33, 64, 2, 4
        args.warmup, args.iterations, args.dtype = 0, 1, args.dtype or "fp32"
    elif not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA GPU (or --smoke with TRITON_INTERPRET=1 to check the script on a CPU).")
    else:
        device, args.dtype = "cuda", args.dtype or "fp16"
    out = result_output("kernel_bandwidth", device, args.output)
    dtype = DTYPES[args.dtype]
    b, n, c, h, r = args.batch, args.tokens, args.channels, args.heads, args.r
    d, t = c // h, n - r
    elem = torch.finfo(dtype).bits // 8
    gen = torch.Generator().manual_seed(0)
    bw = peak_bandwidth_gbs(device, mib=8 if args.smoke else 1024)

    def measure(fn):
        return median(time_ms(fn, device, args.warmup, args.iterations))

    x = torch.randn(b, n, c, generator=gen).to(device, dtype)
    size = torch.randint(1, 4, (b, n, 1), generator=gen).float().to(device)
    metric = torch.randn(b, n, d, generator=gen).to(device, dtype)
    dest = ref.tome_match(metric.float().cpu(), r, 1, True).to(device)
    q, k, v = (torch.randn(b, h, n, d, generator=gen).to(device, dtype) for _ in range(3))

    cases = []

    def record(op, shape, ms, nbytes, **extra):
        bound_ms = nbytes / (bw * 1e9) * 1e3
        cases.append(
            {
                "op": op,
                "dtype": args.dtype,
                "shape": shape,
                "ms": round(ms, 4),
                "bytes": nbytes,
                "bandwidth_bound_ms": float(f"{bound_ms:.6g}"),
                "x_bound": round(ms / bound_ms, 2),
                **extra,
            }
        )

    ms = measure(lambda: launch.token_aggregate(x, size, dest, t, True))
    ref_ms = measure(lambda: ref.token_aggregate(x, size, dest, t, True))
    record(
        "TokenAggregate",
        {"B": b, "N": n, "C": c, "T": t},
        ms,
        b * n * c * elem + b * n * (4 + 8) + b * t * c * elem,
        pytorch_scatter_add_ms=round(ref_ms, 4),
    )
    scores = torch.rand(b, n, generator=gen).to(device, dtype)
    received = (torch.rand(b, n, generator=gen) * 0.02 + 1e-3).to(device, dtype)
    size_low = size.to(dtype)
    keep = (n - 1) * 7 // 10  # EViT keep rate 0.7
    merge, select = {"B": b, "N": n, "D": d, "r": r}, {"B": b, "N": n, "D": d, "keep": keep}
    matching = [  # (op, shape, kernel, eager reference, bytes of the float inputs)
        (
            "ToMeMatch",
            merge,
            lambda: launch.tome_match(metric, r, 1, True),
            lambda: ref.tome_match(metric.float(), r, 1, True),
            b * n * d * elem,
        ),
        (
            "MctfMatch",
            merge,
            lambda: launch.mctf_match(metric, received, size_low, r, 1, 1.0, 20.0, 40.0, True),
            lambda: ref.mctf_match(metric.float(), received.float(), size, r, 1, 1.0, 20.0, 40.0, True),
            b * n * (d + 2) * elem,
        ),
        (
            "SizeSplitMatch",
            merge,
            lambda: launch.size_split_match(metric, size_low, r, 1),
            lambda: ref.size_split_match(metric.float(), size, r, 1),
            b * n * (d + 1) * elem,
        ),
        ("TopKSelect", select, lambda: launch.topk_select(scores, keep, 1), lambda: ref.topk_select(scores.float(), keep, 1), b * n * elem),
        (
            "CrucialMatch",
            select,
            lambda: launch.crucial_match(metric, scores, keep, 1),
            lambda: ref.crucial_match(metric.float(), scores.float(), keep, 1),
            b * n * (d + 1) * elem,
        ),
    ]
    for op, shape, kernel, reference, input_bytes in matching:
        record(op, shape, measure(kernel), input_bytes + b * n * 8, pytorch_reference_ms=round(measure(reference), 4))
    scale = d**-0.5
    ms = measure(lambda: launch.proportional_attention(q, k, v, size, scale))
    sdpa_ms = measure(lambda: F.scaled_dot_product_attention(q, k, v))
    flops = 4 * b * h * n * n * d
    record(
        "ProportionalAttention",
        {"B": b, "H": h, "N": n, "D": d},
        ms,
        4 * b * h * n * d * elem + b * n * 4,
        tflops=round(flops / (ms / 1e3) / 1e12, 2),
        pytorch_sdpa_ms=round(sdpa_ms, 4),
    )

    print(f"peak copy bandwidth {bw:.0f} GB/s ({device_facts(device).get('gpu', device)})")
    print(f"{'op':24s} {'shape':42s} {'ms':>9s} {'bound ms':>9s} {'x bound':>8s}  other")
    for case in cases:
        shape = " ".join(f"{key}={val}" for key, val in case["shape"].items())
        other = ", ".join(f"{key} {val}" for key, val in case.items() if key.startswith(("pytorch", "tflops")))
        print(f"{case['op']:24s} {shape:42s} {case['ms']:9.4f} {case['bandwidth_bound_ms']:9.4f} {case['x_bound']:8.2f}  {other}")
    merge = next(c for c in cases if c["op"] == "TokenAggregate")
    payload = {
        "environment": device_facts(device),
        "smoke": args.smoke,
        "peak_bandwidth_gbs": round(bw, 1),
        "warmup": args.warmup,
        "iterations": args.iterations,
        "cases": cases,
        "merge_within_2x_of_bound": merge["x_bound"] <= 2.0,
    }
    write_result(out, payload)
    return payload


if __name__ == "__main__":
    main()
