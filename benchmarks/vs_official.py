"""deploytk against the official code of each method it was held to: the table of docs/results/official-code.md.

Every row takes outputs recorded from an official implementation on seeded random weights (tests/data/*_official*.npz;
tests/data/README.md says how each was recorded, and from which commit) and compares them with what deploytk gives for
the same weights and inputs, twice: the PyTorch reference (`deploytk.models.build_reference`) and the exported
`model.onnx` on ONNX Runtime's CPU provider (`run_export`, the `deploytk export` pipeline, with the weights as the
config's checkpoint). Each cell is the largest absolute difference over all outputs; "scale" is the largest absolute
official output, for context. The unit tests hold every row to 1e-4 (reference) and 1e-3 (ONNX); this script prints
the figures themselves. Writes benchmarks/results/vs_official_<cpu>.json and prints the table.

    python benchmarks/vs_official.py                   # every row (~7 min on 2 cores)
    python benchmarks/vs_official.py --rows tome_deit_tiny_r13,mctf_deit_small_r16
    python benchmarks/vs_official.py --markdown benchmarks/results/vs_official_amd_epyc.json   # the table in the docs
    python benchmarks/vs_official.py --smoke --output /tmp/x.json   # one DeiT-T ToMe row: does it run
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the seeded weights and images the official outputs were recorded with

from benchmarks.common import cpu_result_output, exponent, write_result  # noqa: E402
from deploytk.machine import host  # noqa: E402

from helpers import VISIONZIP_BUDGETS, VISIONZIP_TOWER  # noqa: E402

DATA = ROOT / "tests" / "data"
DEIT = {name: f"{name}_patch16_224" for name in ("deit_tiny", "deit_small", "deit_tiny_distilled")}
SOURCES = {
    "tome": "facebookresearch/ToMe (timm patch)",
    "mctf": "mlvlab/MCTF",
    "pitome": "hchautran/PiToMe 550b5de",
    "visionzip": "dvlab-research/VisionZip 3151f6d",
    "study": "JoakimHaurum/TokenReduction 88fe07e",
}
MCTF_FAST_R = [0, 0, 0, 68, 0, 0, 44, 0, 0, 29, 0, 0]
#: the study's non-learned rows: (method, key suffix, label note, proportional attention as in its code)
STUDY = [("kmedoids", "", "", False), ("dpcknn", "_noiseless", ", noise 0", False), ("ats", "_exact", ", exact cdist", True)]
#: the study's learned rows: (method, options, label note); DPC-KNN with a learned token score (equal_weight: false)
STUDY_LEARNED = [
    ("dynamicvit", {}, ""),
    ("patchmerger", {}, ""),
    ("sit", {}, ""),
    ("sinkhorn", {}, ""),
    ("dpcknn", {"equal_weight": False}, ", learned scores"),
]


@dataclass(frozen=True)
class Row:
    """One comparison: a config (without its checkpoint) and where the official outputs are."""

    method: str
    source: str  # a key of SOURCES
    label: str  # model and setting, as the table shows them
    npz: str
    key: str
    config: dict
    images: tuple[int, int] = (2, 2)  # seeded_images(n, seed=...)
    weights: str = "seeded"  # seeded: seeded_init(seed=1) as a state dict; official_learned: the study's checkpoint layout


def deit(name: str, method: str, *, r=None, prop_attn: bool = True, **options) -> dict:
    merge = {"method": method, "prop_attn": prop_attn, "options": options} | ({} if r is None else {"r": r})
    return {"model": DEIT[name], "merge": merge}


def study_keep_counts(keep: float) -> list[int]:
    return [int(196 * keep ** (s + 1)) for s in range(3)]


def all_rows() -> dict[str, Row]:
    rows = [
        Row("tome", "tome", "DeiT-T, r=13", "tome_official_logits.npz", "deit_tiny_r13", deit("deit_tiny", "tome", r=13)),
        Row(
            "tome",
            "tome",
            "DeiT-T distilled, r=8, inflection -1",
            "tome_official_logits.npz",
            "deit_tiny_distilled_r8_inflect",
            deit("deit_tiny_distilled", "tome", r={"r": 8, "inflection": -1.0}),
        ),
        Row(
            "tome",
            "tome",
            "DeiT-T, r=[20, 0, 12, 30, 0, ...]",
            "tome_official_logits.npz",
            "deit_tiny_list",
            deit("deit_tiny", "tome", r=[20, 0, 12, 30] + [0] * 8),
        ),
        Row("mctf", "mctf", "DeiT-S, r=16", "mctf_official_logits.npz", "deit_small_r16", deit("deit_small", "mctf", r=16), (4, 3)),
        Row("mctf", "mctf", "DeiT-T, r=8", "mctf_official_logits.npz", "deit_tiny_r8", deit("deit_tiny", "mctf", r=8)),
        Row(
            "mctf",
            "mctf",
            "DeiT-S, MCTF-Fast (r 68/44/29 at blocks 3/6/9)",
            "mctf_official_logits.npz",
            "deit_small_fast",
            deit("deit_small", "mctf", r=MCTF_FAST_R, layers=[3, 6, 9]),
        ),
    ]
    for name in ("deit_tiny", "deit_small"):
        for keep in (0.9, 0.925):
            label = f"{'DeiT-T' if name == 'deit_tiny' else 'DeiT-S'}, ratio {keep}"
            config = deit(name, "pitome", prop_attn=False, keep_rate=keep)
            rows.append(Row("pitome", "pitome", label, "pitome_official.npz", f"{name}_ratio{keep}_logits", config))
    for name, keep in (("deit_small", 0.7), ("deit_tiny", 0.5)):
        short = "DeiT-S" if name == "deit_small" else "DeiT-T"
        # DPC-KNN with its 1e-6 density noise set to 0, ATS with exact step-to-CDF distances: see docs/guides/methods.md
        for method, suffix, note, prop_attn in STUDY:
            config = deit(name, method, prop_attn=prop_attn, keep_rate=keep)
            key = f"{method}_{name}_k{keep}_logits{suffix}"
            rows.append(Row(method, "study", f"{short}, keep {keep}{note}", "study_official.npz", key, config))
        for method, options, note in STUDY_LEARNED:
            config = deit(name, method, prop_attn=False, keep_rate=keep, **options)
            label = f"{short}, keep {keep}, official checkpoint layout{note}"
            key = f"{method}_{name}_k{keep}_logits"
            rows.append(Row(method, "study", label, "learned_official.npz", key, config, weights="official_learned"))
    for k, (dominant, contextual) in VISIONZIP_BUDGETS.items():
        config = {
            "merge": {"method": "visionzip", "prop_attn": False, "options": {"dominant": dominant, "contextual": contextual}},
            "export": {"img_size": None, "batch_size": 2, "output": "tokens", "feature_layer": -2, "keep_prefix_tokens": True},
        }
        label = f"CLIP tower (LLaVA-1.5 geometry), {k} tokens"
        rows.append(Row("visionzip", "visionzip", label, "visionzip_official.npz", f"tokens_{k}", config, weights="clip_tower"))
    return {row_id(r): r for r in rows}


def row_id(row: Row) -> str:
    """A short unique name for --rows: method, then the recorded key without its method and `_logits` (and `_learned`
    for a row of the learned file, whose keys can be the same as the study file's)."""
    key = row.key.removeprefix(f"{row.method}_").replace("_logits", "")
    learned = row.weights == "official_learned" and row.config["merge"]["options"].get("equal_weight") is False
    return f"{row.method}_{key}" + ("_learned" if learned else "")


ROWS = all_rows()
SMOKE_ROWS = ("tome_deit_tiny_r13",)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of: {', '.join(ROWS)}")
    p.add_argument("--smoke", action="store_true", help=f"{', '.join(SMOKE_ROWS)} only: checks the script.")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None, metavar="JSON", help="Print the table of an earlier run's JSON and exit.")
    args = p.parse_args(argv)
    args.rows = list(SMOKE_ROWS) if args.smoke else [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown:
        p.error(f"unknown row(s) {', '.join(unknown)}; choose from {', '.join(ROWS)}")
    return args


def weights(row: Row, folder: Path) -> tuple[str, np.ndarray]:
    """The checkpoint (a file or an `hf:` folder) holding the weights the official outputs were recorded with, and the
    inputs they were recorded on."""
    import timm
    import torch

    from helpers import official_learned_layout, seeded_images, seeded_init, seeded_learned_state

    if row.weights == "clip_tower":
        import transformers

        tower = transformers.CLIPVisionModel._from_config(transformers.CLIPVisionConfig(**VISIONZIP_TOWER), attn_implementation="eager")
        seeded_init(tower, seed=3).save_pretrained(folder / "tower")
        return f"hf:{folder / 'tower'}", np.load(DATA / row.npz)["images"]
    vit = seeded_init(timm.create_model(row.config["model"]), seed=1)
    state = vit.state_dict()
    if row.weights == "official_learned":  # {'model': ...} as the study's train.py saves it
        options = row.config["merge"]["options"]
        layout = official_learned_layout(row.method, vit.embed_dim, study_keep_counts(options["keep_rate"]))
        state = {"model": state | seeded_learned_state(layout, seed=3), "epoch": 29}
    torch.save(state, folder / "weights.pth")
    n, seed = row.images
    return str(folder / "weights.pth"), seeded_images(n, seed=seed).numpy()


def measure(rid: str, folder: Path) -> dict:
    import onnxruntime as ort
    import torch

    from deploytk.config import config_from_dict
    from deploytk.exporter.pipeline import run_export
    from deploytk.models import build_reference

    row = ROWS[rid]
    work = folder / rid
    work.mkdir()
    checkpoint, images = weights(row, work)
    config = row.config | ({"model": checkpoint} if checkpoint.startswith("hf:") else {"checkpoint": checkpoint})
    cfg = config_from_dict(config)
    official = np.load(DATA / row.npz)[row.key]
    with torch.no_grad():
        reference = build_reference(cfg)(torch.from_numpy(images))
    reference = (reference[0] if isinstance(reference, tuple) else reference).numpy()
    manifest = run_export(cfg, work / "export")
    session = ort.InferenceSession(str(work / "export" / "model.onnx"), providers=["CPUExecutionProvider"])
    onnx_out = session.run(None, {session.get_inputs()[0].name: images})[0]
    result = {
        "row": rid,
        "method": row.method,
        "official": SOURCES[row.source],
        "label": row.label,
        "recorded": f"tests/data/{row.npz}:{row.key}",
        "images": int(images.shape[0]),
        "output_shape": list(official.shape),
        "official_scale": float(np.abs(official).max()),
        "reference_max_abs_diff": float(np.abs(reference - official).max()),
        "onnx_ort_max_abs_diff": float(np.abs(onnx_out - official).max()),
        "custom_ops": sorted(manifest["custom_ops"]),
    }
    print(json.dumps(result), flush=True)
    return result


def markdown(result: dict) -> str:
    """One row per comparison: the largest absolute difference of deploytk's reference and ONNX from the official code."""
    lines = [
        "| method | official code | model, setting | images | output scale | PyTorch reference | ONNX on ONNX Runtime |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| `{row['method']}` | {row['official']} | {row['label']} | {row['images']} | {row['official_scale']:.2f} "
            f"| {exponent(row['reference_max_abs_diff'])} | {exponent(row['onnx_ort_max_abs_diff'])} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return
    out = cpu_result_output("vs_official", "vs_official.py", args.output)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="deploytk-vs-official-") as folder:
        rows = [measure(r, Path(folder)) for r in args.rows]
    from deploytk.exporter.manifest import package_versions

    result = {
        "smoke": args.smoke,
        "environment": {**host(), "versions": package_versions()},
        "seconds": round(time.perf_counter() - start, 1),
        "rows": rows,
    }
    write_result(out, result)
    print(markdown(result))


if __name__ == "__main__":
    main()
