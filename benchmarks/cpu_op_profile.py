"""Where a merged graph spends its time on a CPU runtime, next to the dense model: per-op profile.

ONNX Runtime: its profiler (``SessionOptions.enable_profiling``), kernel time per node. OpenVINO:
its performance counters (``PERF_COUNT``), real time per executed node of the compiled (static
batch) model. Nodes are grouped by the deploytk op they were inlined from (ONNX Runtime names
them ``_inlfunc_<Op>...``, deploytk's inliner ``<Op>/...``), the rest by op type, and the model's
linear layers (a MatMul/Gemm/FullyConnected with a weight) apart. Times are medians over
``--iterations`` runs after warm-up; a profiler adds a few microseconds per node, so compare the
groups of one run, and take end-to-end latencies from ``deploytk profile``.

    python benchmarks/cpu_op_profile.py artifacts/deit_small_tome_r16 --runtime ort --batch 1
    python benchmarks/cpu_op_profile.py artifacts/deit_small_tome_r16 --runtime openvino --batch 8 --json
    python benchmarks/cpu_op_profile.py ARTIFACT --batch 1 --output P.json    # saved with command, host and time
    python benchmarks/cpu_op_profile.py P.json --markdown                      # the table of a saved profile
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deploytk.backends.base import seeded_batch  # noqa: E402
from deploytk.exporter.artifacts import Artifact  # noqa: E402
from deploytk.exporter.baseline import baseline_onnx  # noqa: E402
from deploytk.exporter.inline import inline_deploytk_functions  # noqa: E402
from deploytk.exporter.onnx_io import runnable  # noqa: E402

LINEAR = "linear layers (weights)"


def group_of(name: str, op_type: str, linear: set[str]) -> str:
    found = re.search(r"_inlfunc_([A-Za-z]+)|^([A-Z][A-Za-z]+)/", name)
    if found:
        return f"deploytk {found.group(1) or found.group(2)}"
    return LINEAR if name in linear else op_type


def weighted_nodes(proto: onnx.ModelProto) -> set[str]:
    weights = {i.name for i in proto.graph.initializer}
    return {n.name for n in proto.graph.node if n.op_type in ("MatMul", "Gemm") and any(i in weights for i in n.input)}


def ort_runs(path: Path, kind, batch: int, warmup: int, iterations: int, threads: int = 0) -> tuple[list[dict], list[list[dict]]]:
    """ONNX Runtime's profiler over ``iterations`` runs after ``warmup``: each timed run's ``model_run`` event, and the
    node kernel events (``*_kernel_time``) that fell inside it."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "ort")
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as `profile` runs it
        options.log_severity_level = 3
        options.intra_op_num_threads = threads  # 0: ONNX Runtime's default, one per physical core
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        x = seeded_batch(batch, kind)
        for _ in range(warmup + iterations):
            session.run(None, {kind.onnx_name: x})
        events = json.loads(Path(session.end_profiling()).read_text())
    runs = [e for e in events if e.get("name") == "model_run"][warmup:]
    kernels: list[list[dict]] = [[] for _ in runs]
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        for i, run in enumerate(runs):
            if run["ts"] <= e["ts"] <= run["ts"] + run["dur"]:
                kernels[i].append(e)
                break
    return runs, kernels


def openvino_runs(proto: onnx.ModelProto, kind, batch: int, warmup: int, iterations: int, threads: int = 0):
    """OpenVINO's performance counters over ``iterations`` runs after ``warmup``, the model compiled as `profile` compiles
    it (static batch, f32): the compiled model, and each run's executed nodes as (name, type, ms)."""
    import openvino

    from deploytk.backends.openvino_backend import cpu_threads

    if proto.functions:
        proto = inline_deploytk_functions(proto)
    core = openvino.Core()
    with runnable(proto) as source:  # bytes, or a temporary file with external data past protobuf's limit
        model = core.read_model(io.BytesIO(source) if isinstance(source, bytes) else source)
    model.reshape({model.inputs[0].get_any_name(): list(kind.batch_shape(batch))})
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads or cpu_threads(), "INFERENCE_PRECISION_HINT": "f32"}
    config["PERF_COUNT"] = True
    compiled = core.compile_model(model, "CPU", config)
    request = compiled.create_infer_request()
    x = seeded_batch(batch, kind)
    for _ in range(warmup):
        request.infer({0: x})
    per_run = []
    for _ in range(iterations):
        request.infer({0: x})
        per_run.append(
            [
                (info.node_name, info.node_type, info.real_time.total_seconds() * 1e3)
                for info in request.profiling_info
                if info.status == info.Status.EXECUTED
            ]
        )
    return compiled, per_run


