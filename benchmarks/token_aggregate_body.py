"""The ONNX body of ``deploytk.TokenAggregate`` alone on the CPU runtimes: the current body against the previous ones.

Three bodies, kept here only (production has one): ``previous``, a one-hot [B, T, N] assignment matrix
times x (T*N*C, the body until issue 45); ``extras_matmul``, issue 45's proposal (each slot's first
token gathered, the at most N - T other kept tokens summed by a [B, T, N - T] matrix and a MatMul);
``current``, deploytk/ops/token_aggregate/onnx_function.py (the same first tokens, the others added by
ScatterElements(add): (N - T)*C). Each case is a single-node model as the exporter writes it (static N
and C, symbolic batch; OpenVINO: inlined, reshaped to the batch and compiled as ``profile`` compiles
it, f32, LATENCY), fed a ToMe-like assignment (every slot one token, the N - T others merged into random
slots), normalize=1. Every body's output is compared with the torch op before timing; then ``--rounds``
rounds, each running every body ``--iterations`` times in turn (so drift hits all); medians of all runs.

    python benchmarks/token_aggregate_body.py                       # the five shapes below, ORT + OpenVINO (~2 min)
    python benchmarks/token_aggregate_body.py --runtimes ort --cases 1,1568,1445,768
    python benchmarks/token_aggregate_body.py --markdown benchmarks/results/token_aggregate_body_amd_epyc.json
    python benchmarks/token_aggregate_body.py --smoke --output /tmp/a.json    # tiny shapes, one round: does it run
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper
from onnxscript import FLOAT, INT64, script

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import cpu_result_output, write_result  # noqa: E402
from deploytk.machine import host  # noqa: E402
from deploytk.ops import OPS, PLUGIN_ATTRIBUTES  # noqa: E402
from deploytk.ops.onnx_common import deploytk_opset, op  # noqa: E402

#: (B, N, T, C): VideoMAE-B's first ToMe block (1,568 tokens, r=123) at batch 1 and 4, DeiT-S r=16 at 1 and 8, AST-base
CASES = [(1, 1568, 1445, 768), (4, 1568, 1445, 768), (1, 197, 181, 384), (8, 197, 181, 384), (1, 1214, 1166, 768)]
SMOKE_CASES = [(2, 33, 29, 16)]


@script(deploytk_opset, default_opset=op)
def previous_body(
    x: FLOAT, weight: FLOAT, dest: INT64, tokens_out: int, normalize: int, plugin_namespace: str = "deploytk", plugin_version: str = "1"
) -> FLOAT:
    """The body before issue 45 (commit 7e6f0e7): one-hot A [B, T, N] (weights in it) @ x, normalised by A's row sums."""
    one = op.Constant(value_ints=[1])
    slots = op.Unsqueeze(
        op.Range(op.Constant(value_int=0), op.Constant(value_int=tokens_out), op.Constant(value_int=1)), op.Constant(value_ints=[0, 2])
    )
    wf = op.Reshape(op.Cast(weight, to=1), op.Constant(value_ints=[0, 1, -1]))
    assign = op.Where(op.Equal(op.Unsqueeze(dest, one), slots), wf, op.Constant(value_float=0.0))
    num = op.MatMul(assign, op.Cast(x, to=1))
    den = op.ReduceSum(assign, op.Constant(value_ints=[-1]), keepdims=1)
    flag = op.Cast(op.Constant(value_int=normalize), to=9)
    return op.CastLike(op.Div(num, op.Where(flag, den, op.Constant(value_float=1.0))), x)


