"""Merged vs dense end-to-end PyTorch latency on the GPU, with deploytk's Triton kernels.

For each model (default ViT-B/16 and DeiT-S, random weights: latency does not depend on them)
and batch size (1, 8, 64), in fp16 by default, the median of ``--iterations`` CUDA-event
timed forward passes of

- ``dense``: the timm model as is (PyTorch's fused scaled_dot_product_attention);
- ``tome``: ToMe r=16 with proportional attention: deploytk's ToMeMatch, TokenAggregate and
  ProportionalAttention run as Triton kernels (the CUDA implementation of the torch ops);
- ``tome_sdpa``: the same merge schedule with PyTorch's fused attention (no size bias, in
  every dtype), which separates the merge's cost from the attention kernel's;
- with ``--configs``: each export config's merge section (MCTF, ATM, EViT, ...) on the same
  weights, named by the config's method part (``deit_small_mctf_r16.yaml`` -> ``mctf_r16``);
  its matching op runs as its Triton kernel too.

Every model runs wholly in the chosen dtype (``.to(dtype)``, as the dense timm model;
PyTorch's LayerNorm keeps fp32 statistics inside), so the ratios compare merging alone.
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

from benchmarks.common import DTYPES, add_run_arguments, device_facts, median, result_output, time_ms, write_result  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="vit_base_patch16_224,deit_small_patch16_224")
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--batch", default="1,8,64", help="Comma-separated batch sizes.")
    p.add_argument("--configs", default="", help="Comma-separated export configs whose merge section is also timed on each model.")
    add_run_arguments(p, warmup=10, iterations=50, smoke="DeiT-Tiny, batch 1, 1 iteration on the CPU: checks the script, measures nothing.")
    return p.parse_args(argv)


def variants(model_name: str, r: int, configs: list[Path] = ()) -> dict:
    """dense timm model and the merged references built from the same weights."""
    from deploytk.config import DeployConfig, load_config
    from deploytk.models import build_reference, create_vit

    def cfg(merge: dict):
        return DeployConfig.model_validate({"model": model_name, "merge": merge})

    dense = create_vit(cfg({"method": "tome", "r": r}))
    nets = {
        "dense": dense,
        "tome": build_reference(cfg({"method": "tome", "r": r, "prop_attn": True}), copy.deepcopy(dense)),
        "tome_sdpa": build_reference(cfg({"method": "tome", "r": r, "prop_attn": False}), copy.deepcopy(dense)),
    }
    nets["tome_sdpa"].fused_low_precision_attention = True
    for path in configs:
        merge = load_config(path).merge.model_dump()
        nets[path.stem.split("_", 2)[-1]] = build_reference(cfg(merge), copy.deepcopy(dense))
    return nets


def on_device(model, device: str, dtype: torch.dtype):
    """The model wholly in ``dtype`` on ``device``; a MergedViT also casts its input to ``dtype``."""
    model = model.to(device, dtype).eval()
    if hasattr(model, "compute_dtype"):
        model.compute_dtype = dtype
    return model


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.smoke:
        device, models, batches = "cpu", ["deit_tiny_patch16_224"], [1]
        args.warmup, args.iterations, args.dtype = 0, 1, args.dtype or "fp32"
    elif not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA GPU (or --smoke to check the script on a CPU).")
    else:
        device, models, batches = "cuda", args.models.split(","), [int(v) for v in args.batch.split(",")]
        args.dtype = args.dtype or "fp16"
    out = result_output("end_to_end_latency", device, args.output)
    dtype = DTYPES[args.dtype]
    rows = []
    configs = [Path(c) for c in args.configs.split(",") if c]
    for name in models:
        nets = {key: on_device(m, device, dtype) for key, m in variants(name, args.r, configs).items()}
        schedule = nets["tome"].schedule
        for batch in batches:
            x = torch.randn(batch, 3, 224, 224, device=device, dtype=dtype)
            ms = {}
            with torch.inference_mode():
                for key, net in nets.items():
                    ms[key] = median(time_ms(lambda net=net, x=x: net(x), device, args.warmup, args.iterations))
            row = {
                "model": name,
                "batch": batch,
                "dtype": args.dtype,
                "r": args.r,
                "tokens_per_layer": schedule.tokens,
                "median_ms": {k: round(v, 3) for k, v in ms.items()},
                **{f"speedup_{k}": round(ms["dense"] / v, 3) for k, v in ms.items() if k != "dense"},
            }
            rows.append(row)
            merged = "  ".join(f"{k} {v:8.3f} ms ({ms['dense'] / v:.2f}x)" for k, v in ms.items() if k != "dense")
            print(f"{name:26s} b={batch:<3d} dense {ms['dense']:8.3f} ms  {merged}")
        del nets
    payload = {
        "environment": device_facts(device),
        "smoke": args.smoke,
        "warmup": args.warmup,
        "iterations": args.iterations,
        "results": rows,
    }
    write_result(out, payload)
    return payload


if __name__ == "__main__":
    main()
