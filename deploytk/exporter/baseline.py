"""The unmerged baseline every speedup is measured against: same weights, same precision.

Exported once per artifact into deploytk's cache folder (``$DEPLOYTK_CACHE``; keyed by model.onnx's
sha256 and verified on every read; never inside the artifact, which may be read-only) and used by
`profile` (ONNX Runtime, OpenVINO) and `build` (the baseline engine, built the same way). An int8
artifact carries its own dense baseline, quantized the same way, under DIR/.baseline/.
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

import onnx

from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import BASELINE_DIR, Artifact
from deploytk.exporter.manifest import sha256_file
from deploytk.exporter.onnx_export import export_model
from deploytk.exporter.onnx_io import save_onnx
from deploytk.exporter.ort_fusion import fuse_for_ort
from deploytk.files import cached_file
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


def quantized_baseline_path(artifact: Artifact) -> Path:
    """DIR/.baseline/dense-<sha of model.onnx>.onnx: where `deploytk quantize` writes the int8 dense baseline of the artifact
    it makes (part of that artifact, hashed in its manifest: it cannot be remade without the calibration data)."""
    return artifact.directory / BASELINE_DIR / f"dense-{artifact.manifest['onnx']['sha256'][:16]}.onnx"


def verified_quantized_baseline(artifact: Artifact, path: Path) -> Path:
    """``path`` (under DIR/.baseline/), checked against the sha256 `deploytk quantize` recorded for it."""
    recorded = (artifact.quantization or {}).get("dense_baseline_files", {})
    files = [path] + ([path.with_suffix(".bin")] if path.suffix == ".xml" else [])
    for file in files:
        relative = file.relative_to(artifact.directory).as_posix()
        if not file.is_file():
            raise DeploytkError(
                f"{file} is missing: the int8 dense baseline of {artifact.directory} was removed.",
                hint="Re-run `deploytk quantize` to regenerate the artifact.",
            )
        if relative in recorded and sha256_file(file) != recorded[relative]:
            raise DeploytkError(
                f"{file} does not match the sha256 its manifest records: the int8 dense baseline was changed after quantization.",
                hint="Re-run `deploytk quantize` to regenerate the artifact.",
            )
    return path


def baseline_onnx(artifact: Artifact, merged: MergedViT | None = None) -> Path:
    """The unmerged model of ``artifact`` as ONNX: for an export, exported by torch.onnx into deploytk's cache folder
    (``deploytk.files.cached_file``, keyed by model.onnx's sha256, verified on every read; never inside the artifact);
    for an int8 artifact of ONNX Runtime or TensorRT, the dense model `deploytk quantize` quantized the same way."""
    if artifact.quantization:
        return verified_quantized_baseline(artifact, quantized_baseline_path(artifact))
    manifest = artifact.manifest

    def make(tmp: Path, name: str) -> None:
        cfg = artifact.config
        model = merged if merged is not None else build_reference(artifact.reference_config)
        dense = dense_model(model, cfg.export.precision)
        names = [o["name"] for o in manifest["outputs"]]
        export_model(dense, artifact.input_kind, cfg.export.batch_size, manifest["onnx"]["opset"], tmp, name, names)

    return cached_file(BASELINES, baseline_name(artifact), make, f"dense baseline of {artifact.directory}")


def fused_baseline_onnx(artifact: Artifact) -> Path:
    """The dense baseline fused for ONNX Runtime as the artifact's model.ort.onnx was (``fmt='onnx-ort'``), cached beside
    it: the speedup of a fused graph is measured against a dense graph given the same fusions."""
    dense = baseline_onnx(artifact)

    def make(tmp: Path, name: str) -> None:
        save_onnx(fuse_for_ort(onnx.load(str(dense)))[0], tmp, name, check=False)

    name = baseline_name(artifact).removesuffix(".onnx") + ".ort.onnx"
    return cached_file(BASELINES, name, make, f"dense baseline of {artifact.directory}, fused for ONNX Runtime")


#: the cache's section for dense baselines
BASELINES = "baselines"


def baseline_name(artifact: Artifact) -> str:
    """The cache entry of an export's dense baseline: named by model.onnx's sha256, which covers the weights, the
    precision and every export setting."""
    return f"dense-{artifact.manifest['onnx']['sha256'][:32]}.onnx"


def share_baseline(source: Artifact, target: Artifact) -> None:
    """Give ``target`` the dense baseline already cached for ``source`` (a hard link, or a copy, in the cache folder).

    Only for artifacts of the same model, weights, precision, batch and opset, which differ in
    their schedule alone (``tune``'s candidates): their dense models are the same graph.
    """
    keys = [(a.config.model_dump(mode="json", exclude={"merge"}), a.manifest["onnx"]["opset"]) for a in (source, target)]
    if keys[0] != keys[1]:
        raise ValueError(f"{source.directory} and {target.directory} are not the same weights and export settings")
    src = baseline_onnx(source)

    def link(tmp: Path, name: str) -> None:
        if (src.parent / f"{src.name}.data").is_file():  # a model past 2 GiB: its weights file keeps its own name
            shutil.copyfile(src.parent / f"{src.name}.data", tmp.parent / f"{name}.data")
        tmp.unlink()
        try:
            os.link(src, tmp)
        except OSError:  # another file system: copy
            shutil.copyfile(src, tmp)

    cached_file(BASELINES, baseline_name(target), link, f"dense baseline of {target.directory}")
