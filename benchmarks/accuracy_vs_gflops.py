"""Accuracy vs GFLOPs of every digits-ViT config: top-1/top-5 of the merged PyTorch reference and of ONNX Runtime.

For each ``export_configs/digits_vit_*.yaml`` (a glob, so new configs are picked up) this runs
the ``deploytk eval`` harness on the digits val split (450 images; written to a temporary
directory unless ``--data`` names an ImageFolder split) and writes

- ``benchmarks/results/digits_accuracy_vs_gflops.json``: per config the merge settings as in
  the config, GFLOPs, dense GFLOPs, top-1/top-5 (dense, reference, ORT), ORT-vs-reference
  agreement, timings; plus device, versions and the command;
- ``benchmarks/results/digits_accuracy_vs_gflops.png``: top-1 (ORT) vs GFLOPs, one marker per method;

and prints the markdown table of docs/results/accuracy.md. Needs the ``bench`` extra (matplotlib).

    .venv/bin/python benchmarks/accuracy_vs_gflops.py
    .venv/bin/python benchmarks/accuracy_vs_gflops.py --markdown benchmarks/results/digits_accuracy_vs_gflops.json  # an earlier run
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from deploytk.files import FileOutput, claim_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"
STEM = "digits_accuracy_vs_gflops"
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "h"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="export_configs/digits_vit_*.yaml", help="Glob, relative to the repository root.")
    p.add_argument(
        "--data", type=Path, default=None, help="ImageFolder split to evaluate (default: the digits val split, written to a temp dir)."
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--limit", type=int, default=None, help="Evaluate only N images per config.")
    p.add_argument("--output-dir", type=Path, default=RESULTS)
    p.add_argument("--markdown", type=Path, default=None, metavar="JSON", help="Print the table of an earlier run's JSON and exit.")
    return p.parse_args(argv)


def versions() -> dict:
    from deploytk.exporter.manifest import package_versions

    out = package_versions()
    for name in ("numpy", "scikit-learn", "pillow", "matplotlib"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def resolve_checkpoint(cfg):
    """Config checkpoints are relative to the repository root; make them absolute."""
    if cfg.checkpoint and not Path(cfg.checkpoint).is_absolute():
        return cfg.model_copy(update={"checkpoint": str(ROOT / cfg.checkpoint)})
    return cfg


def merge_as_written(path: Path) -> dict:
    """The config file's own `merge:` section (only the keys it sets), for labels and the table."""
    import yaml

    return (yaml.safe_load(path.read_text()) or {}).get("merge") or {}


def settings_text(merge: dict) -> str:
    parts = [f"{k}={json.dumps(v)}" for k, v in merge.items() if k not in ("method", "options")]
    options = dict(merge.get("options") or {})
    calibration = options.pop("calibration", None)
    if options:
        parts.append(f"options={json.dumps(options)}")
    if calibration:  # the full record is in the config and the JSON; the table names the statistic
        parts.append(f"calibrated: q={calibration['quantile']} over {calibration['images']} images")
    return ", ".join(parts) or "(defaults)"


def row_of(path: Path, report: dict, merge: dict) -> dict:
    return {
        "config": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
        "label": path.stem.removeprefix("digits_vit_"),
        "model": report["model"],
        "model_kwargs": report["model_kwargs"],
        "method": report["method"],
        "merge": merge,  # as written in the config file
        "merge_resolved": report["merge"],  # with the schema's defaults
        "gflops": report["gflops"],
        "dense_gflops": report["dense_gflops"],
        "flop_reduction": round(report["dense_gflops"] / report["gflops"], 4),
        "tokens_per_layer": report["tokens_per_layer"],
        "tokens_out": report["tokens_out"],
        "num_images": report["num_images"],
        "top1": {"dense": report["dense"]["top1"], "reference": report["reference"]["top1"], "ort": report["exported"]["top1"]},
        "top5": {"dense": report["dense"]["top5"], "reference": report["reference"]["top5"], "ort": report["exported"]["top5"]},
        "agreement": report["agreement"],
        "reference_vs_dense_agreement": report["reference_vs_dense_agreement"],
        "seconds": report["seconds"],
    }


