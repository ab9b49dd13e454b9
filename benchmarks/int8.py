"""INT8 stacked on token reduction, on the CPU runtimes: dense fp32, dense int8, reduced fp32 and reduced int8 of one
model, timed alternating in one process, at batch 1 and 8, on OpenVINO and ONNX Runtime.

For each config (random weights: latency does not depend on them): `deploytk export --format onnx-inlined`, then
`deploytk quantize --backend openvino`, `--backend ort` and `--backend trt` (seeded synthetic calibration: no real
ImageNet data here), then `deploytk validate` of each int8 artifact on its runtime with the int8 defaults (trt's on ONNX
Runtime: TensorRT does not run here). Every step is a `deploytk` child process, as a user runs it. Then, per runtime,
the four models are loaded through the backends (`load_for_timing` of the fp32 and of the int8 artifact: the int8
dense baseline is the one `quantize` made with the same data and rules) and timed round-robin: one run of each, over
and over, after a warm-up; medians. Writes benchmarks/results/int8_<cpu>.json and a PNG beside it.

    python benchmarks/int8.py                                # DeiT-S ToMe / MCTF / EViT, DeiT-B ToMe (~1.5 h on 2 cores)
    python benchmarks/int8.py --smoke --output /tmp/x.json   # DeiT-Tiny, 2 blocks: does it run
    python benchmarks/int8.py --markdown benchmarks/results/int8_amd_epyc.json   # the table in docs/results/int8.md
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import cpu_result_output, deploytk, write_result  # noqa: E402
from deploytk.backends import get_backend  # noqa: E402
from deploytk.exporter.artifacts import Artifact  # noqa: E402
from deploytk.machine import host  # noqa: E402

CONFIGS = ("deit_small_tome_r16", "deit_small_mctf_r16", "deit_small_evit_k70", "deit_base_tome_r16")
#: quantize --backend X, and the backend its artifact is validated and timed on (trt: validated only)
RUNTIMES = {"openvino": "openvino", "ort": "ort", "trt": "ort"}
TIMED = ("openvino", "ort")
MODELS = ("dense_fp32", "dense_int8", "reduced_fp32", "reduced_int8")
SMOKE_CONFIG = """model: deit_tiny_patch16_224
model_kwargs: {depth: 2}
merge: {method: tome, r: 4}
export: {img_size: 64, batch_size: 2}
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default=",".join(CONFIGS), help="names in export_configs/, comma-separated")
    p.add_argument("--calibration", type=int, default=64, help="seeded synthetic calibration images (quantize --synthetic)")
    p.add_argument("--images", type=int, default=32, help="synthetic images per validation")
    p.add_argument("--iterations", default="12,6", help="timed rounds (one run of each model) at batch 1 and at batch 8")
    p.add_argument("--warmup", type=int, default=2, help="warm-up rounds per batch size")
    p.add_argument("--smoke", action="store_true", help="DeiT-Tiny, 2 blocks: checks the script, measures nothing of interest.")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None, metavar="JSON", help="Print the table of an earlier run's JSON and exit.")
    return p.parse_args(argv)


def time_round_robin(models: dict, batch: int, warmup: int, rounds: int) -> dict:
    """p50 ms of each model at ``batch``: one run of each in turn, ``rounds`` times, after ``warmup`` rounds."""
    timers = {name: model.timer(batch) for name, model in models.items()}
    for _ in range(warmup):
        for timer in timers.values():
            timer()
    seconds = {name: [] for name in timers}
    for _ in range(rounds):
        for name, timer in timers.items():
            seconds[name].append(timer())
    return {name: round(float(np.median(s)) * 1e3, 3) for name, s in seconds.items()}


