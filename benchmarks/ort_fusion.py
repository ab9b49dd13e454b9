"""What each step of ONNX Runtime's fused copy (``fmt='onnx-ort'``, deploytk/exporter/ort_fusion.py) buys, and what the
log(size) bias costs, on this CPU.

For one export (default: DeiT-S ToMe r=16, random weights) and its dense baseline, at each batch size, ONNX Runtime
sessions of these graphs, timed in one process with alternating runs (medians):

- ``model.onnx``: as exported; ONNX Runtime inlines the deploytk functions itself;
- ``attention-op``: each ProportionalAttention as the opset-23 ``Attention`` op with the log(size) mask, nothing else;
- ``fused``: the fused copy deploytk writes (attention op + onnxruntime's transformers optimizer);
- ``flash-folded``: attention through the contrib ``MultiHeadAttention`` (ONNX Runtime's CPU flash path, which takes
  no bias), the bias folded in exactly: a column of ones appended to q*scale and a column of log(size) to k, so that
  (q*scale | 1)(k | log size)^T = q*scale k^T + log(size);
- ``fused, no bias``: the fused copy with the mask input removed: wrong numbers (no proportional attention), timed
  only to show what the bias costs;
- ``dense`` and ``dense fused``: the baseline as exported and through the same fusion.

Every graph's outputs are compared with model.onnx's before timing (``fused, no bias`` is expected to differ and says
by how much). Writes benchmarks/results/ort_fusion_<cpu>.json and prints a markdown table.

    python benchmarks/ort_fusion.py                                   # DeiT-S ToMe r=16, batch 1 and 8 (~5 min)
    python benchmarks/ort_fusion.py --config export_configs/deit_base_tome_r16.yaml
    python benchmarks/ort_fusion.py --smoke --output /tmp/f.json      # digits ViT, 2 iterations: does it run
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import cpu_result_output, write_result  # noqa: E402
from deploytk.backends.base import seeded_batch  # noqa: E402
from deploytk.backends.ort import ort_session  # noqa: E402
from deploytk.exporter.artifacts import Artifact  # noqa: E402
from deploytk.exporter.baseline import baseline_onnx, fused_baseline_onnx  # noqa: E402
from deploytk.exporter.native_attention import OP_NAME, use_native_attention  # noqa: E402
from deploytk.exporter.onnx_io import infer_shapes, save_onnx  # noqa: E402
from deploytk.exporter.ort_fusion import CONTRIB_DOMAIN  # noqa: E402
from deploytk.machine import host  # noqa: E402
from deploytk.ops import DOMAIN  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "export_configs" / "deit_small_tome_r16.yaml"
SMOKE_CONFIG = ROOT / "export_configs" / "digits_vit_tome_r4.yaml"


def flash_folded(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Each ProportionalAttention as contrib MultiHeadAttention without a bias, the log(size) bias folded into q and k."""
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in infer_shapes(proto).graph.value_info}
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    nodes, inits = [], []
    for i, node in enumerate(out.graph.node):
        if not (node.domain == DOMAIN and node.op_type == OP_NAME):
            nodes.append(node)
            continue
        q, k, v, size = node.input
        _, heads, _, dim = shapes[q]
        scale = next(a.f for a in node.attribute if a.name == "scale")
        p = f"flash{i}_"
        inits += [
            numpy_helper.from_array(np.array(scale, np.float32), p + "scale"),
            numpy_helper.from_array(np.array(1.0, np.float32), p + "one"),
            numpy_helper.from_array(np.array([1], np.int64), p + "axis1"),
            numpy_helper.from_array(np.array([0, 0, -1], np.int64), p + "flat"),
            numpy_helper.from_array(np.array([0, 0, heads, dim], np.int64), p + "heads"),
            numpy_helper.from_array(np.array([1, heads, 1, 1], np.int64), p + "per_head"),
        ]

        def add(op: str, inputs: list[str], name: str, p: str = p, **attrs) -> str:
            nodes.append(helper.make_node(op, inputs, [p + name], name=p + name, **attrs))
            return p + name

        def bsh(x: str, name: str, p: str = p) -> str:  # [B, H, N, D] -> [B, N, H*D], MultiHeadAttention's 3-D layout
            return add("Reshape", [add("Transpose", [x], name + "_t", perm=[0, 2, 1, 3]), p + "flat"], name)

        ones = add("Expand", [p + "one", add("Concat", [add("Shape", [q], "bhn", start=0, end=3), p + "axis1"], "bhn1", axis=0)], "ones")
        q1 = add("Concat", [add("Mul", [q, p + "scale"], "q_scaled"), ones], "q_folded", axis=3)
        log_size = add("Expand", [add("Unsqueeze", [add("Log", [size], "log_size"), p + "axis1"], "log_size4"), p + "per_head"], "bias")
        k1 = add("Concat", [k, log_size], "k_folded", axis=3)
        mha = add(
            "MultiHeadAttention", [bsh(q1, "q3"), bsh(k1, "k3"), bsh(v, "v3")], "mha", domain=CONTRIB_DOMAIN, num_heads=heads, scale=1.0
        )
        nodes.append(helper.make_node("Transpose", [add("Reshape", [mha, p + "heads"], "mha4")], list(node.output), perm=[0, 2, 1, 3]))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(inits)
    out.opset_import.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))
    return out