def plot(rows: list[dict], out: FileOutput, title: str) -> None:
    """One marker and colour per method; learned methods (each its own fine-tuned model) hollow;
    config names only where a method has several points; the legend beside the axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from deploytk.reducers import get_method

    fig, ax = plt.subplots(figsize=(9.0, 5.0), dpi=120)
    colours = plt.get_cmap("tab20").colors
    methods = sorted({r["method"] for r in rows})
    for i, method in enumerate(methods):
        pts = sorted((r for r in rows if r["method"] == method), key=lambda r: r["gflops"])
        learned = get_method(method).learned
        colour = colours[(2 * i) % 20 if i < 10 else (2 * i + 1) % 20]
        ax.plot(
            [r["gflops"] for r in pts],
            [100 * r["top1"]["ort"] for r in pts],
            marker=MARKERS[i % len(MARKERS)],
            markersize=7,
            color=colour,
            markerfacecolor="none" if learned else colour,
            linestyle="-",
            label=f"{method}{' (fine-tuned)' if learned else ''}",
        )
        if len(pts) > 1:  # name the configs; those at the same point (precisions of one schedule) share a label
            at: dict[tuple[float, float], list[str]] = {}
            for r in pts:
                at.setdefault((r["gflops"], 100 * r["top1"]["ort"]), []).append(r["label"])
            for xy, labels in at.items():
                ax.annotate(" / ".join(labels), xy, textcoords="offset points", xytext=(5, -10), fontsize=7)
    dense = {(r["dense_gflops"], r["top1"]["dense"]) for r in rows if not get_method(r["method"]).learned}
    for j, (g, t) in enumerate(sorted(dense)):
        ax.scatter([g], [100 * t], marker="*", s=160, color="black", zorder=3, label="dense (unmerged timm)" if j == 0 else None)
    ax.set_xlabel("GFLOPs per image (fvcore convention)")
    ax.set_ylabel("val top-1 (%), ONNX Runtime")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    out.save_figure(fig)
    plt.close(fig)


def markdown(result: dict) -> str:
    """One row per config, as the run sorted them (most GFLOPs first); docs/results/accuracy.md holds it verbatim."""
    lines = [
        "| config | method | settings (as in the config) | GFLOPs | dense GFLOPs | top-1 reference | top-1 ORT "
        "| top-5 reference | top-5 ORT | ORT = reference top-1 |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["results"]:
        lines.append(
            f"| `{Path(r['config']).name}` | {r['method']} | {settings_text(r['merge'])} | {r['gflops']:.4f} | {r['dense_gflops']:.4f} | "
            f"{100 * r['top1']['reference']:.2f}% | {100 * r['top1']['ort']:.2f}% | {100 * r['top5']['reference']:.2f}% | "
            f"{100 * r['top5']['ort']:.2f}% | {100 * r['agreement']:.2f}% |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    import torch
    from rich.console import Console

    from deploytk.cli.render import RichProgress
    from deploytk.config import load_config
    from deploytk.errors import DeploytkError
    from deploytk.evaluation.accuracy import evaluate
    from deploytk.evaluation.digits import write_digits_imagefolder
    from deploytk.machine import host

    console = Console(stderr=True, highlight=False)
    configs = sorted(ROOT.glob(args.configs))
    if not configs:
        print(f"error: no config matches {args.configs!r} under {ROOT}", file=sys.stderr)
        return 2
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, ROOT), *(sys.argv[1:] if argv is None else argv)])
    try:  # claimed before any work: a file deploytk did not write is refused
        out_json, out_png = (
            claim_file(args.output_dir / f"{STEM}{suffix}", "deploytk benchmarks/accuracy_vs_gflops.py") for suffix in (".json", ".png")
        )
    except DeploytkError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rows, reports = [], []
    try:
        with tempfile.TemporaryDirectory(prefix="digits-bench-") as tmp:
            if args.data is None:
                img_size = load_config(configs[0]).export.img_size
                data = write_digits_imagefolder(Path(tmp) / "digits", img_size=img_size)["root"]
                data = Path(data) / "val"
                data_desc = f"digits val split (sklearn load_digits, stratified 25 %, random_state=0), {img_size}x{img_size}"
            else:
                data, data_desc = args.data.resolve(), str(args.data)
            for path in configs:
                cfg = resolve_checkpoint(load_config(path))
                console.print(f"[cyan]{path.relative_to(ROOT)}[/]: {settings_text(merge_as_written(path))}")
                with RichProgress() as progress:
                    name = str(path.relative_to(ROOT))
                    report = evaluate(cfg, data, batch_size=args.batch_size, num_samples=args.limit, config_name=name, progress=progress)
                reports.append(report)
                rows.append(row_of(path, report, merge_as_written(path)))
    except DeploytkError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rows.sort(key=lambda r: -r["gflops"])
    result = {
        "benchmark": "digits ViT: accuracy vs GFLOPs of token-merging configs (PyTorch reference and ONNX Runtime CPU)",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "data": {
            "description": data_desc,
            "num_images": reports[0]["num_images"],
            "classes": reports[0]["classes"],
            "limit": args.limit,
            "batch_size": args.batch_size,
            "one_image_is_percentage_points": round(100 / reports[0]["num_images"], 4),
        },
        "device": {
            **host(),
            "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        },
        "versions": versions(),
        "results": rows,
    }
    out_json.write_json(result)
    plot(rows, out_png, f"digits ViT ({reports[0]['num_images']} val images): top-1 vs GFLOPs")
    print(markdown(result))
    print(f"\nwrote {out_json.path} and {out_png.path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
