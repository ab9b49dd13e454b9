"""fp16 and bf16 graphs against the fp32 reference: the figures of docs/results/index.md's "fp16 and bf16" section.

Each row exports a shipped config (with its overrides) into a temporary folder and runs `validate` on ONNX Runtime's
CPU provider against the fp32 PyTorch reference, with the precision's default tolerances: the trained digits ViT on
64 validation digits (scikit-learn's digits written as an image folder, through the family's eval transform, as
tests/export/test_precision.py does), ToMe r=4 in fp16 and bf16 (bf16 emulated: the CPU provider has no bf16 kernels),
ToMe r=16 in fp16 and MCTF r=4 in fp16; then MCTF r=4 fp16 on 64 seeded synthetic noise images, and DeiT-S ToMe r=16
fp16 with random weights (near-tie logits) on 64 synthetic images. Per row: max abs diff, min cosine, top-1 agreement,
top-1 flips (and how many the tolerance explains), near-tie branch flips (a matching choice that flipped, proven by
replaying the reference with the runtime's choices), the matching decisions that flipped (one per token per matching op
per image: what `max_flipped_choices` bounds) and the min cosine against that replayed reference. Writes
benchmarks/results/precision_<cpu>.json and prints the table.

    python benchmarks/precision.py                 # every row (~2 min on 2 cores)
    python benchmarks/precision.py --rows tome_r4_fp16,tome_r4_bf16
    python benchmarks/precision.py --markdown benchmarks/results/precision_amd_epyc.json   # the table in docs/results/index.md
    python benchmarks/precision.py --smoke --output /tmp/x.json   # two digits rows on 16 images: does it run
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

from benchmarks.common import cpu_result_output, exponent, write_result  # noqa: E402
from deploytk.machine import host  # noqa: E402

#: key -> (config stem, overrides, images, the table's label). Images: "digits" (validation digits) or "synthetic"
ROWS = {
    "tome_r4_fp16": ("digits_vit_tome_r4_fp16", {}, "digits", "digits ViT, ToMe r=4, fp16"),
    "tome_r16_fp16": ("digits_vit_tome_r4_fp16", {"r": 16}, "digits", "digits ViT, ToMe r=16, fp16"),
    "tome_r4_bf16": ("digits_vit_tome_r4_bf16", {}, "digits", "digits ViT, ToMe r=4, bf16 (emulated)"),
    "mctf_r4_fp16": ("digits_vit_mctf_r4", {"precision": "fp16"}, "digits", "digits ViT, MCTF r=4, fp16"),
    "mctf_r4_fp16_noise": ("digits_vit_mctf_r4", {"precision": "fp16"}, "synthetic", "digits ViT, MCTF r=4, fp16"),
    "deit_s_tome_r16_fp16": ("deit_small_tome_r16", {"precision": "fp16"}, "synthetic", "DeiT-S (random weights), ToMe r=16, fp16"),
}
SMOKE_ROWS = ("tome_r4_fp16", "tome_r4_bf16")
IMAGE_NAMES = {"digits": "validation digits", "synthetic": "synthetic noise"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of: {', '.join(ROWS)}")
    p.add_argument("--num-images", type=int, default=64, help="images per row, in batches of 8")
    p.add_argument("--smoke", action="store_true", help=f"{', '.join(SMOKE_ROWS)} on 16 images: checks the script.")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None, metavar="JSON", help="Print the table of an earlier run's JSON and exit.")
    args = p.parse_args(argv)
    args.rows = list(SMOKE_ROWS) if args.smoke else [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown:
        p.error(f"unknown row(s) {', '.join(unknown)}; choose from {', '.join(ROWS)}")
    if args.smoke:
        args.num_images = 16
    return args


def r_per_block(tokens: list[int]) -> list[int]:
    """The r of every block but the last, from the tokens entering each block (ToMe caps r at half the tokens, so r=16
    on the digits ViT's 65 tokens runs as 16,16,16,8,4,2,1,0,...)."""
    return [a - b for a, b in zip(tokens, tokens[1:], strict=False)]


def measure(key: str, folder: Path, digits: Path | None, num_images: int) -> dict:
    from deploytk.config import apply_overrides, load_config
    from deploytk.data import folder_batches, synthetic_batches
    from deploytk.exporter.pipeline import run_export
    from deploytk.models import build_reference
    from deploytk.validate.validator import Tolerances, validate

    stem, overrides, images, label = ROWS[key]
    cfg = load_config(ROOT / "export_configs" / f"{stem}.yaml")
    cfg = apply_overrides(cfg, checkpoint=str(ROOT / cfg.checkpoint) if cfg.checkpoint else None, **overrides)
    out = folder / key
    t0 = time.perf_counter()
    manifest = run_export(cfg, out)
    export_seconds = time.perf_counter() - t0
    family = build_reference(cfg).family
    if images == "digits":
        batches = folder_batches(digits / "val", num_images, 8, family.eval_transform(), family.input_kind)
    else:
        batches = synthetic_batches(num_images, 8, family.input_kind)
    precision = cfg.export.precision
    tol = Tolerances.for_precision(precision)
    t0 = time.perf_counter()
    report = validate(out, "ort", batches, tol)
    seconds = time.perf_counter() - t0
    tokens = manifest["schedule"]["tokens_per_layer"]
    flips = report.branch_flips
    row = {
        "row": key,
        "label": label,
        "config": stem,
        "overrides": overrides,
        "precision": precision,
        "images": images,
        "num_images": report.num_images,
        "tokens_per_layer": tokens,
        "passed": report.passed,
        "max_abs_diff": report.max_abs_diff,
        "cosine_similarity_min": report.cosine_similarity_min,
        "top1_agreement": report.top1_agreement,
        "top1_flips": len(report.top1_flips),
        "top1_flips_within_tolerance": report.top1_flips_within_tolerance,
        "branch_flips": len(flips),
        "branch_flips_explained": sum(f["explained"] for f in flips),
        "cosine_similarity_min_replayed": report.same_branch["cosine_similarity_min"] if report.same_branch else None,
        "matching_decisions": report.matching_decisions,
        "flipped_choices": report.flipped_choices,
        "flipped_choice_fraction": report.flipped_choice_fraction,
        "max_flipped_choices": tol.max_flipped_choices,
        "emulation": report.emulation,
        "checks": report.checks,
        "export_seconds": round(export_seconds, 1),
        "validate_seconds": round(seconds, 1),
    }
    print(json.dumps({k: v for k, v in row.items() if k != "checks"}), flush=True)
    return row


def schedule(row: dict) -> str:
    """' (r per block 16,16,16,8,4,2,1,0,...)' where ToMe's cap changed the configured constant r, else ''."""
    rs = r_per_block(row["tokens_per_layer"])
    r = row["overrides"].get("r")
    if r is None or all(x == r for x in rs):
        return ""
    shown = rs[: rs.index(0) + 1] if 0 in rs else rs
    return f" (capped: {','.join(map(str, shown))}{',...' if len(shown) < len(rs) else ''})"


def share(row: dict) -> str:
    """The flipped matching decisions and their share, with the bound: '86 of 31,680 = 0.27% (<= 5%)'."""
    if row.get("matching_decisions") is None:  # a run from before the bound was a share of the decisions
        return "-"
    bound = f"(<= {100 * row['max_flipped_choices']:.2g}%)"
    if not row["flipped_choices"]:
        return f"0 {bound}"
    return f"{row['flipped_choices']} of {row['matching_decisions']:,} = {100 * row['flipped_choice_fraction']:.2g}% {bound}"


def markdown(result: dict) -> str:
    """One row per export and image set: the differences from the fp32 reference on ONNX Runtime's CPU provider."""
    lines = [
        "| graph on ORT CPU | images | max abs diff | min cosine | top-1 agreement | top-1 flips "
        "| near-tie branch flips (proven) | flipped decisions (bound) | min cosine, replayed on the runtime's choices | validate |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        flips = f"{row['branch_flips']} ({row['branch_flips_explained']})" if row["branch_flips"] else "0"
        replayed = "-" if row["cosine_similarity_min_replayed"] is None else f"{row['cosine_similarity_min_replayed']:.5f}"
        top1 = str(row["top1_flips"])
        if row["top1_flips_within_tolerance"]:
            top1 += f" ({row['top1_flips_within_tolerance']} within tolerance)"
        lines.append(
            f"| {row['label']}{schedule(row)} | {row['num_images']} {IMAGE_NAMES[row['images']]} | {exponent(row['max_abs_diff'])} "
            f"| {row['cosine_similarity_min']:.7f} | {100 * row['top1_agreement']:.1f}% | {top1} | {flips} | {share(row)} | {replayed} "
            f"| {'PASS' if row['passed'] else 'FAIL'} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return
    from deploytk.evaluation.digits import write_digits_imagefolder

    out = cpu_result_output("precision", "precision.py", args.output)
    with tempfile.TemporaryDirectory(prefix="deploytk-precision-") as folder:
        digits = Path(folder) / "digits"
        if any(ROWS[r][2] == "digits" for r in args.rows):
            write_digits_imagefolder(digits, img_size=32)
        rows = [measure(r, Path(folder), digits, args.num_images) for r in args.rows]
    from deploytk.exporter.manifest import package_versions

    result = {"smoke": args.smoke, "environment": {**host(), "versions": package_versions()}, "backend": "ort", "rows": rows}
    write_result(out, result)
    print(markdown(result))


if __name__ == "__main__":
    main()
