"""Export time and peak memory of large ViTs (ViT-L/16, ViT-H/14), and that their exports validate.

Each model (random weights: neither time nor memory depends on them) is exported with ToMe r=8
in fp32 by `deploytk export --json` in a child process, whose peak resident memory is read
from the kernel (``os.wait4``'s ``ru_maxrss``); then `deploytk validate` on ONNX Runtime and
on OpenVINO (2 seeded images each) checks it against the PyTorch reference, each in a child
process. Both models' fp32 weights pass 1 GiB, so their exports keep them in ``model.onnx.data``
beside ``model.onnx`` (ViT-H's 2.5 GB are past protobuf's 2 GiB limit). The exports go to a temporary folder and are
removed. Writes benchmarks/results/export_large_<cpu>.json and prints the table of docs/results/index.md.

    python benchmarks/export_large.py                          # ~6 min on a 2-core CPU, ~16 GB of memory
    python benchmarks/export_large.py --markdown benchmarks/results/export_large_amd_epyc.json   # an earlier run's table
    python benchmarks/export_large.py --smoke --output /tmp/x.json   # DeiT-Tiny: does it run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import cpu_result_output, exponent, write_result  # noqa: E402
from deploytk.machine import host  # noqa: E402

#: the CPU runtimes each export is validated on (`deploytk validate --backend`)
VALIDATED_ON = ("ort", "openvino")
#: how the table names a model (others by their timm name)
SHORT_NAMES = {"vit_large_patch16_224": "ViT-L/16", "vit_huge_patch14_224": "ViT-H/14", "deit_tiny_patch16_224": "DeiT-Ti/16"}
RUNTIME_NAMES = {"ort": "ORT", "openvino": "OpenVINO"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="vit_large_patch16_224,vit_huge_patch14_224")
    p.add_argument("--r", type=int, default=8)
    p.add_argument("--smoke", action="store_true", help="DeiT-Tiny, 2 blocks: checks the script, measures nothing of interest.")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None, metavar="JSON", help="Print the table of an earlier run's JSON and exit.")
    return p.parse_args(argv)


def run_child(args: list[str]) -> tuple[subprocess.CompletedProcess, float, float]:
    """(the finished `deploytk ...` process, wall seconds, its peak resident memory in GiB from ``os.wait4``)."""
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", "from deploytk.cli import main; main()", *args], stdout=stdout, stderr=stderr)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0)
        stderr.seek(0)
        done = subprocess.CompletedProcess(args, proc.returncode, stdout.read(), stderr.read())
    return done, seconds, usage.ru_maxrss / 2**20  # KiB on Linux


def measure(model: str, r: int, folder: Path, depth: int | None = None) -> dict:
    config = folder / f"{model}.yaml"
    kwargs = f"model_kwargs: {{depth: {depth}}}\n" if depth else ""
    config.write_text(f"model: {model}\n{kwargs}export: {{batch_size: 1}}\nmerge: {{method: tome, r: {r}}}\n")
    out = folder / model
    export, seconds, peak = run_child(["export", str(config), "--output", str(out), "--json"])
    if export.returncode != 0:
        raise SystemExit(f"export of {model} failed:\n{export.stderr[-3000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    data = manifest["onnx"].get("external_data")
    validations = {}
    for backend in VALIDATED_ON:
        args = ["validate", str(out), "--backend", backend, "--num-samples", "2", "--batch-size", "1", "--json"]
        done, done_seconds, done_peak = run_child(args)
        report = json.loads(done.stdout)["reports"][0] if done.stdout.strip() else {}
        validations[f"validate_{backend}"] = {
            "passed": done.returncode == 0,
            "seconds": round(done_seconds, 1),
            "peak_rss_gib": round(done_peak, 2),
            "max_abs_diff": report.get("max_abs_diff"),
            "error": None if done.returncode == 0 else done.stderr.strip().splitlines()[-1][:300] if done.stderr.strip() else "(none)",
        }
    row = {
        "model": model,
        "tokens_per_layer": manifest["schedule"]["tokens_per_layer"],
        "gflops": manifest["gflops"],
        "dense_gflops": manifest["dense_gflops"],
        "export_seconds": round(seconds, 1),
        "torch_onnx_export_seconds": manifest["onnx"]["export_seconds"],
        "export_peak_rss_gib": round(peak, 2),
        "model_onnx_mb": round((out / "model.onnx").stat().st_size / 1e6, 1),
        "external_data_mb": round((out / data["file"]).stat().st_size / 1e6, 1) if data else None,
        **validations,
    }
    print(json.dumps(row), flush=True)
    return row


def markdown(result: dict) -> str:
    """One row per model: its external-data file, the export's time and peak memory, each validation's."""
    names = " / ".join(RUNTIME_NAMES.get(b, b) for b in VALIDATED_ON)
    lines = [
        "| model | weights (`model.onnx.data`) | `deploytk export` | export peak memory "
        f"| `validate` {names} (2 images) | max abs diff {names} |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["models"]:
        tokens = row["tokens_per_layer"]
        model = f"{SHORT_NAMES.get(row['model'], row['model'])} ({len(tokens)} blocks, {tokens[0]} -> {tokens[-1]} tokens)"
        weights = "none (in `model.onnx`)" if row["external_data_mb"] is None else f"{row['external_data_mb']:.0f} MB"
        runs = [row[f"validate_{b}"] for b in VALIDATED_ON]
        verdict = (
            "pass"
            if all(v["passed"] for v in runs)
            else ", ".join(
                f"{RUNTIME_NAMES.get(b, b)} {'pass' if v['passed'] else 'FAIL'}" for b, v in zip(VALIDATED_ON, runs, strict=True)
            )
        )
        validate = (
            " / ".join(f"{v['seconds']:.1f} s" for v in runs)
            + f", {verdict} (peak "
            + " / ".join(f"{v['peak_rss_gib']:.2f}" for v in runs)
            + " GiB)"
        )
        diffs = " / ".join("-" if v["max_abs_diff"] is None else exponent(v["max_abs_diff"]) for v in runs)
        lines.append(
            f"| {model} | {weights} | {row['export_seconds']:.1f} s | {row['export_peak_rss_gib']:.2f} GiB | {validate} | {diffs} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return
    models = ["deit_tiny_patch16_224"] if args.smoke else args.models.split(",")
    out = cpu_result_output("export_large", "export_large.py", args.output)
    with tempfile.TemporaryDirectory(prefix="deploytk-large-") as folder:
        rows = [measure(m, args.r, Path(folder), depth=2 if args.smoke else None) for m in models]
    result = {"smoke": args.smoke, "environment": host(), "r": args.r, "models": rows}
    write_result(out, result)
    print(markdown(result))


if __name__ == "__main__":
    main()
