"""Dense features and token sets on the CPU runtimes: the ready-made output-kind configs, exported, validated and
profiled against the same model without reduction (same outputs) on ONNX Runtime and OpenVINO.

For each config (random weights: latency does not depend on them): `deploytk export --format onnx-inlined`, then
`deploytk validate` on both runtimes (seeded synthetic images, default tolerances), then `deploytk profile` on both
runtimes at batch 1 and at batch 8 (the dense model with the same output alternates with the reduced one in one
process; medians). Every step is a `deploytk` child process, as a user runs it. The exports go to a temporary folder.
Writes benchmarks/results/output_kinds_<cpu>.json and a PNG of the speedups beside it.

    python benchmarks/output_kinds.py                       # ~2 h on a 2-core CPU (four ViT-L/14-336 towers)
    python benchmarks/output_kinds.py --smoke --output /tmp/x.json   # DeiT-Tiny, 2 blocks: does it run
    python benchmarks/output_kinds.py --markdown benchmarks/results/output_kinds_amd_epyc.json   # the table in docs/results/outputs.md
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import cpu_result_output, deploytk, write_result  # noqa: E402
from deploytk.machine import host  # noqa: E402

CONFIGS = (
    "llava15_clip_l336_tome_144_tokens",
    "llava15_clip_l336_tome_64_tokens",
    "dinov2_small_reg_tome_r8_patch_features",
    "dinov2_base_reg_tome_r8_patch_features",
    "llava15_clip_l336_visionzip_64_tokens",
    "llava15_clip_l336_visionzip_192_tokens",
    "dinov2_small_reg_pitome_k96_patch_features",
    "dinov2_base_reg_pitome_k96_patch_features",
)
#: the CPU runtimes every export is validated and profiled on
RUNTIMES = ("ort", "openvino")
SMOKE_CONFIG = """model: deit_tiny_patch16_224
model_kwargs: {depth: 2}
merge: {method: tome, r: 4}
export: {img_size: 64, batch_size: 2, output: tokens, feature_layer: -1, token_map: true}
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default=",".join(CONFIGS), help="names in export_configs/, comma-separated")
    p.add_argument("--images", type=int, default=16, help="synthetic images per validation")
    p.add_argument("--iterations", default="10,4", help="timed runs per model at batch 1 and at batch 8")
    p.add_argument("--smoke", action="store_true", help="DeiT-Tiny, 2 blocks: checks the script, measures nothing of interest.")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None, metavar="JSON", help="Print the table of an earlier run's JSON and exit.")
    return p.parse_args(argv)


def measure(config: Path, folder: Path, images: int, iterations: tuple[int, int]) -> dict:
    out = folder / config.stem
    _, export_seconds = deploytk("export", str(config), "--output", str(out), "--format", "onnx-inlined")
    manifest = json.loads((out / "manifest.json").read_text())
    row = {
        "config": config.stem,
        "model": manifest["model"]["name"],
        "method": manifest["method"]["name"],
        "output": manifest["output"],
        "outputs": manifest["outputs"],
        "gflops": manifest["gflops"],
        "dense_gflops": manifest["dense_gflops"],
        "export_seconds": round(export_seconds, 1),
    }
    for runtime in RUNTIMES:
        result, seconds = deploytk("validate", str(out), "--backend", runtime, "--num-samples", str(images), "--batch-size", "8")
        report = result["reports"][0]  # validate --json: {passed, backends, reports}, one report per backend
        row[f"validate_{runtime}"] = {
            "passed": report["passed"],
            "max_abs_diff": report["max_abs_diff"],
            "cosine_similarity_min": report["cosine_similarity_min"],
            "branch_flips": len(report["branch_flips"]),
            "seconds": round(seconds, 1),
        }
        for batch, runs in zip((1, 8), iterations, strict=True):
            profile, _ = deploytk(
                "profile", str(out), "--backend", runtime, "--batch-sizes", str(batch), "--iterations", str(runs), "--warmup", "1"
            )
            result = profile["results"][0]
            row[f"profile_{runtime}_b{batch}"] = {
                "p50_ms": result["latency_ms"]["p50"],
                "dense_p50_ms": result["dense"]["latency_ms"]["p50"],
                "speedup": result["speedup_vs_dense"],
                "iterations": runs,
            }
    print(json.dumps({k: v for k, v in row.items() if k != "outputs"}), flush=True)
    return row


def _ms(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.2f}"


def markdown(result: dict) -> str:
    """The table in docs/results/outputs.md: one row per config and runtime, batch 1 and 8 (reduced and dense p50, speedup), FLOPs ratio."""
    lines = [
        "| config | output | runtime | validate (max abs diff) | batch 1: p50 ms (dense) | speedup | batch 8: p50 ms (dense) | speedup "
        "| FLOPs ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["configs"]:
        out = row["output"]
        what = f"tokens, K = {out['tokens']}" if out["kind"] == "tokens" else out["kind"]
        for runtime in RUNTIMES:
            check = row[f"validate_{runtime}"]
            cells = [f"`{row['config']}`", what, runtime, f"{'pass' if check['passed'] else 'FAIL'} ({check['max_abs_diff']:.1e})"]
            for batch in (1, 8):
                p = row[f"profile_{runtime}_b{batch}"]
                cells += [f"{_ms(p['p50_ms'])} ({_ms(p['dense_p50_ms'])})", f"{p['speedup']:.2f}x"]
            cells.append(f"{row['dense_gflops'] / row['gflops']:.2f}x")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    """Speedup over the same model without reduction, per config, runtime and batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [f"profile_{r}_b{b}" for r in RUNTIMES for b in (1, 8)]
    fig, ax = plt.subplots(figsize=(9, 3.6), dpi=100)
    width = 0.8 / len(keys)
    for k, key in enumerate(keys):
        ax.bar(
            [i + k * width for i in range(len(rows))], [row[key]["speedup"] for row in rows], width, label=key[8:].replace("_b", ", batch ")
        )
    ax.axhline(1.0, color="gray", lw=0.8)
    names = [textwrap.fill(row["config"].replace("_", " "), 22) for row in rows]
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], names, fontsize=7)
    ax.set_ylabel("speedup vs. no reduction (p50)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": "deploytk benchmarks/output_kinds.py"})
    plt.close(fig)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return
    iterations = tuple(int(v) for v in args.iterations.split(","))
    out = cpu_result_output("output_kinds", "output_kinds.py", args.output)
    with tempfile.TemporaryDirectory(prefix="deploytk-outputs-") as folder:
        if args.smoke:
            smoke = Path(folder) / "smoke_tokens.yaml"
            smoke.write_text(SMOKE_CONFIG)
            configs = [smoke]
        else:
            configs = [ROOT / "export_configs" / f"{name}.yaml" for name in args.configs.split(",")]
        rows = [measure(c, Path(folder), args.images, iterations) for c in configs]
    result = {"smoke": args.smoke, "environment": host(), "images": args.images, "configs": rows}
    path = write_result(out, result)
    plot(rows, path.with_suffix(".png"))
    print(markdown(result))


if __name__ == "__main__":
    main()
