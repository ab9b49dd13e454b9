"""Video and audio transformers on the CPU runtimes: ToMe's speedup over the unmerged model against its FLOPs ratio.

Issue 45's performance benchmark. Models (random weights, seeded, built from their transformers configs and saved with
``save_pretrained``: no download; latency does not depend on the weights):

- VideoMAE-B: ``VideoMAEForVideoClassification(VideoMAEConfig(num_labels=400))``, the config's defaults: 16 frames of
  224 px, tubelets of 2 frames x 16 x 16 px, 8 x 14 x 14 = 1,568 tokens, no class token;
- AST-base: ``ASTForAudioClassification(ASTConfig(num_labels=527))``, 1,024 time steps x 128 mel bins, patches 16 x 16
  at strides 10, 101 x 12 + 2 = 1,214 tokens.

Schedules: ToMe with one constant ``r`` per block, chosen for each target FLOPs ratio (``--ratios``, default 1.5, 2 and
3) as the ``r`` whose estimated ratio is nearest it (in log terms). The estimate counts the blocks as fvcore does, from
the token schedule deploytk builds without exporting (``estimated_gflops``: qkv, projection and attention products at
the tokens entering a block, ToMe's matching, the MLP at the tokens leaving it; `tune`'s cruder estimate, which counts
the MLP before the merge, put AST-base r=103 at 2.0x where the export counts 2.18x). The export then counts fvcore's
GFLOPs exactly (patch embedding and head included); that exact ratio, ``flops_ratio``, is what the efficiency is
measured against.

Each (model, schedule, runtime) row runs in its own child process (this script re-invoked with ``--row``), so one
row's thread pools never touch the next: ``Artifact.profile`` at batch 1 and 4, the merged and the dense model (same
weights, exported by deploytk) alternating in one process after warm-up; ``speedup`` = dense p50 / merged p50,
``efficiency`` = speedup / FLOPs ratio, held to the issue's target (>= 0.9 on both runtimes).

The attention share: the first schedule's row of each model and runtime also profiles the dense graph per node at each
batch size, after its timing (as ``benchmarks/cpu_op_profile.py`` does: ONNX Runtime's profiler, OpenVINO's performance
counters; medians of ``--op-iterations`` runs). Attention is its softmax and its two activation x activation products
(Q K^T and A V; a linear layer multiplies by a weight): on ONNX Runtime the Softmax and (Fused)MatMul kernels whose
inputs are both of rank >= 3, on OpenVINO every executed node made of one of those ONNX nodes (it fuses them, with the
transposes around them, into one ``Subgraph``). ``attention_time_share`` = their time / the sum of all nodes';
``attention_flops_share`` = the attention products' share of the blocks' FLOPs (the estimate above). Where the time
share exceeds the FLOPs share, attention costs more per FLOP than the linears, which is where long sequences gain more
than their FLOPs ratio.

Writes benchmarks/results/video_audio_<cpu>.json (host, versions, runtime settings, every row) and prints the markdown
table (``--markdown JSON`` prints an earlier run's).

    python benchmarks/video_audio.py                             # both models, 3 schedules, ORT + OpenVINO, batch 1 and 4
    python benchmarks/video_audio.py --models ast_base --ratios 2 --runtimes ort --batch-sizes 1 --iterations 3
    python benchmarks/video_audio.py --markdown benchmarks/results/video_audio_amd_epyc.json
    python benchmarks/video_audio.py --smoke --output /tmp/v.json   # tiny configs, one iteration: does it run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import cpu_result_output, write_result  # noqa: E402

#: name -> (transformers class, its config class, the config's settings: the defaults but for the label count)
MODELS = {
    "videomae_base": ("VideoMAEForVideoClassification", "VideoMAEConfig", {"num_labels": 400}),
    "ast_base": ("ASTForAudioClassification", "ASTConfig", {"num_labels": 527}),
}
_LAYERS = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 2, "intermediate_size": 128, "num_labels": 5}
#: --smoke: the small configs of tests/families/test_video_audio.py (64 and 40 tokens)
SMOKE_MODELS = {
    "videomae_base": ("VideoMAEForVideoClassification", "VideoMAEConfig", {"image_size": 32, "patch_size": 8, "num_frames": 8, **_LAYERS}),
    "ast_base": (
        "ASTForAudioClassification",
        "ASTConfig",
        {"patch_size": 16, "frequency_stride": 10, "time_stride": 10, "max_length": 100, "num_mel_bins": 48, **_LAYERS},
    ),
}
#: the FLOPs ratios (dense / merged) the schedules aim at
RATIOS = (1.5, 2.0, 3.0)
RUNTIMES = ("ort", "openvino")
BATCH_SIZES = (1, 4)
#: the issue's target: speedup over the dense model on the same runtime >= 0.9 of the FLOPs ratio
TARGET = 0.9
NAMES = {"ort": "ORT", "openvino": "OpenVINO"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"Comma-separated, of {', '.join(MODELS)}.")
    p.add_argument("--ratios", default=",".join(f"{r:g}" for r in RATIOS), help="Target FLOPs ratios, one ToMe schedule each.")
    p.add_argument("--runtimes", default=",".join(RUNTIMES))
    p.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iterations", type=int, default=10, help="Alternating runs of merged and dense per batch size.")
    p.add_argument("--op-iterations", type=int, default=3, help="Profiled runs of the dense model per batch size (attention share).")
    p.add_argument("--smoke", action="store_true", help="Tiny configs, one schedule, one iteration: checks the script, measures nothing.")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None, metavar="JSON", help="Print the table of an earlier run's JSON and exit.")
    p.add_argument("--row", default=None, help=argparse.SUPPRESS)  # internal: one row's spec (JSON), run in this process
    p.add_argument("--row-output", type=Path, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def save_model(name: str, settings: tuple, folder: Path) -> Path:
    """The model with seeded random weights, saved as a transformers folder for ``model: hf:<folder>``."""
    import torch
    import transformers

    class_name, config_name, config = settings
    torch.manual_seed(0)
    model = getattr(transformers, class_name)(getattr(transformers, config_name)(**config))
    model.save_pretrained(folder / name)
    return folder / name


def estimated_gflops(width: int, mlp_dim: int, tokens: list[int], merged: list[int]) -> tuple[float, float]:
    """(the blocks' GFLOPs, of which the attention products) as fvcore counts them, from the token schedule: per block,
    qkv, the projection and the two attention products at the tokens entering it, ToMe's matching product where it
    merges, and the MLP at the tokens leaving it (ToMe merges between attention and MLP)."""
    total = attention = 0
    for t, r in zip(tokens, merged, strict=True):
        products = 2 * t * t * width
        matching = ((t + 1) // 2) * (t // 2) * width if r else 0
        total += 4 * t * width * width + products + matching + 2 * (t - r) * mlp_dim * width
        attention += products
    return total / 1e9, attention / 1e9


def choose_schedules(folder: Path, ratios: list[float]) -> tuple[list[dict], dict]:
    """For each target ratio the constant ToMe r whose estimated FLOPs ratio is nearest (log distance), and the dense
    model's token count and estimated attention FLOPs share."""
    from deploytk.config import config_from_dict
    from deploytk.merging.merged_vit import build_merged
    from deploytk.models import create_model

    cfg = config_from_dict({"model": f"hf:{folder}", "export": {"img_size": None}, "merge": {"method": "tome", "r": 0}})
    family = create_model(cfg)
    tokens = family.num_patches + family.num_prefix_tokens
    dense, dense_attention = estimated_gflops(family.embed_dim, family.mlp_dim, [tokens] * family.depth, [0] * family.depth)
    candidates, previous = [], None
    for r in range(1, tokens):
        model = build_merged(cfg.merge.reduction, family, r, cfg.merge.prop_attn, cfg.merge.parsed_options, cfg.export.output_spec())
        schedule, merged = list(model.schedule.tokens[: model.blocks_run]), list(model.schedule.effective_r[: model.blocks_run])
        if schedule == previous:  # the cap leaves nothing more to merge
            break
        estimate = estimated_gflops(family.embed_dim, family.mlp_dim, schedule, merged)[0]
        tokens_out = model.schedule.tokens_out_of(model.blocks_run)
        candidates.append({"r": r, "tokens_per_layer": schedule, "tokens_out": tokens_out, "estimated_ratio": dense / estimate})
        previous = schedule
    chosen = []
    for target in ratios:
        best = min(candidates, key=lambda c: abs(math.log(c["estimated_ratio"] / target)))
        if best["r"] not in [c["r"] for c in chosen]:
            chosen.append({**best, "target_ratio": target, "estimated_ratio": round(best["estimated_ratio"], 3)})
    facts = {"tokens": tokens, "depth": family.depth, "width": family.embed_dim, "attention_flops_share": round(dense_attention / dense, 3)}
    return chosen, facts


def attention_nodes(proto) -> set[str]:
    """Names (and output names) of the dense graph's attention nodes: every Softmax, and every MatMul whose two inputs
    both come from the model's input (activation x activation: Q K^T and A V; a linear layer multiplies by a weight)."""
    live = {i.name for i in proto.graph.input}
    found = set()
    for node in proto.graph.node:  # ONNX graphs are topologically sorted
        if any(i in live for i in node.input):
            live.update(node.output)
        if node.op_type == "Softmax" or (node.op_type == "MatMul" and all(i in live for i in node.input[:2])):
            found.update([node.name, *node.output])
    return found


def ort_attention(path: Path, kind, batch: int, iterations: int) -> dict[str, float]:
    """ONNX Runtime's profiler on the dense graph: median ms of all nodes and of attention's. ONNX Runtime fuses and
    renames nodes while optimizing, so attention is told by the kernel's inputs: a Softmax, or a (Fused)MatMul of two
    tensors of rank >= 3 (a linear layer's weight is 2-D)."""
    import numpy as np

    from benchmarks.cpu_op_profile import ort_runs

    _, kernels = ort_runs(path, kind, batch, 2, iterations)
    nodes, attention = np.zeros(len(kernels)), np.zeros(len(kernels))
    for i, events in enumerate(kernels):
        for e in events:
            nodes[i] += e["dur"] / 1e3
            op, shapes = e["args"]["op_name"], [next(iter(s.values())) for s in e["args"].get("input_type_shape", [])]
            if op == "Softmax" or (op in ("MatMul", "FusedMatMul") and len(shapes) >= 2 and min(len(s) for s in shapes[:2]) >= 3):
                attention[i] += e["dur"] / 1e3
    return {"nodes_ms": float(np.median(nodes)), "attention_ms": float(np.median(attention))}


def openvino_attention(path: Path, kind, batch: int, iterations: int) -> dict[str, float]:
    """OpenVINO's performance counters on the dense graph, compiled as `profile` compiles it (static batch, f32): median
    ms of all executed nodes and of attention's. OpenVINO fuses attention into larger nodes (a ``Subgraph`` holding
    MatMul, Softmax and MatMul); a node is attention when the ONNX nodes it was made of (its ``originalLayersNames``)
    include an attention node of the graph."""
    import numpy as np
    import onnx

    from benchmarks.cpu_op_profile import openvino_runs

    proto = onnx.load(str(path))
    wanted = attention_nodes(proto)
    compiled, runs = openvino_runs(proto, kind, batch, 2, iterations)
    made_of = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        names = info["originalLayersNames"].astype(str) if "originalLayersNames" in info else ""
        made_of[op.get_friendly_name()] = {n for n in names.split(",") if n}
    nodes = [sum(ms for _, _, ms in executed) for executed in runs]
    attention = [sum(ms for name, _, ms in executed if made_of.get(name, set()) & wanted) for executed in runs]
    return {"nodes_ms": float(np.median(nodes)), "attention_ms": float(np.median(attention))}


#: runtime -> the dense graph's attention profile
ATTENTION_PROFILERS = {"ort": ort_attention, "openvino": openvino_attention}


def run_row(spec: dict) -> dict:
    """One (model, schedule, runtime) row, in this process: the alternating profile, then (``op_profile``) the dense graph
    per op at each batch size."""
    import deploytk
    from deploytk.exporter.artifacts import Artifact
    from deploytk.exporter.baseline import baseline_onnx

    artifact = deploytk.load(spec["artifact"])
    report = artifact.profile(spec["runtime"], batch_sizes=spec["batch_sizes"], warmup=spec["warmup"], iterations=spec["iterations"])
    data = report.to_dict()
    out = {
        "runtime_settings": data["runtime_settings"],
        "dense_runtime_settings": data["dense_runtime_settings"],
        "results": data["results"],
    }
    if spec["op_profile"]:
        opened = Artifact.open(artifact.directory)
        dense = baseline_onnx(opened)  # what the profile timed as the dense model (cached by the profile above)
        out["dense_ops"] = {}
        for batch in spec["batch_sizes"]:
            ms = ATTENTION_PROFILERS[spec["runtime"]](dense, opened.input_kind, batch, spec["op_iterations"])
            share = ms["attention_ms"] / ms["nodes_ms"] if ms["nodes_ms"] else None
            out["dense_ops"][str(batch)] = {k: round(v, 3) for k, v in ms.items()} | {"attention_time_share": share and round(share, 3)}
    return out


def run_child(spec: dict, folder: Path, env: dict) -> dict:
    """``run_row`` in a child process: its JSON, or the error its stderr ends with."""
    out = folder / "row.json"
    out.unlink(missing_ok=True)
    command = [sys.executable, __file__, "--row", json.dumps(spec), "--row-output", str(out)]
    done = subprocess.run(command, stderr=subprocess.PIPE, text=True, env=env)
    if done.returncode != 0 or not out.is_file():
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return {"error": (lines[-1] if lines else f"exit {done.returncode}")[:300]}
    return json.loads(out.read_text())


def environment() -> dict:
    from deploytk.exporter.manifest import package_versions
    from deploytk.machine import host

    return {**host(), "versions": package_versions()}


def rows_for(model: str, schedule: dict, manifest: dict, runtime: str, measured: dict) -> list[dict]:
    flops_ratio = manifest["dense_gflops"] / manifest["gflops"]
    base = {
        "model": model,
        "r": schedule["r"],
        "target_ratio": schedule["target_ratio"],
        "estimated_ratio": schedule["estimated_ratio"],
        "tokens_per_layer": schedule["tokens_per_layer"],
        "tokens_out": schedule["tokens_out"],
        "gflops": round(manifest["gflops"], 6),
        "dense_gflops": round(manifest["dense_gflops"], 6),
        "flops_ratio": round(flops_ratio, 3),
        "runtime": runtime,
    }
    if "error" in measured:
        return [{**base, "error": measured["error"]}]
    rows = []
    for r in measured["results"]:
        speedup = r["dense"]["latency_ms"]["p50"] / r["latency_ms"]["p50"]
        rows.append(
            {
                **base,
                "batch": r["batch_size"],
                "dense_p50_ms": r["dense"]["latency_ms"]["p50"],
                "merged_p50_ms": r["latency_ms"]["p50"],
                "speedup": round(speedup, 3),
                "efficiency": round(speedup / flops_ratio, 3),
                "target": TARGET,
                "meets_target": bool(speedup / flops_ratio >= TARGET),
            }
        )
    return rows


def run(args) -> dict:
    smoke = args.smoke
    specs = SMOKE_MODELS if smoke else MODELS
    models = args.models.split(",")
    ratios = [2.0] if smoke else [float(v) for v in args.ratios.split(",")]
    runtimes = args.runtimes.split(",")
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    warmup, iterations, op_iterations = (0, 1, 1) if smoke else (args.warmup, args.iterations, args.op_iterations)
    rows, attention, model_facts, settings = [], [], {}, {}
    with tempfile.TemporaryDirectory(prefix="deploytk-video-audio-") as tmp:
        folder = Path(tmp)
        env = {**os.environ, "DEPLOYTK_CACHE": str(folder / "cache")}  # the dense baselines (350 MB each at VideoMAE-B): not ~/.cache
        import deploytk

        for model in models:
            saved = save_model(model, specs[model], folder / "hf")
            schedules, facts = choose_schedules(saved, ratios)
            model_facts[model] = {"config": {k: v for k, v in specs[model][2].items()}, "class": specs[model][0], **facts}
            print(f"{model}: {facts['tokens']} tokens, r = {', '.join(str(s['r']) for s in schedules)}", flush=True)
            for i, schedule in enumerate(schedules):
                t0 = time.perf_counter()
                out = folder / f"{model}_r{schedule['r']}"
                artifact = deploytk.export(f"hf:{saved}", out, method="tome", r=schedule["r"], batch_size=1)
                manifest = artifact.manifest
                ratio = manifest["dense_gflops"] / manifest["gflops"]
                print(f"  r={schedule['r']}: exported in {time.perf_counter() - t0:.0f} s, FLOPs ratio {ratio:.2f}x", flush=True)
                for runtime in runtimes:
                    spec = {
                        "artifact": str(out),
                        "runtime": runtime,
                        "batch_sizes": batch_sizes,
                        "warmup": warmup,
                        "iterations": iterations,
                        "op_profile": i == 0,
                        "op_iterations": op_iterations,
                    }
                    t0 = time.perf_counter()
                    measured = run_child(spec, folder, env)
                    if "runtime_settings" in measured:  # a failed row has none
                        settings.setdefault(runtime, measured["runtime_settings"])
                    new = rows_for(model, schedule, manifest, runtime, measured)
                    rows += new
                    for row in new:
                        what = row.get("error") or (
                            f"batch {row['batch']}: dense {row['dense_p50_ms']:.1f} ms, merged {row['merged_p50_ms']:.1f} ms, "
                            f"{row['speedup']:.2f}x of {row['flops_ratio']:.2f}x ({row['efficiency']:.2f})"
                        )
                        print(f"    {runtime:9s} {what}", flush=True)
                    for batch, ops in measured.get("dense_ops", {}).items():
                        attention.append({"model": model, "runtime": runtime, "batch": int(batch), **ops})
                        print(f"    {runtime:9s} batch {batch}: attention {ops['attention_time_share']:.0%} of the dense model's node time")
                    print(f"    {runtime:9s} row took {time.perf_counter() - t0:.0f} s", flush=True)
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(folder / "cache", ignore_errors=True)  # the next schedule's dense baseline is keyed by its own model.onnx
    return {
        "smoke": smoke,
        "environment": environment(),
        "runtime_settings": settings,
        "protocol": {
            "warmup": warmup,
            "iterations": iterations,
            "op_iterations": op_iterations,
            "statistic": "p50 of alternating merged/dense runs, one child process per model, schedule and runtime",
            "schedules": "constant ToMe r per block, nearest the target FLOPs ratio by tune's block estimate",
            "attention": "activation MatMuls + Softmax (+ fused attention nodes) over the sum of all nodes, dense model, median run",
        },
        "target": TARGET,
        "models": model_facts,
        "rows": rows,
        "attention": attention,
    }


def markdown(result: dict) -> str:
    """One line per model and schedule: FLOPs ratio, then speedup (efficiency) per runtime and batch; then the attention
    share of the dense model's time per runtime and batch."""
    rows = [r for r in result["rows"] if "error" not in r]
    series = list(dict.fromkeys((r["runtime"], r["batch"]) for r in rows))
    lines = [
        "| model | ToMe r | tokens out | GFLOPs (dense) | FLOPs ratio | "
        + " | ".join(f"{NAMES.get(rt, rt)} b{b}" for rt, b in series)
        + " |",
        "|---|---:|---:|---:|---:|" + "---:|" * len(series),
    ]
    cells = {(r["model"], r["r"], r["runtime"], r["batch"]): r for r in rows}
    for model, r in dict.fromkeys((x["model"], x["r"]) for x in result["rows"]):
        first = next(x for x in result["rows"] if (x["model"], x["r"]) == (model, r))
        out = [
            model,
            str(r),
            str(first["tokens_out"]),
            f"{first['gflops']:.1f} ({first['dense_gflops']:.1f})",
            f"{first['flops_ratio']:.2f}x",
        ]
        for runtime, batch in series:
            cell = cells.get((model, r, runtime, batch))
            if cell is None:
                failed = any("error" in x and (x["model"], x["r"], x["runtime"]) == (model, r, runtime) for x in result["rows"])
                out.append("failed" if failed else "")
                continue
            mark = " ✓" if cell["meets_target"] else f" ✗ < {cell['target']:.2f}"
            out.append(f"{cell['speedup']:.2f}x ({cell['efficiency']:.2f}{mark})")
        lines.append("| " + " | ".join(out) + " |")
    if result["attention"]:
        kept = list(dict.fromkeys((a["runtime"], a["batch"]) for a in result["attention"]))
        head = " | ".join(f"{NAMES.get(rt, rt)} b{b}" for rt, b in kept)
        lines += [
            "",
            f"| dense model | tokens | attention: share of FLOPs | share of time: {head} |",
            "|---|---:|---:|" + "---:|" * len(kept),
        ]
        share = {(a["model"], a["runtime"], a["batch"]): a["attention_time_share"] for a in result["attention"]}
        for model, facts in result["models"].items():
            out = [model, str(facts["tokens"]), f"{facts['attention_flops_share']:.0%}"]
            out += [f"{share[(model, rt, b)]:.0%}" if share.get((model, rt, b)) is not None else "" for rt, b in kept]
            lines.append("| " + " | ".join(out) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.row:
        args.row_output.write_text(json.dumps(run_row(json.loads(args.row))))
        return 0
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    for what, given, known in (("model", args.models, MODELS), ("runtime", args.runtimes, RUNTIMES)):
        unknown = [name for name in given.split(",") if name not in known]
        if unknown:
            raise SystemExit(f"unknown {what}(s) {', '.join(unknown)}; known: {', '.join(known)}")
    out = cpu_result_output("video_audio", "video_audio.py", args.output)  # claimed before the run
    t0 = time.perf_counter()
    result = run(args)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    write_result(out, result)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