@script(deploytk_opset, default_opset=op)
def extras_matmul_body(
    x: FLOAT, weight: FLOAT, dest: INT64, tokens_out: int, normalize: int, plugin_namespace: str = "deploytk", plugin_version: str = "1"
) -> FLOAT:
    """Issue 45's proposed step 4, measured and not taken: the current body's first tokens and extras, the extras summed
    by a [B, T, E] assignment matrix and a MatMul (T*E*C) instead of ScatterElements(add) (E*C)."""
    zero = op.Constant(value_ints=[0])
    one = op.Constant(value_ints=[1])
    two = op.Constant(value_ints=[2])
    shape = op.Shape(x)
    batch = op.Slice(shape, zero, one)
    n = op.Slice(shape, one, two)
    t = op.Unsqueeze(op.Constant(value_int=tokens_out), zero)
    ids = op.Expand(
        op.Unsqueeze(op.Range(op.Constant(value_int=0), op.Squeeze(n, zero), op.Constant(value_int=1)), zero), op.Concat(batch, n, axis=0)
    )
    first = op.ScatterElements(op.Expand(n, op.Concat(batch, op.Add(t, one), axis=0)), dest, ids, axis=1, reduction="min")
    offsets = op.Unsqueeze(
        op.Mul(op.Range(op.Constant(value_int=0), op.Squeeze(batch, zero), op.Constant(value_int=1)), op.Squeeze(n, zero)), one
    )
    rows = op.Flatten(x, axis=2)
    weights = op.Reshape(op.Cast(weight, to=1), op.Constant(value_ints=[-1]))
    first_out = op.Slice(first, zero, t, one)
    at_first = op.Add(op.Min(first_out, op.Sub(n, one)), offsets)
    w_first = op.Where(op.Less(first_out, n), op.Gather(weights, at_first), op.Constant(value_float=0.0))
    extra = op.And(op.Less(dest, t), op.Not(op.Equal(op.GatherElements(first, dest, axis=1), ids)))
    flag, picked = op.TopK(op.Cast(extra, to=1), op.Max(op.Sub(n, t), one), axis=1)
    at_extra = op.Add(picked, offsets)
    w_extra = op.Mul(op.Gather(weights, at_extra), flag)
    slots = op.Unsqueeze(
        op.Range(op.Constant(value_int=0), op.Constant(value_int=tokens_out), op.Constant(value_int=1)), op.Constant(value_ints=[0, 2])
    )
    assign = op.Where(
        op.Equal(op.Unsqueeze(op.GatherElements(dest, picked, axis=1), one), slots),
        op.Unsqueeze(w_extra, one),
        op.Constant(value_float=0.0),
    )
    num = op.Add(
        op.Mul(op.Unsqueeze(w_first, two), op.Cast(op.Gather(rows, at_first), to=1)),
        op.MatMul(assign, op.Cast(op.Gather(rows, at_extra), to=1)),
    )
    den = op.Add(op.Unsqueeze(w_first, two), op.ReduceSum(assign, op.Constant(value_ints=[-1]), keepdims=1))
    flag_norm = op.Cast(op.Constant(value_int=normalize), to=9)
    return op.CastLike(op.Div(num, op.Where(flag_norm, den, op.Constant(value_float=1.0))), x)


#: what each row times, alternating: the body before issue 45, its proposed step 4, and the body deploytk exports
BODIES = {"previous": previous_body, "extras_matmul": extras_matmul_body, "current": OPS["TokenAggregate"].onnx_function}


