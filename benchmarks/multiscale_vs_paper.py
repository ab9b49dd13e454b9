"""Parameters and GFLOPs of the multi-scale DeiT-T/S/B with crucial mergence (keep 0.7 at blocks 3, 6, 9), as
`deploytk inspect` counts them, beside "Multi-Scale And Token Mergence"'s Table 1 and Table 3.

For each width: the plain DeiT with crucial mergence at the same placement (Table 3's "+TM"), and the multi-scale
model with each low-scale embedding (``own``: a 32x32 patch embedding; ``shared``: the 16x16 one on the image pooled
2x), with the fusion's parts itemised. Writes ``benchmarks/results/multiscale_vs_paper.json`` and prints a markdown
table. Random weights (counts do not depend on them).

    .venv/bin/python benchmarks/multiscale_vs_paper.py
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the paper's Table 1 (Ours-DeiT-*) and Table 3 (EViT-DeiT-S at keep 0.7: +TM, +MF): params (M), GFLOPs
PAPER = {
    "tiny": {"params": 5.8, "gflops": 0.8, "dense_deit_gflops": 1.3},
    "small": {"params": 22.2, "gflops": 3.1, "dense_deit_gflops": 4.6, "table3_tm_gflops": 3.0, "table3_mf_gflops": 3.1},
    "base": {"params": 86.6, "gflops": 11.5, "dense_deit_gflops": 17.5},
}


def markdown(report: dict) -> str:
    """The table in docs/guides/multiscale.md from a report (``tests/test_readme_facts.py`` holds them equal)."""
    lines = [
        "| DeiT | paper, Table 1: params, GFLOPs | plain DeiT + crucial | multi-scale, `shared` embedding | multi-scale, `own` embedding "
        "| `own`: low-scale embedding / up conv / LKA / PEG GFLOPs |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        p, parts = r["paper"], r["own"]["gflops_of_parts"]
        cells = [f"{r[k]['params_millions']:.2f} M, {r[k]['gflops']:.3f}" for k in ("plain_crucial", "shared", "own")]
        lines.append(
            f"| {r['width']} | {p['params']} M, {p['gflops']} | "
            + " | ".join(cells)
            + " | "
            + " / ".join(f"{v:.4f}" for v in parts.values())
            + " |"
        )
    return "\n".join(lines)


def main() -> int:
    from deploytk.analysis.inspect import inspect_config
    from deploytk.config import load_config
    from deploytk.exporter.manifest import package_versions
    from deploytk.files import atomic_file
    from deploytk.machine import host

    rows = []
    for width, paper in PAPER.items():
        ms_cfg = load_config(ROOT / "export_configs" / f"multiscale_deit_{width}_crucial_k70.yaml")
        plain_model = ms_cfg.model.removeprefix("multiscale:")  # the same DeiT and mergence without the second scale
        plain = inspect_config(ms_cfg.model_copy(update={"model": plain_model, "model_kwargs": {}}))
        row = {
            "width": width,
            "paper": paper,
            "plain_crucial": {k: plain[k] for k in ("params_millions", "gflops", "dense_gflops", "gflops_per_layer")},
        }
        for embedding in ("own", "shared"):
            cfg = ms_cfg.model_copy(update={"model_kwargs": dict(ms_cfg.model_kwargs) | {"low_scale_embedding": embedding}})
            r = inspect_config(cfg)
            row[embedding] = {k: r[k] for k in ("params_millions", "gflops", "dense_gflops", "gflops_of_parts", "gflops_per_layer")}
            print(f"{width} {embedding}: {r['params_millions']:.3f} M, {r['gflops']:.4f} GFLOPs", file=sys.stderr, flush=True)
        rows.append(row)
    out = ROOT / "benchmarks" / "results" / "multiscale_vs_paper.json"
    report = {
        "command": "python benchmarks/multiscale_vs_paper.py",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": host(),
        "versions": package_versions(),
        "rows": rows,
    }
    with atomic_file(out) as tmp:
        tmp.write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(report))
    print(f"\nwrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
