"""The unmerged baseline every speedup is measured against: same weights, same precision.

Exported once per artifact (cached under DIR/.baseline/, keyed by model.onnx's sha256) and
used by `profile` (ONNX Runtime) and `build` (the baseline engine, built the same way).
"""

from __future__ import annotations

import copy
from pathlib import Path

from deploytk.config import config_from_dict
from deploytk.export.onnx_export import export_model
from deploytk.merging.patch import MergedViT
from deploytk.merging.precision import to_precision
from deploytk.models import build_reference

BASELINE_DIR = ".baseline"


def dense_model(merged: MergedViT, precision: str):
    """timm's model itself in fp32; in low precision the same weights without reduction or
    proportional attention, cast by the same rules as the merged graph."""
    if precision == "fp32":
        return merged.vit
    return to_precision(MergedViT(copy.deepcopy(merged.vit), [0] * len(merged.vit.blocks), prop_attn=False), precision)


def baseline_onnx(directory: Path, manifest: dict, merged: MergedViT | None = None) -> Path:
    """DIR/.baseline/dense-<sha>.onnx: the unmerged model exported by torch.onnx (cached)."""
    cache = Path(directory) / BASELINE_DIR / f"dense-{manifest['onnx']['sha256'][:16]}.onnx"
    if not cache.is_file():
        cfg = config_from_dict(manifest["config"], f"{directory}/manifest.json")
        merged = merged if merged is not None else build_reference(cfg)
        dense = dense_model(merged, cfg.export.precision)
        cache.parent.mkdir(exist_ok=True)
        tmp = cache.with_suffix(".tmp")
        export_model(dense, tuple(manifest["model"]["img_size"]), cfg.export.batch_size, manifest["onnx"]["opset"], tmp)
        tmp.rename(cache)
    return cache