def measure(config: Path, folder: Path, args) -> dict:
    fp32 = folder / config.stem
    deploytk("export", str(config), "--output", str(fp32), "--format", "onnx-inlined")
    manifest = json.loads((fp32 / "manifest.json").read_text())
    row = {
        "config": config.stem,
        "model": manifest["model"]["name"],
        "method": manifest["method"]["name"],
        "gflops": manifest["gflops"],
        "dense_gflops": manifest["dense_gflops"],
    }
    for runtime, backend in RUNTIMES.items():
        out = folder / f"{config.stem}-int8-{runtime}"
        t0 = time.perf_counter()
        q, _ = deploytk("quantize", str(fp32), "--backend", runtime, "--synthetic", str(args.calibration), "--output", str(out))
        seconds = time.perf_counter() - t0
        result, _ = deploytk("validate", str(out), "--backend", backend, "--num-samples", str(args.images))
        report = result["reports"][0]  # validate --json: {passed, backends, reports}, one report per backend
        row[f"int8_{runtime}"] = {
            "quantize_seconds": round(seconds, 1),
            "quantized_ops": q["quantization"]["quantized_ops"],
            "validated_on": backend,
            "passed": report["passed"],
            "checks": report["checks"],
            "cosine_similarity_mean": report["cosine_similarity_mean"],
            "cosine_similarity_min": report["cosine_similarity_min"],
            "top1_agreement": report["top1_agreement"],
            "images_with_other_choices": report["choices"]["images_with_other_choices"],
        }
    iterations = [int(v) for v in args.iterations.split(",")]
    for runtime in TIMED:
        backend = get_backend(runtime)
        reduced_fp32, dense_fp32 = backend.load_for_timing(Artifact.open(fp32), [1, 8])
        reduced_int8, dense_int8 = backend.load_for_timing(Artifact.open(folder / f"{config.stem}-int8-{runtime}"), [1, 8])
        models = {"dense_fp32": dense_fp32, "dense_int8": dense_int8, "reduced_fp32": reduced_fp32, "reduced_int8": reduced_int8}
        for batch, rounds in zip((1, 8), iterations, strict=True):
            ms = time_round_robin(models, batch, args.warmup, rounds)
            row[f"{runtime}_b{batch}"] = {
                "p50_ms": ms,
                "rounds": rounds,
                "reduced_int8_vs_dense_fp32": round(ms["dense_fp32"] / ms["reduced_int8"], 3),
                "reduced_int8_vs_dense_int8": round(ms["dense_int8"] / ms["reduced_int8"], 3),
                "reduced_int8_vs_reduced_fp32": round(ms["reduced_fp32"] / ms["reduced_int8"], 3),
                "reduced_fp32_vs_dense_fp32": round(ms["dense_fp32"] / ms["reduced_fp32"], 3),
                "dense_int8_vs_dense_fp32": round(ms["dense_fp32"] / ms["dense_int8"], 3),
            }
        del models, reduced_fp32, dense_fp32, reduced_int8, dense_int8
    print(json.dumps(row), flush=True)
    return row


def markdown(result: dict) -> str:
    """The table in docs/results/int8.md: per config, runtime and batch, the four p50s and the ratios the issue asks for."""
    lines = [
        "| config | runtime | batch | p50 ms: dense fp32 / dense int8 / reduced fp32 / reduced int8 | reduced int8 vs dense fp32 "
        "| vs dense int8 | vs reduced fp32 | int8 validate (mean cosine, top-1 agreement) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["configs"]:
        for runtime in TIMED:
            check = row[f"int8_{runtime}"]
            passed = "pass" if check["passed"] else "FAIL"
            verdict = f"{passed} ({check['cosine_similarity_mean']:.4f}, {100 * check['top1_agreement']:.0f}%)"
            for batch in (1, 8):
                t = row[f"{runtime}_b{batch}"]
                ms = " / ".join(f"{t['p50_ms'][m]:.1f}" for m in MODELS)
                lines.append(
                    f"| `{row['config']}` | {runtime} | {batch} | {ms} | {t['reduced_int8_vs_dense_fp32']:.2f}x "
                    f"| {t['reduced_int8_vs_dense_int8']:.2f}x | {t['reduced_int8_vs_reduced_fp32']:.2f}x | {verdict} |"
                )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    """Throughput relative to dense fp32, per config, runtime and batch, for the three other models."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(TIMED), figsize=(11, 3.8), dpi=100, sharey=True)
    for ax, runtime in zip(axes, TIMED, strict=True):
        groups = [(row, b) for row in rows for b in (1, 8)]
        width = 0.27
        for k, model in enumerate(MODELS[1:]):
            values = [row[f"{runtime}_b{b}"]["p50_ms"]["dense_fp32"] / row[f"{runtime}_b{b}"]["p50_ms"][model] for row, b in groups]
            ax.bar([i + k * width for i in range(len(groups))], values, width, label=model.replace("_", " "))
        ax.axhline(1.0, color="gray", lw=0.8)
        names = [textwrap.fill(f"{row['config'].replace('_', ' ')} b{b}", 16) for row, b in groups]
        ax.set_xticks([i + width for i in range(len(groups))], names, fontsize=6)
        ax.set_title(runtime, fontsize=9)
    axes[0].set_ylabel("speedup vs. dense fp32 (p50)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": "deploytk benchmarks/int8.py"})
    plt.close(fig)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return
    out = cpu_result_output("int8", "int8.py", args.output)
    with tempfile.TemporaryDirectory(prefix="deploytk-int8-") as folder:
        if args.smoke:
            smoke = Path(folder) / "smoke.yaml"
            smoke.write_text(SMOKE_CONFIG)
            configs = [smoke]
        else:
            configs = [ROOT / "export_configs" / f"{name}.yaml" for name in args.configs.split(",")]
        rows = [measure(c, Path(folder), args) for c in configs]
    result = {"smoke": args.smoke, "environment": host(), "calibration": f"{args.calibration} seeded synthetic images", "configs": rows}
    path = write_result(out, result)
    plot(rows, path.with_suffix(".png"))
    print(markdown(result))


if __name__ == "__main__":
    main()