def single_node(function, n: int, t: int, c: int, normalize: bool = True, x_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """One TokenAggregate node calling ``function`` (renamed to the op), as the exporter writes it: static N and C,
    symbolic batch (also the tests' one-node model: tests/helpers/aggregate.py)."""
    proto = function.to_function_proto()
    proto.name = "TokenAggregate"
    node = helper.make_node(
        "TokenAggregate", ["x", "weight", "dest"], ["out"], domain="deploytk", tokens_out=t, normalize=int(normalize), **PLUGIN_ATTRIBUTES
    )
    graph = helper.make_graph(
        [node],
        "token_aggregate",
        [
            helper.make_tensor_value_info("x", x_type, ["batch", n, c]),
            helper.make_tensor_value_info("weight", TensorProto.FLOAT, ["batch", n, 1]),
            helper.make_tensor_value_info("dest", TensorProto.INT64, ["batch", n]),
        ],
        [helper.make_tensor_value_info("out", x_type, ["batch", t, c])],
    )
    model = helper.make_model(graph, functions=[proto], opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("deploytk", 1)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


def tome_like_inputs(b: int, n: int, t: int, c: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Every slot gets one token (shuffled), the other N - T tokens merge into random slots; sizes 1..4."""
    gen = torch.Generator().manual_seed(seed)
    dest = torch.cat([torch.arange(t).expand(b, t), torch.randint(0, t, (b, n - t), generator=gen)], dim=1)
    dest = torch.stack([row[torch.randperm(n, generator=gen)] for row in dest])
    x = torch.randn(b, n, c, generator=gen)
    weight = torch.randint(1, 5, (b, n, 1), generator=gen).float()
    return {"x": x.numpy(), "weight": weight.numpy(), "dest": dest.numpy()}


def ort_runner(model: onnx.ModelProto, batch: int):
    from deploytk.backends.ort import ort_session
    from deploytk.exporter.onnx_io import runnable

    with runnable(model) as graph:  # bytes (a single node is far below protobuf's 2 GiB)
        session = ort_session(graph, spinning=False)  # two sessions run alternately
    return lambda feeds: session.run(None, feeds)[0]


def openvino_runner(model: onnx.ModelProto, batch: int):
    import openvino

    from deploytk.backends.openvino_backend import cpu_threads
    from deploytk.exporter.inline import inline_deploytk_functions
    from deploytk.exporter.onnx_io import runnable

    core = openvino.Core()
    with runnable(inline_deploytk_functions(model)) as graph:
        ov_model = core.read_model(io.BytesIO(graph) if isinstance(graph, bytes) else graph)
    ov_model.reshape(
        {i.get_any_name(): [batch, *(d.get_length() for d in i.get_partial_shape()[1:])] for i in ov_model.inputs}
    )  # static batch
    compiled = core.compile_model(
        ov_model, "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": cpu_threads(), "INFERENCE_PRECISION_HINT": "f32"}
    )
    request = compiled.create_infer_request()
    return lambda feeds: request.infer(feeds)[compiled.outputs[0]]


RUNNERS = {"ort": ort_runner, "openvino": openvino_runner}


def measure(runtime: str, case: tuple[int, int, int, int], rounds: int, iterations: int, warmup: int) -> dict:
    b, n, t, c = case
    feeds = tome_like_inputs(b, n, t, c)
    want = torch.ops.deploytk.token_aggregate(*(torch.from_numpy(feeds[k]) for k in ("x", "weight", "dest")), t, True).numpy()
    runs = {name: RUNNERS[runtime](single_node(fn, n, t, c), b) for name, fn in BODIES.items()}
    diff = {}
    for name, run in runs.items():
        got = run(feeds)
        diff[name] = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))  # relative to the output's scale
        if diff[name] > 1e-5:
            raise SystemExit(
                f"{runtime} {case}: the {name} body differs from the torch op (max difference {diff[name]:.3g} of the largest value)"
            )
        for _ in range(warmup):
            run(feeds)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            for _ in range(iterations):
                t0 = time.perf_counter()
                run(feeds)
                times[name].append((time.perf_counter() - t0) * 1e3)
    medians = {name: statistics.median(v) for name, v in times.items()}
    return {
        "runtime": runtime,
        "B": b,
        "N": n,
        "T": t,
        "C": c,
        "median_ms": medians,
        "speedup": medians["previous"] / medians["current"],
        "max_diff_over_max_value": diff,
        "runs": len(times["current"]),
    }


def markdown(payload: dict) -> str:
    lines = [
        "| runtime | B | N | T | C | previous ms | extras MatMul ms | current ms | speedup |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in payload["rows"]:
        m, shape = r["median_ms"], " | ".join(str(r[k]) for k in "BNTC")
        lines.append(
            f"| {r['runtime']} | {shape} | {m['previous']:.3f} | {m['extras_matmul']:.3f} | {m['current']:.3f} | {r['speedup']:.2f}x |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runtimes", default="ort,openvino", help="comma-separated: ort, openvino")
    p.add_argument("--cases", default=None, help="semicolon-separated B,N,T,C (default: the five shapes of issue 45)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iterations", type=int, default=20, help="runs of each body per round")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="one tiny shape, one round of 2 runs: does it run")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None, help="print the table of a saved result and exit")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    runtimes = args.runtimes.split(",")
    if unknown := set(runtimes) - set(RUNNERS):
        p.error(f"unknown runtime(s) {sorted(unknown)}; choose from {sorted(RUNNERS)}")
    cases = SMOKE_CASES if args.smoke else CASES
    if args.cases:
        cases = [tuple(int(v) for v in case.split(",")) for case in args.cases.split(";")]
    rounds, iterations, warmup = (1, 2, 1) if args.smoke else (args.rounds, args.iterations, args.warmup)
    out = cpu_result_output("token_aggregate_body", "token_aggregate_body.py", args.output)
    rows = []
    for runtime in runtimes:
        for case in cases:
            rows.append(measure(runtime, case, rounds, iterations, warmup))
            r = rows[-1]
            print(
                f"{runtime:9s} B={case[0]} N={case[1]} T={case[2]} C={case[3]}: "
                + ", ".join(f"{name} {ms:.3f} ms" for name, ms in r["median_ms"].items())
                + f" ({r['speedup']:.2f}x)",
                flush=True,
            )
    import onnxruntime

    versions = {"onnxruntime": onnxruntime.__version__}
    if "openvino" in runtimes:
        import openvino

        versions["openvino"] = openvino.__version__
    payload = {
        "smoke": args.smoke,
        "host": host(),
        "versions": versions,
        "rounds": rounds,
        "iterations": iterations,
        "warmup": warmup,
        "rows": rows,
    }
    write_result(out, payload)
    print(markdown(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
