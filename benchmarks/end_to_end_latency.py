"""Merged vs dense end-to-end PyTorch latency on the GPU, with deploytk's Triton kernels.

For each model (default ViT-B/16 and DeiT-S, random weights: latency does not depend on them)
and batch size (1, 8, 64), in fp16 by default, the median of ``--iterations`` CUDA-event
timed forward passes of

- ``dense``: the timm model as is (PyTorch's fused scaled_dot_product_attention);
- ``tome``: ToMe r=16 with proportional attention: deploytk's ToMeMatch, TokenAggregate and
  ProportionalAttention run as Triton kernels (the CUDA implementation of the torch ops);
- ``tome_sdpa``: the same merge schedule with plain fused attention (no size bias), which
  separates the merge's cost from the attention kernel's.

Speedups are ratios of medians measured in the same run. Writes
benchmarks/results/end_to_end_latency_<gpu>.json.

    python benchmarks/end_to_end_latency.py                        # on a CUDA GPU
    python benchmarks/end_to_end_latency.py --smoke --output /tmp/e.json   # CPU: does it run
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import DTYPES, add_run_arguments, device_facts, median, time_ms, write_result  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="vit_base_patch16_224,deit_small_patch16_224")
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--batch", default="1,8,64", help="Comma-separated batch sizes.")
    add_run_arguments(p, warmup=10, iterations=50, smoke="DeiT-Tiny, batch 1, 1 iteration on the CPU: checks the script, measures nothing.")
    return p.parse_args(argv)


def variants(model_name: str, r: int) -> dict:
    """dense timm model and the two merged references built from the same weights."""
    from deploytk.config import DeployConfig
    from deploytk.models import build_reference, create_vit

    def cfg(prop_attn: bool):
        return DeployConfig.model_validate({"model": model_name, "merge": {"method": "tome", "r": r, "prop_attn": prop_attn}})

    dense = create_vit(cfg(True))
    return {
        "dense": dense,
        "tome": build_reference(cfg(True), copy.deepcopy(dense)),
        "tome_sdpa": build_reference(cfg(False), copy.deepcopy(dense)),
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.smoke:
        device, models, batches = "cpu", ["deit_tiny_patch16_224"], [1]
        args.warmup, args.iterations, args.dtype = 0, 1, "fp32"
    elif not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA GPU (or --smoke to check the script on a CPU).")
    else:
        device, models, batches = "cuda", args.models.split(","), [int(v) for v in args.batch.split(",")]
    dtype = DTYPES[args.dtype]
    rows = []
    for name in models:
        nets = {key: m.to(device, dtype).eval() for key, m in variants(name, args.r).items()}
        schedule = nets["tome"].schedule
        for batch in batches:
            x = torch.randn(batch, 3, 224, 224, device=device, dtype=dtype)
            ms = {}
            with torch.inference_mode():
                for key, net in nets.items():
                    ms[key] = median(time_ms(lambda net=net: net(x), device, args.warmup, args.iterations))
            row = {"model": name, "batch": batch, "dtype": args.dtype, "r": args.r, "tokens_per_layer": schedule.tokens,
                   "median_ms": {k: round(v, 3) for k, v in ms.items()},
                   "speedup_tome": round(ms["dense"] / ms["tome"], 3), "speedup_tome_sdpa": round(ms["dense"] / ms["tome_sdpa"], 3)}
            rows.append(row)
            print(f"{name:26s} b={batch:<3d} dense {ms['dense']:8.3f} ms  tome {ms['tome']:8.3f} ms ({row['speedup_tome']:.2f}x)"
                  f"  tome+sdpa {ms['tome_sdpa']:8.3f} ms ({row['speedup_tome_sdpa']:.2f}x)")
        del nets
    payload = {"environment": device_facts(device), "smoke": args.smoke, "warmup": args.warmup, "iterations": args.iterations, "results": rows}
    write_result("end_to_end_latency", payload, args.output)
    return payload


if __name__ == "__main__":
    main()
