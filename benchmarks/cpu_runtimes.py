"""Merged vs dense latency on the CPU runtimes (ONNX Runtime, OpenVINO), against the FLOPs ceiling.

For each model (default DeiT-S and DeiT-B, random weights: latency does not depend on them),
each method's ready-made config (``export_configs/deit_small_*``; on DeiT-B the same merge
section with ``model`` overridden, except ToMe, which has its own ``deit_base_tome_r16``), each
runtime and batch size: ``deploytk profile``'s protocol (merged and dense, same weights and
precision, exported by deploytk, alternating runs in one process, ``--iterations`` each after
``--warmup``), and

- ``speedup`` = dense p50 / merged p50 (ratio of medians, measured in the same run);
- ``flops_ratio`` = dense GFLOPs / merged GFLOPs (fvcore's convention), the ceiling;
- ``efficiency`` = speedup / flops_ratio, held to the targets (DeiT-S ToMe r=16: >= 0.95 at
  batch 8 and >= 0.90 at batch 1; every other method >= 0.85 at batch 8).

Writes benchmarks/results/cpu_runtimes_<cpu>.json (device, versions, runtime settings, every
row) and a PNG of the efficiencies next to it, and prints the markdown table of docs/results/index.md.

    python benchmarks/cpu_runtimes.py                          # everything: ~1 h on 2 cores
    python benchmarks/cpu_runtimes.py --models deit_small_patch16_224 --methods tome,evit
    python benchmarks/cpu_runtimes.py --markdown results.json  # the table of an earlier run
    python benchmarks/cpu_runtimes.py --smoke --output /tmp/c.json   # digits ViT, 1 iteration: does it run
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deploytk.config import apply_overrides, load_config  # noqa: E402
from deploytk.exporter.pipeline import run_export  # noqa: E402
from deploytk.files import FileOutput, claim_file  # noqa: E402
from deploytk.profile.profiler import profile  # noqa: E402
from deploytk.reducers import METHODS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "export_configs"
#: which ready-made config of a method is measured: the first of these schedules that export_configs/ has for the model
#: (r=16 for the r methods, keep 0.7 for the keep-rate ones, ATM calibrated: its presets merge nothing on random weights,
#: PiToMe at its official keep rate 0.9); a model without one gets the DeiT-S config with `model` overridden
SCHEDULES = ("r16", "k70", "calibrated", "k90")
SMOKE_CONFIG = "digits_vit_tome_r4"
#: the efficiency targets (speedup / FLOPs ratio) of the CPU performance issue: every method at batch 8, DeiT-S ToMe r=16 at 8 and 1
TARGETS = {("deit_small_patch16_224", "tome"): {8: 0.95, 1: 0.90}}


def target(model: str, method: str, batch: int) -> float | None:
    return TARGETS.get((model, method), {8: 0.85}).get(batch)


def config_for(model: str, method: str) -> Path | None:
    """The measured config of ``method`` (registry name) for ``model`` (timm name), from export_configs/."""
    for prefix in dict.fromkeys([model.split("_patch")[0], "deit_small"]):
        for schedule in SCHEDULES:
            path = CONFIGS / f"{prefix}_{method}_{schedule}.yaml"
            if path.is_file():
                return path
    return None


def default_methods() -> list[str]:
    return [m for m in METHODS if config_for("deit_small_patch16_224", m) is not None]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="deit_small_patch16_224,deit_base_patch16_224")
    p.add_argument(
        "--methods",
        default=",".join(default_methods()),
        help="Comma-separated merge.method names (default: every one with a ready-made DeiT-S config, so not VisionZip, "
        "whose configs are LLaVA towers).",
    )
    p.add_argument("--runtimes", default="ort,openvino", help="Comma-separated deploytk backends (CPU ones).")
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iterations", type=int, default=12, help="Alternating runs of merged and dense per batch size (>= 10).")
    p.add_argument("--smoke", action="store_true", help="The digits ViT, ToMe r=4, batch 1, 1 iteration: measures nothing.")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None, metavar="JSON", help="Print the table of an earlier run's JSON and exit.")
    return p.parse_args(argv)


def jobs(args) -> list[tuple[str, str, Path]]:
    """(model, method, config path) to run."""
    if args.smoke:
        return [("vit_tiny_patch16_224", "tome", CONFIGS / f"{SMOKE_CONFIG}.yaml")]
    out = []
    for model in args.models.split(","):
        for method in args.methods.split(","):
            config = config_for(model, method)
            if config is None:
                raise SystemExit(
                    f"no ready-made config of method {method!r} in {CONFIGS} (one of {', '.join(SCHEDULES)}); methods: {', '.join(METHODS)}"
                )
            out.append((model, method, config))
    return out


def environment() -> dict:
    from deploytk.exporter.manifest import package_versions
    from deploytk.machine import host

    return {**host(), "versions": package_versions()}


def run(args) -> dict:
    batch_sizes = [1] if args.smoke else [int(b) for b in args.batch_sizes.split(",")]
    warmup, iterations = (0, 1) if args.smoke else (args.warmup, args.iterations)
    rows, settings = [], {}
    with tempfile.TemporaryDirectory(prefix="deploytk-cpu-bench-") as tmp:
        for i, (model, method, config) in enumerate(jobs(args)):
            cfg = load_config(config)
            if not args.smoke and cfg.model != model:
                cfg = apply_overrides(cfg, model=model)
            directory = Path(tmp) / f"{model}_{method}"
            t0 = time.perf_counter()
            manifest = run_export(cfg, directory)
            print(f"[{i + 1}/{len(jobs(args))}] {model} {method}: exported in {time.perf_counter() - t0:.0f} s", flush=True)
            flops_ratio = manifest["dense_gflops"] / manifest["gflops"]
            for runtime in args.runtimes.split(","):
                try:
                    result = profile(directory, runtime, batch_sizes, warmup, iterations)
                except Exception as err:  # noqa: BLE001 (one runtime failing on one graph must not lose the other rows)
                    message = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
                    rows.append({"model": model, "method": method, "config": config.name, "runtime": runtime, "error": message})
                    print(f"    {runtime:9s} FAILED: {message}", flush=True)
                    continue
                settings[runtime] = result["runtime_settings"]
                for r in result["results"]:
                    speedup = r["dense"]["latency_ms"]["p50"] / r["latency_ms"]["p50"]
                    goal = target(model, method, r["batch_size"])
                    row = {
                        "model": model,
                        "method": method,
                        "config": config.name + ("" if cfg.model == load_config(config).model else f" (model: {model})"),
                        "runtime": runtime,
                        "batch": r["batch_size"],
                        "gflops": round(manifest["gflops"], 3),
                        "dense_gflops": round(manifest["dense_gflops"], 3),
                        "flops_ratio": round(flops_ratio, 3),
                        "dense_p50_ms": r["dense"]["latency_ms"]["p50"],
                        "merged_p50_ms": r["latency_ms"]["p50"],
                        "speedup": round(speedup, 3),
                        "efficiency": round(speedup / flops_ratio, 3),
                        "target": goal,
                        "meets_target": None if goal is None else bool(speedup / flops_ratio >= goal),
                    }
                    rows.append(row)
                    print(
                        f"    {runtime:9s} batch {row['batch']}: dense {row['dense_p50_ms']:.1f} ms, merged {row['merged_p50_ms']:.1f} ms, "
                        f"speedup {row['speedup']:.2f}x of {row['flops_ratio']:.2f}x ({row['efficiency']:.2f})",
                        flush=True,
                    )
            shutil.rmtree(directory, ignore_errors=True)  # DeiT-B artifacts are 350 MB each
    return {
        "smoke": args.smoke,
        "environment": environment(),
        "runtime_settings": settings,
        "protocol": {"warmup": warmup, "iterations": iterations, "statistic": "p50 of alternating merged/dense runs, one process"},
        "rows": rows,
    }


def markdown(result: dict) -> str:
    """One row per model and method: speedup (speedup / FLOPs ratio) per runtime and batch, targets marked."""
    rows = [r for r in result["rows"] if "error" not in r]
    series = list(dict.fromkeys((r["runtime"], r["batch"]) for r in rows))
    names = {"ort": "ORT", "openvino": "OpenVINO"}
    header = "| model | method | GFLOPs (dense) | FLOPs ratio | " + " | ".join(f"{names.get(rt, rt)} b{b}" for rt, b in series) + " |"
    lines = [header, "|---|---|---:|---:|" + "---:|" * len(series)]
    cells = {(r["model"], r["method"], r["runtime"], r["batch"]): r for r in rows}
    for model, method in dict.fromkeys((r["model"], r["method"]) for r in result["rows"]):
        first = next((r for r in rows if (r["model"], r["method"]) == (model, method)), None)
        out = [model.replace("_patch16_224", ""), method]
        out += [f"{first['gflops']:.2f} ({first['dense_gflops']:.2f})", f"{first['flops_ratio']:.2f}x"] if first else ["", ""]
        for runtime, batch in series:
            r = cells.get((model, method, runtime, batch))
            if r is None:
                errors = [x for x in result["rows"] if "error" in x and (x["model"], x["method"], x["runtime"]) == (model, method, runtime)]
                out.append("failed" if errors else "")
                continue
            mark = "" if r["target"] is None else (" ✓" if r["meets_target"] else f" ✗ < {r['target']:.2f}")
            out.append(f"{r['speedup']:.2f}x ({r['efficiency']:.2f}{mark})")
        lines.append("| " + " | ".join(out) + " |")
    dense = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for runtime, batch in series:
            values = sorted(r["dense_p50_ms"] for r in rows if (r["model"], r["runtime"], r["batch"]) == (model, runtime, batch))
            if values:
                short = model.replace("_patch16_224", "")
                dense.append(f"{short} {names.get(runtime, runtime)} b{batch} {values[len(values) // 2]:.0f} ms")
    return "\n".join(lines) + "\n\nDense p50 (median over the runs): " + "; ".join(dense) + "."


def plot(result: dict, out: FileOutput) -> Path | None:
    """Efficiency (speedup / FLOPs ratio) per method, one bar per runtime and batch, one panel per model."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install -e '.[bench]'): no plot")
        return None
    rows = [r for r in result["rows"] if "error" not in r]
    models = list(dict.fromkeys(r["model"] for r in rows))
    series = list(dict.fromkeys((r["runtime"], r["batch"]) for r in rows))
    fig, axes = plt.subplots(len(models), 1, figsize=(12, 3.6 * len(models)), squeeze=False)
    width = 0.8 / max(len(series), 1)
    for ax, model in zip(axes[:, 0], models, strict=True):
        methods = list(dict.fromkeys(r["method"] for r in rows if r["model"] == model))
        efficiency = {(r["method"], r["runtime"], r["batch"]): r["efficiency"] for r in rows if r["model"] == model}
        for k, (runtime, batch) in enumerate(series):
            values = [efficiency.get((m, runtime, batch), 0) for m in methods]
            ax.bar([i + k * width for i in range(len(methods))], values, width, label=f"{runtime}, batch {batch}")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(0.85, color="grey", linestyle="--", linewidth=0.8, label="target 0.85 (batch 8)")
        ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(methods))], methods, rotation=30, ha="right")
        ax.set_ylabel("speedup / FLOPs ratio")
        env = result["environment"]
        ax.set_title(f"{model}: measured speedup over the FLOPs ceiling ({env['cpu']}, {env['cpus_usable']} CPUs)")
        ax.set_ylim(0, 1.2)
    axes[0, 0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    out.save_figure(fig, dpi=110)
    plt.close(fig)
    return out.path


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    if not args.smoke and args.iterations < 10:
        raise SystemExit("--iterations must be >= 10 (medians of fewer alternating runs are too noisy on a shared machine)")
    where = re.sub(r"[^a-z0-9]+", "_", environment()["cpu"].lower()).strip("_")
    path = args.output or ROOT / "benchmarks" / "results" / f"cpu_runtimes_{where}.json"
    writer = "deploytk benchmarks/cpu_runtimes.py"
    out, picture_out = claim_file(path, writer), None if args.smoke else claim_file(path.with_suffix(".png"), writer)  # before the run
    t0 = time.perf_counter()
    result = run(args)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["command"] = " ".join([Path(sys.executable).name, *sys.argv])
    out.write_json(result)
    print(f"wrote {path}")
    if picture_out is not None:
        picture = plot(result, picture_out)
        if picture:
            print(f"wrote {picture}")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
