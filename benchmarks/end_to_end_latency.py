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
  its matching op runs as its Triton kernel too;
- with ``--eager-reference``: ``tome_eager``, the ``tome`` model with every deploytk op as its
  eager PyTorch reference on the same device instead of its Triton kernel (the kernels' gain).

With ``--cuda-graphs`` each variant is also captured as a CUDA graph and replayed (no Python
between kernels: the first H200 run, 2026-11-28, found every merged variant slower than dense
in eager mode, host-bound at every batch), and ``host_syncs_per_forward`` counts the times one
eager forward pass waits for the GPU (PyTorch's sync debug mode).

Every model runs wholly in the chosen dtype (``.to(dtype)``, as the dense timm model;
PyTorch's LayerNorm keeps fp32 statistics inside), so the ratios compare merging alone.
Speedups are ratios of medians measured in the same run. ``kernel_launches`` counts each variant's
Triton kernel launches in one forward pass (what ran as a kernel). A variant that fails is
recorded under ``failed`` and the script exits 1 once the others are written. Writes
benchmarks/results/end_to_end_latency_<gpu>.json.

    python benchmarks/end_to_end_latency.py                        # on a CUDA GPU
    python benchmarks/end_to_end_latency.py --smoke --output /tmp/e.json   # CPU: does it run (eager ops)
    TRITON_INTERPRET=1 python benchmarks/end_to_end_latency.py --smoke --eager-reference --output /tmp/e.json
                                     # CPU: the ops' Triton kernels in Triton's interpreter, as the CPU implementation
"""

from __future__ import annotations

import argparse
import copy
import sys
import warnings
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import DTYPES, add_run_arguments, device_facts, median, result_output, time_ms, write_result  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="vit_base_patch16_224,deit_small_patch16_224")
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--batch", default="1,8,64", help="Comma-separated batch sizes.")
    p.add_argument("--configs", default="", help="Comma-separated export configs whose merge section is also timed on each model.")
    p.add_argument(
        "--eager-reference",
        action="store_true",
        help="Also time tome_eager: ToMe with the deploytk ops as their eager PyTorch reference instead of the Triton kernels.",
    )
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="Also time each variant replayed as a CUDA graph (no Python launch overhead) and count its host syncs.",
    )
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


def kernels_on_cpu() -> None:
    """Under TRITON_INTERPRET=1: each deploytk op's Triton kernel becomes its CPU implementation (Triton's interpreter),
    as the kernel is its CUDA implementation on a GPU, so a CPU run goes through the kernels' launch path."""
    from deploytk.ops import OPS

    for spec in OPS.values():
        spec.torch_op.register_kernel("cpu")(lambda *args, _spec=spec: _spec.kernel_module().launch(*args))


@contextmanager
def eager_ops(device: str):
    """The deploytk ops run their eager PyTorch reference on ``device`` instead of their Triton kernel."""
    from deploytk.ops import OPS

    with ExitStack() as stack:
        for spec in OPS.values():
            stack.enter_context(spec.torch_op.set_kernel_enabled(device, False))
        yield


def count_launches(fn) -> dict:
    """{torch op name: Triton kernel launches} while ``fn()`` runs (the CUDA/CPU implementations call ``launch``)."""
    from deploytk.ops import OPS

    counts, modules = {}, [spec.kernel_module() for spec in OPS.values()]
    originals = [m.launch for m in modules]

    def counting(name, real):
        def launch(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return real(*args, **kwargs)

        return launch

    for spec, module, real in zip(OPS.values(), modules, originals, strict=True):
        module.launch = counting(spec.torch_name, real)
    try:
        fn()
    finally:
        for module, real in zip(modules, originals, strict=True):
            module.launch = real
    return dict(sorted(counts.items()))


def time_variant(net, x, device: str, args, count: bool) -> tuple[float, dict | None]:
    """Median ms of ``net(x)``; with ``count``, also the Triton kernel launches of one forward pass: the timed one under
    --smoke (which measures nothing), else one more, untimed."""

    def measure() -> float:
        return median(time_ms(lambda: net(x), device, args.warmup, args.iterations))

    if not count:
        return measure(), None
    if args.smoke:
        timed = []
        launches = count_launches(lambda: timed.append(measure()))
        return timed[0], launches
    launches = count_launches(lambda: net(x))
    return measure(), launches


def host_syncs(net, x) -> int:
    """How often one forward pass makes the host wait for the GPU (PyTorch's sync debug mode warns at each): a wait in
    every block stops the CPU from queueing kernels ahead of the GPU, and a graph cannot be captured across one."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            net(x)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def graph_replay(net, x):
    """``net(x)`` captured once as a CUDA graph; replaying it launches every kernel with no Python in between, as a
    latency-serving user would run the model (TensorRT and torch.compile's reduce-overhead mode do the same)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm up on a side stream, as CUDA graph capture requires
            net(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        net(x)
    return graph.replay


def on_device(model, device: str, dtype: torch.dtype):
    """The model wholly in ``dtype`` on ``device``; a MergedViT also casts its input to ``dtype``."""
    model = model.to(device, dtype).eval()
    if hasattr(model, "compute_dtype"):
        model.compute_dtype = dtype
    return model


def main(argv=None) -> dict:
    from deploytk.ops import kernel_common

    args = parse_args(argv)
    if args.smoke:
        device, models, batches = "cpu", ["deit_tiny_patch16_224"], [1]
        args.warmup, args.iterations, args.dtype = 0, 1, args.dtype or "fp32"
        kernels = "triton-interpreter" if kernel_common.interpreting() else "none: the ops' eager reference on the CPU"
    elif not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA GPU (or --smoke to check the script on a CPU).")
    else:
        device, models, batches = "cuda", args.models.split(","), [int(v) for v in args.batch.split(",")]
        args.dtype = args.dtype or "fp16"
        kernels = "triton"
    out = result_output("end_to_end_latency", device, args.output)
    if kernels == "triton-interpreter":
        kernels_on_cpu()
    dtype = DTYPES[args.dtype]
    graphs = args.cuda_graphs and device == "cuda"  # a CPU smoke run has no graphs to capture
    rows, launches, failed = [], {}, {}
    configs = [Path(c) for c in args.configs.split(",") if c]
    eager = {"tome_eager"} if args.eager_reference and not kernels.startswith("none") else set()
    for name in models:
        nets = variants(name, args.r, configs)
        for key in sorted(eager):
            nets[key] = copy.deepcopy(nets["tome"])
        nets = {key: on_device(m, device, dtype) for key, m in nets.items()}
        schedule = nets["tome"].schedule
        launches[name] = {}
        for batch in batches:
            x = torch.from_numpy(nets["tome"].family.input_kind.synthetic(batch, np.random.default_rng(0))).to(device, dtype)
            ms, graph_ms, syncs = {}, {}, {}
            with torch.inference_mode():
                for key, net in nets.items():
                    try:
                        with eager_ops(device) if key in eager else nullcontext():
                            ms[key], counted = time_variant(net, x, device, args, count=key not in launches[name])
                        if counted is not None:
                            launches[name][key] = counted
                    except Exception as exc:  # recorded: the other variants are still measured and written
                        failed.setdefault(f"{name} b={batch} {key}", f"{type(exc).__name__}: {exc}"[:400])
                    if not graphs:
                        continue
                    try:
                        with eager_ops(device) if key in eager else nullcontext():
                            syncs[key] = host_syncs(net, x)
                            graph_ms[key] = median(time_ms(graph_replay(net, x), device, args.warmup, args.iterations))
                    except Exception as exc:
                        failed.setdefault(f"{name} b={batch} {key} cuda graph", f"{type(exc).__name__}: {exc}"[:400])
            dense = ms.get("dense")
            row = {
                "model": name,
                "batch": batch,
                "dtype": args.dtype,
                "r": args.r,
                "tokens_per_layer": schedule.tokens,
                "median_ms": {k: round(v, 3) for k, v in ms.items()},
                **{f"speedup_{k}": round(dense / v, 3) for k, v in ms.items() if k != "dense" and dense},
            }
            if graphs:
                dense_graph = graph_ms.get("dense")
                row["cuda_graph_median_ms"] = {k: round(v, 3) for k, v in graph_ms.items()}
                row["cuda_graph_speedup"] = {k: round(dense_graph / v, 3) for k, v in graph_ms.items() if k != "dense" and dense_graph}
                row["host_syncs_per_forward"] = syncs
            rows.append(row)
            merged = "  ".join(f"{k} {v:8.3f} ms ({dense / v:.2f}x)" for k, v in ms.items() if k != "dense" and dense)
            print(f"{name:26s} b={batch:<3d} dense {dense or float('nan'):8.3f} ms  {merged}")
            if graphs:
                dense_graph = graph_ms.get("dense")
                merged = "  ".join(
                    f"{k} {v:8.3f} ms ({dense_graph / v:.2f}x, {syncs.get(k, '?')} syncs)"
                    for k, v in graph_ms.items()
                    if k != "dense" and dense_graph
                )
                print(f"{'  as CUDA graphs':26s} b={batch:<3d} dense {dense_graph or float('nan'):8.3f} ms  {merged}")
        del nets
    payload = {
        "environment": device_facts(device),
        "smoke": args.smoke,
        "warmup": args.warmup,
        "iterations": args.iterations,
        "kernels": kernels,
        "cuda_graphs": graphs,
        "results": rows,
        "kernel_launches": launches,
        "failed": failed,
    }
    write_result(out, payload)
    if failed:
        raise SystemExit("variants failed:\n" + "\n".join(f"  {k}: {v}" for k, v in failed.items()))
    return payload


if __name__ == "__main__":
    main()
