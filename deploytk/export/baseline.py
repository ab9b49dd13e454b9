"""The unmerged baseline every speedup is measured against: same weights, same precision.

Exported once per artifact (cached under DIR/.baseline/, keyed by model.onnx's sha256) and
used by `profile` (ONNX Runtime) and `build` (the baseline engine, built the same way).
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

from deploytk.errors import DeploytkError
from deploytk.export.artifacts import BASELINE_DIR, Artifact
from deploytk.export.onnx_export import export_model
from deploytk.files import atomic_file
from deploytk.merging.merged_vit import MergedViT
from deploytk.merging.precision import to_precision
from deploytk.models import build_reference


def dense_model(merged: MergedViT, precision: str):
    """The model itself in fp32, as its family calls it (for an output other than the model's own: the same output
    without reduction); in low precision the same weights without reduction or proportional attention, cast by the
    same rules as the merged graph."""
    if precision == "fp32" and merged.output.kind in (None, "logits" if merged.family.num_classes else "embedding"):
        return merged.family.plain()
    dense = MergedViT.dense(copy.deepcopy(merged.family) if precision != "fp32" else merged.family, prop_attn=False, output=merged.output)
    return dense if precision == "fp32" else to_precision(dense, precision)


def baseline_path(artifact: Artifact) -> Path:
    """DIR/.baseline/dense-<sha of model.onnx>.onnx, where the unmerged baseline of this model.onnx lives."""
    return artifact.directory / BASELINE_DIR / f"dense-{artifact.manifest['onnx']['sha256'][:16]}.onnx"


def baseline_onnx(artifact: Artifact, merged: MergedViT | None = None) -> Path:
    """DIR/.baseline/dense-<sha>.onnx: the unmerged model exported by torch.onnx (cached); for an int8 artifact of ONNX
    Runtime or TensorRT, the dense model `deploytk quantize` quantized the same way (never re-exported)."""
    manifest = artifact.manifest
    cache = baseline_path(artifact)
    if not cache.is_file() and artifact.quantization:
        raise DeploytkError(
            f"{cache} is missing: the int8 dense baseline of {artifact.directory} was removed.",
            hint="Re-run `deploytk quantize` to regenerate the artifact.",
        )
    if not cache.is_file():
        cfg = artifact.config
        merged = merged if merged is not None else build_reference(cfg)
        with atomic_file(cache) as tmp:
            dense = dense_model(merged, cfg.export.precision)
            names = [o["name"] for o in manifest["outputs"]]
            export_model(dense, artifact.img_size, cfg.export.batch_size, manifest["onnx"]["opset"], tmp, cache.name, names)
    return cache


def share_baseline(source: Artifact, target: Artifact) -> None:
    """Give ``target`` the dense baseline already exported for ``source`` (a hard link, or a copy).

    Only for artifacts of the same model, weights, precision, batch and opset, which differ in
    their schedule alone (``tune``'s candidates): their dense models are the same graph.
    """
    src = source.directory / BASELINE_DIR / f"dense-{source.manifest['onnx']['sha256'][:16]}.onnx"
    dst = target.directory / BASELINE_DIR / f"dense-{target.manifest['onnx']['sha256'][:16]}.onnx"
    if dst.is_file() or not src.is_file():
        return
    keys = [(a.config.model_dump(mode="json", exclude={"merge"}), a.manifest["onnx"]["opset"]) for a in (source, target)]
    if keys[0] != keys[1]:
        raise ValueError(f"{source.directory} and {target.directory} are not the same weights and export settings")
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # another file system: copy
        with atomic_file(dst) as tmp:
            shutil.copyfile(src, tmp)
