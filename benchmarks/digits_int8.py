"""Digits ViT top-1 at fp32 and INT8, for every method's fp32 digits config: does int8 stacked on merging keep accuracy?

For each ``export_configs/digits_vit_*.yaml`` exported in fp32: `deploytk quantize --backend ort` and `--backend
openvino`, calibrated on the digits training split (``--num-images`` of its 1347 images, the family's preprocessing),
then top-1 on the held-out split (450 images) of the fp32 graph on ONNX Runtime and of each int8 artifact on its
runtime, and `deploytk validate` of each int8 artifact on 64 held-out images with the int8 defaults. Configs exported
in fp16 / bf16 are skipped (quantization starts from fp32). The artifacts go to a temporary folder. Writes
benchmarks/results/digits_int8_accuracy.json and prints the table.

    python benchmarks/digits_int8.py                 # every fp32 digits config (~40 min on 2 cores)
    python benchmarks/digits_int8.py --configs 'export_configs/digits_vit_tome_r4.yaml' --output /tmp/x.json
    python benchmarks/digits_int8.py --markdown benchmarks/results/digits_int8_accuracy.json   # the table in docs/results/int8.md
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, write_result  # noqa: E402
from deploytk.config import apply_overrides, load_config  # noqa: E402
from deploytk.data import folder_batches  # noqa: E402
from deploytk.errors import DeploytkError  # noqa: E402
from deploytk.evaluation.accuracy import exported_accuracy, scan_image_folder  # noqa: E402
from deploytk.evaluation.digits import write_digits_imagefolder  # noqa: E402
from deploytk.exporter.pipeline import run_export  # noqa: E402
from deploytk.files import claim_file  # noqa: E402
from deploytk.machine import host  # noqa: E402
from deploytk.models import build_reference  # noqa: E402
from deploytk.quantize import QUANTIZERS, run_quantize  # noqa: E402
from deploytk.validate.validator import Tolerances, validate  # noqa: E402

#: the runtimes whose int8 is evaluated (trt's Q/DQ graph is ort's numerics with symmetric activations)
INT8 = ("ort", "openvino")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="export_configs/digits_vit_*.yaml", help="glob, relative to the repository root")
    p.add_argument("--num-images", type=int, default=300, help="calibration images from the training split")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None, metavar="JSON", help="Print the table of an earlier run's JSON and exit.")
    return p.parse_args(argv)


def measure(path: Path, folder: Path, digits: Path, calibration: int) -> dict | None:
    cfg = load_config(path)
    if cfg.export.precision != "fp32":
        print(f"skipped {path.name}: exported in {cfg.export.precision}", flush=True)
        return None
    cfg = apply_overrides(cfg, checkpoint=str(ROOT / cfg.checkpoint) if cfg.checkpoint else None)
    fp32 = folder / path.stem
    manifest = run_export(cfg, fp32)
    val = scan_image_folder(digits / "val")
    row = {
        "config": path.stem,
        "method": manifest["method"]["name"],
        "gflops": manifest["gflops"],
        "top1": {"fp32_ort": exported_accuracy(fp32, val, backend="ort")["top1"]},
        "validate": {},
        "quantize_seconds": {},
    }
    family = build_reference(cfg).family
    held_out = folder_batches(digits / "val", 64, 8, family.eval_transform(), family.input_kind)
    for runtime in INT8:
        out = folder / f"{path.stem}-int8-{runtime}"
        t0 = time.perf_counter()
        try:
            run_quantize(fp32, runtime, data=digits / "train", num_samples=calibration, output=out)
        except DeploytkError as err:  # a refusal is a result: the table says which config a runtime cannot take, and why
            row["top1"][f"int8_{runtime}"] = None
            row["validate"][runtime] = {"refused": str(err)}
            continue
        row["quantize_seconds"][runtime] = round(time.perf_counter() - t0, 1)
        backend = QUANTIZERS[runtime].backend
        row["top1"][f"int8_{runtime}"] = exported_accuracy(out, val, backend=backend)["top1"]
        report = validate(out, backend, held_out, Tolerances.for_precision("int8"))
        row["validate"][runtime] = {
            "passed": report.passed,
            "cosine_similarity_mean": report.cosine_similarity_mean,
            "top1_agreement": report.top1_agreement,
            "images_with_other_choices": report.choices.get("images_with_other_choices"),
            "failed_checks": [k for k, v in report.checks.items() if not v],
        }
    print(json.dumps(row), flush=True)
    return row


def markdown(result: dict) -> str:
    lines = [
        "| config | method | GFLOPs | top-1 fp32 (ORT) | top-1 int8 ORT | top-1 int8 OpenVINO | int8 validate ORT / OpenVINO |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in result["configs"]:
        t = r["top1"]
        checks = " / ".join(
            "refused" if "refused" in r["validate"][rt] else "pass" if r["validate"][rt]["passed"] else "FAIL" for rt in INT8
        )
        cells = [f"{100 * t[k]:.2f}%" if t[k] is not None else "refused" for k in ("fp32_ort", "int8_ort", "int8_openvino")]
        lines.append(f"| `{r['config']}` | {r['method']} | {r['gflops']:.4f} | {' | '.join(cells)} | {checks} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return
    out = claim_file(args.output or RESULTS / "digits_int8_accuracy.json", "deploytk benchmarks/digits_int8.py")
    configs = sorted(ROOT.glob(args.configs))
    with tempfile.TemporaryDirectory(prefix="deploytk-digits-int8-") as tmp:
        folder = Path(tmp)
        digits = Path(write_digits_imagefolder(folder / "digits", img_size=32)["root"])
        rows = [r for r in (measure(p, folder, digits, args.num_images) for p in configs) if r is not None]
    result = {
        "environment": host(),
        "data": "digits: calibration on the training split, top-1 on the 450 held-out images (one image = 0.22 points)",
        "calibration_images": args.num_images,
        "configs": rows,
    }
    write_result(out, result)
    print(markdown(result))


if __name__ == "__main__":
    main()
