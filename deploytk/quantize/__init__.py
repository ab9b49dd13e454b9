"""`deploytk quantize`: INT8 stacked on token reduction, as a new artifact the other commands take like an export.

The source export's fp32 graph and its dense baseline are quantized with the same calibration data and rules, for one
runtime: ``openvino`` (NNCF, saved as IR), ``ort`` (ONNX Runtime's QDQ) or ``trt`` (a Q/DQ graph in TensorRT's
explicit-quantization rules, checked here on ONNX Runtime). In every mode only the ops with weights are int8; the
discrete choices (matching and selection ops and their inputs), the attention products, softmax, norms and token sizes
stay fp32, so a merge is chosen on fp32 values computed from int8 projections (``validate`` checks both). The manifest
records where it came from (the source's hashes), the calibration data, the tool and its settings.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import numpy as np

from deploytk.data import folder_batches, synthetic_batches
from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import BASELINE_DIR, EXPORT, MANIFEST_FILE, MODEL_FILE, SOURCE_DIR, Artifact, write_manifest
from deploytk.exporter.baseline import baseline_onnx
from deploytk.exporter.manifest import now_utc, package_versions, sha256_file
from deploytk.files import claim_directory
from deploytk.models import build_reference
from deploytk.optional import nncf_version
from deploytk.progress import SILENT, Progress
from deploytk.quantize.base import Quantizer
from deploytk.quantize.nncf_openvino import OPENVINO
from deploytk.quantize.qdq import ORT, TRT

#: `backend=`: one Quantizer each (deploytk/quantize/<tool>.py)
QUANTIZERS: dict[str, Quantizer] = {q.name: q for q in (OPENVINO, ORT, TRT)}
RUNTIMES = tuple(QUANTIZERS)
#: calibration images by default: NNCF's own default subset size
DEFAULT_CALIBRATION_IMAGES = 300
#: `synthetic=`: seeded noise, another seed than validate's (0), so validation does not see the calibration images
SYNTHETIC_SEED = 1
BATCH = 8

#: the rule, in one sentence, for the manifest and the README
KEPT_FP32 = (
    "every deploytk op (matching / selection, ProportionalAttention with its attention products and softmax, "
    "TokenAggregate) and the tensors it reads (metric, scores, class-token attention, sizes), the norms and "
    "every MatMul without a weight; int8: MatMul / Gemm / Conv with a weight (projections, MLP, patch embedding, head)"
)


def get_quantizer(backend: str) -> Quantizer:
    if backend not in QUANTIZERS:
        raise DeploytkError(f"`backend={backend!r}` is not one of {', '.join(RUNTIMES)} (the runtime the int8 model is for).")
    return QUANTIZERS[backend]


def default_output(directory: Path, runtime: str) -> Path:
    return directory.parent / f"{directory.name}-int8-{runtime}"


def calibration_batches(artifact: Artifact, data: Path | None, synthetic: int | None, num_samples: int) -> tuple[list, dict]:
    """The calibration batches and the manifest's record of them; exactly one of ``data`` and ``synthetic``."""
    if (data is None) == (synthetic is None):
        raise DeploytkError(
            "quantization needs calibration data: pass exactly one of `data=IMAGES` (a folder of real images, e.g. your "
            "training split) and `synthetic=N` (N seeded noise images: the ranges of real data are not learned from them).",
            hint="For real accuracy, calibrate on a few hundred images like the ones the model will see.",
        )
    if data is not None:
        if num_samples < 1:
            raise DeploytkError(f"`num_samples={num_samples}`: must be >= 1.")
        transform = artifact.input_transform(build_reference(artifact.reference_config).family)
        batches = folder_batches(data, num_samples, BATCH, transform, artifact.input_kind, "data")
        images = sum(len(b) for b in batches)
        record = {"source": str(Path(data).resolve()), "images": images, "preprocessing": "the model family's eval transform"}
    else:
        if synthetic < 1:
            raise DeploytkError(f"`synthetic={synthetic}`: must be >= 1 (images).")
        batches = synthetic_batches(synthetic, BATCH, artifact.input_kind, seed=SYNTHETIC_SEED)
        record = {"source": "synthetic", "images": synthetic, "seed": SYNTHETIC_SEED, "distribution": "standard normal"}
    digest = hashlib.sha256()
    for batch in batches:
        digest.update(np.ascontiguousarray(batch).tobytes())
    return batches, record | {"sha256": digest.hexdigest()}