def without_bias(fused: onnx.ModelProto) -> onnx.ModelProto:
    """The fused copy with every Attention op's mask input removed (timing only: no proportional attention)."""
    out = onnx.ModelProto()
    out.CopyFrom(fused)
    for node in out.graph.node:
        if node.op_type == "Attention" and node.domain in ("", "ai.onnx") and len(node.input) > 3:
            del node.input[3:]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="An fp32 export config with proportional attention.")
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--smoke", action="store_true", help="digits ViT, batch 1, 2 iterations: does it run")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    if args.smoke:
        args.config, args.batch_sizes, args.warmup, args.iterations = SMOKE_CONFIG, "1", 0, 2
    batches = [int(b) for b in args.batch_sizes.split(",")]
    out = cpu_result_output("ort_fusion", "ort_fusion.py", args.output)
    import onnxruntime as ort

    import deploytk

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        artifact_dir = deploytk.export(args.config, folder / "artifact", fmt="onnx-ort", batch_size=max(batches)).directory
        artifact = Artifact.open(artifact_dir)
        plain = onnx.load(str(artifact.onnx_path))
        fused = onnx.load(str(artifact.ort_path))
        graphs = {"model.onnx": artifact.onnx_path, "fused": artifact.ort_path}
        for name, proto in [
            ("attention-op", use_native_attention(plain)),
            ("flash-folded", flash_folded(plain)),
            ("fused, no bias", without_bias(fused)),
        ]:
            save_onnx(proto, folder / f"{name}.onnx", check=False)
            graphs[name] = folder / f"{name}.onnx"
        graphs |= {"dense": baseline_onnx(artifact), "dense fused": fused_baseline_onnx(artifact)}
        order = ["model.onnx", "attention-op", "fused", "flash-folded", "fused, no bias", "dense", "dense fused"]
        sessions = {name: ort_session(graphs[name], spinning=False) for name in order}
        rows = []
        for b in batches:
            x = seeded_batch(b, artifact.input_kind)
            feed = {artifact.input_kind.onnx_name: x}
            reference = {"model.onnx": sessions["model.onnx"].run(None, feed)[0]}
            reference |= {n: reference["model.onnx"] for n in order if not n.startswith("dense")}
            reference["dense"] = sessions["dense"].run(None, feed)[0]
            reference["dense fused"] = reference["dense"]
            diffs = {n: float(np.abs(sessions[n].run(None, feed)[0] - reference[n]).max()) for n in order}
            for _ in range(args.warmup):
                for n in order:
                    sessions[n].run(None, feed)
            times: dict[str, list[float]] = {n: [] for n in order}
            for _ in range(args.iterations):
                for n in order:
                    t0 = time.perf_counter()
                    sessions[n].run(None, feed)
                    times[n].append((time.perf_counter() - t0) * 1e3)
            medians = {n: float(np.median(times[n])) for n in order}
            rows.append(
                {
                    "batch_size": b,
                    "median_ms": medians,
                    "vs_model_onnx": {n: round(medians["model.onnx"] / medians[n], 3) for n in order},
                    "max_abs_diff": diffs,
                    "speedup_fused_vs_dense_fused": round(medians["dense fused"] / medians["fused"], 3),
                    "speedup_model_onnx_vs_dense": round(medians["dense"] / medians["model.onnx"], 3),
                }
            )
            print(f"batch {b}: " + ", ".join(f"{n} {medians[n]:.1f} ms" for n in order))
        manifest = artifact.manifest
        payload = {
            "smoke": args.smoke,
            "config": str(args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT) else args.config),
            "model": manifest["model"]["name"],
            "method": manifest["method"]["name"],
            "flops_ratio": round(manifest["dense_gflops"] / manifest["gflops"], 3),
            "fusions": manifest["onnx_ort"]["fusions"],
            "host": host(),
            "onnxruntime": ort.__version__,
            "threads": "ONNX Runtime's default (one per physical core), spinning off",
            "warmup": args.warmup,
            "iterations": args.iterations,
            "rows": rows,
        }
    write_result(out, payload)
    print(markdown(payload))
    return 0


def markdown(payload: dict) -> str:
    names = list(payload["rows"][0]["median_ms"])
    lines = ["| batch | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for row in payload["rows"]:
        lines.append(f"| {row['batch_size']} | " + " | ".join(f"{row['median_ms'][n]:.1f} ms" for n in names) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