def profile_ort(path: Path, kind, batch: int, iterations: int, threads: int = 0) -> dict[str, float]:
    linear = weighted_nodes(onnx.load(str(path)))
    runs, kernels = ort_runs(path, kind, batch, 3, iterations, threads)
    per_run = [collections.Counter() for _ in runs]
    for counts, events in zip(per_run, kernels, strict=True):
        for e in events:
            counts[group_of(e["name"][: -len("_kernel_time")], e["args"]["op_name"], linear)] += e["dur"] / 1e3
    groups = {g for c in per_run for g in c}
    result = {g: float(np.median([c[g] for c in per_run])) for g in groups}
    result["(whole run, profiled)"] = float(np.median([r["dur"] / 1e3 for r in runs]))
    return result


def profile_openvino(proto: onnx.ModelProto, kind, batch: int, iterations: int, threads: int = 0) -> dict[str, float]:
    _, nodes = openvino_runs(proto, kind, batch, 3, iterations, threads)
    per_run = []
    for executed in nodes:
        counts = collections.Counter()
        for name, node_type, ms in executed:
            counts[LINEAR if node_type == "FullyConnected" else group_of(name, node_type, set())] += ms
        per_run.append(counts)
    groups = {g for c in per_run for g in c}
    return {g: float(np.median([c[g] for c in per_run])) for g in groups}


#: --runtime: each runtime's own per-node profiler (ONNX Runtime's profiling JSON, OpenVINO's performance counters)
PROFILERS = {
    "ort": profile_ort,
    "openvino": lambda path, kind, batch, iterations, threads: profile_openvino(onnx.load(str(path)), kind, batch, iterations, threads),
}


def markdown(report: dict, rows: int = 8) -> str:
    """The largest groups of a saved profile (``--output``), merged next to dense, as a markdown table."""
    table = report["ms"]
    merged, dense = table["merged"], table["dense"]
    groups = [g for g in sorted(set(merged) | set(dense), key=lambda g: -max(merged.get(g, 0), dense.get(g, 0))) if not g.startswith("(")]
    lines = [f"| {report['runtime']}, batch {report['batch']} | merged ms | dense ms |", "|---|---:|---:|"]
    lines += [f"| {g} | {merged.get(g, 0):.2f} | {dense.get(g, 0):.2f} |" for g in groups[:rows]]
    total = {k: sum(v for g, v in t.items() if not g.startswith("(")) for k, t in table.items()}
    lines.append(f"| sum of all nodes | {total['merged']:.2f} | {total['dense']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifact", type=Path, help="Directory written by `deploytk export` (fp32).")
    p.add_argument("--runtime", choices=list(PROFILERS), default="ort")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--threads", type=int, default=0, help="Intra-op threads (default 0: the runtime's default, all cores).")
    p.add_argument("--json", action="store_true", help="Print the groups as JSON.")
    p.add_argument("--output", type=Path, default=None, help="Also write the JSON (with the command, host and time) here.")
    p.add_argument("--markdown", action="store_true", help="ARTIFACT is a saved profile (--output): print its table and exit.")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.artifact.read_text())))
        return 0
    artifact = Artifact.open(args.artifact)
    paths = {"merged": artifact.onnx_path, "dense": baseline_onnx(artifact)}
    table = {}
    for name, path in paths.items():
        table[name] = PROFILERS[args.runtime](path, artifact.input_kind, args.batch, args.iterations, args.threads)
    report = {"artifact": str(args.artifact), "runtime": args.runtime, "batch": args.batch, "threads": args.threads or "default"}
    report["ms"] = table
    if args.output:
        from benchmarks.common import write_result
        from deploytk.files import claim_file
        from deploytk.machine import host

        manifest = artifact.manifest
        flops = {"model": manifest["model"]["name"], "method": manifest["method"]["name"]}
        flops["flops_ratio"] = round(manifest["dense_gflops"] / manifest["gflops"], 3)
        write_result(claim_file(args.output, "deploytk benchmarks/cpu_op_profile.py"), {**report, **flops, "host": host()})
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    groups = sorted(set(table["merged"]) | set(table["dense"]), key=lambda g: -max(table["merged"].get(g, 0), table["dense"].get(g, 0)))
    print(f"{args.artifact} on {args.runtime}, batch {args.batch}: median ms per run ({os.cpu_count()} CPUs)")
    print(f"{'group':42s} {'merged':>9s} {'dense':>9s}")
    for g in groups:
        print(f"{g:42s} {table['merged'].get(g, 0):9.3f} {table['dense'].get(g, 0):9.3f}")
    total = {k: sum(v for g, v in t.items() if not g.startswith("(")) for k, t in table.items()}
    print(f"{'sum of nodes':42s} {total['merged']:9.3f} {total['dense']:9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