def check_source(source: Artifact) -> None:
    """Refuse what cannot be quantized: an int8 artifact, a low-precision graph."""
    quantized = source.quantization
    if quantized:
        raise DeploytkError(
            f"{source.directory} is already quantized (int8 for {quantized['runtime']}, from {quantized['source']['directory']}).",
            hint=f"Quantize the fp32 export it came from, {quantized['source']['directory']}, instead.",
        )
    if source.manifest["onnx"].get("external_data"):
        raise DeploytkError(
            f"{source.directory} keeps its weights in an external data file (past protobuf's 2 GiB limit), which "
            "`deploytk quantize` does not take yet.",
            hint="Quantize a model under 2 GiB of fp32 weights (up to ViT-L).",
        )
    if source.precision != "fp32":
        raise DeploytkError(
            f"{source.directory} is a {source.precision} graph; INT8 calibration starts from the fp32 graph (its ranges and "
            "the weights' scales are measured in fp32, and the unquantized parts stay fp32).",
            hint="Export the same config in fp32 (`precision='fp32'`, into a new folder) and quantize that.",
        )


def run_quantize(
    directory: Path,
    backend: str,
    *,
    output: Path | None = None,
    data: Path | None = None,
    synthetic: int | None = None,
    num_samples: int = DEFAULT_CALIBRATION_IMAGES,
    force: bool = False,
    progress: Progress = SILENT,
    keep_choices_fp32: bool = True,
) -> dict:
    """Quantize the export at ``directory`` for ``backend`` (the runtime) into ``output`` and return the new manifest;
    nothing is written when anything fails. ``keep_choices_fp32=False`` exists for one test: a broken quantization
    validate must catch."""
    quantizer = get_quantizer(backend)
    quantizer.require()
    source = Artifact.open(directory)
    check_source(source)
    quantizer.check(source)
    output = Path(output) if output is not None else default_output(source.directory, backend)
    if output.resolve() == source.directory.resolve():
        raise DeploytkError(f"`output={output}` is the source artifact itself.", hint="Write the int8 artifact to a new folder.")
    with claim_directory(output, EXPORT, force=force) as target:
        batches, calibration = calibration_batches(source, data, synthetic, num_samples)
        progress.step("exporting the unmerged baseline (cached after the first run)")
        dense = baseline_onnx(source)
        started = time.perf_counter()
        with target.write() as tmp:
            (tmp / BASELINE_DIR).mkdir()
            progress.step(f"{quantizer.tool()}: quantizing the merged graph and the dense baseline on {calibration['images']} images")
            summary = quantizer.quantize(source, dense, tmp, batches, keep_choices_fp32)
            if (source.directory / SOURCE_DIR).is_dir():  # a model object's stored weights: the reference is rebuilt from them
                shutil.copytree(source.directory / SOURCE_DIR, tmp / SOURCE_DIR)
            manifest = quantized_manifest(source, tmp, quantizer, calibration, summary)
            manifest["quantization"]["seconds"] = round(time.perf_counter() - started, 1)
            manifest = write_manifest(tmp, manifest)
        return manifest


def quantized_manifest(source: Artifact, folder: Path, quantizer: Quantizer, calibration: dict, summary: dict) -> dict:
    """The source's manifest with this folder's files and a ``quantization`` record."""
    manifest = json.loads(json.dumps(source.manifest))
    manifest["created"] = now_utc()
    manifest["onnx"] = {k: v for k, v in manifest["onnx"].items() if k != "external_data"} | {"sha256": sha256_file(folder / MODEL_FILE)}
    manifest["onnx_inlined"] = None
    manifest["onnx_ort"] = None  # the fused copies are of the fp32 graph, not of the quantized one
    extra = dict(summary.pop("manifest", {}))
    if "onnx_role" in extra:
        manifest["onnx"]["role"] = extra.pop("onnx_role")
    manifest |= extra
    manifest["quantization"] = {
        "runtime": quantizer.name,
        "backend": quantizer.backend,
        "tool": quantizer.tool(),
        "settings": quantizer.settings,
        "kept_fp32": KEPT_FP32,
        **summary,
        "calibration": calibration,
        "source": {
            "directory": str(source.directory.resolve()),
            "manifest_sha256": sha256_file(source.directory / MANIFEST_FILE),
            "onnx_sha256": source.manifest["onnx"]["sha256"],
        },
        "dense_baseline": "the source's dense baseline, quantized with the same data and rules (.baseline/)",
        "dense_baseline_files": {
            p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted((folder / BASELINE_DIR).rglob("*")) if p.is_file()
        },
    }
    manifest["versions"] = package_versions() | {"nncf": nncf_version()}
    return manifest
