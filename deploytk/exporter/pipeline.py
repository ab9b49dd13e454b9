"""`deploytk export`: config -> reference -> model.onnx + manifest.json, atomically."""

from __future__ import annotations

import time
from pathlib import Path

import onnx

from deploytk.adapters.hf_common import HF_PREFIX
from deploytk.analysis.inspect import flops_summary, img_size_of, method_summary, output_summary, schedule_summary
from deploytk.config import DeployConfig, config_to_dict
from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import EXPORT, INLINED_MODEL_FILE, MANIFEST_FORMAT, MODEL_FILE, ORT_MODEL_FILE, write_manifest
from deploytk.exporter.inline import inline_deploytk_functions
from deploytk.exporter.manifest import now_utc, package_versions, sha256_file, sha256_tree
from deploytk.exporter.onnx_export import IR_VERSION, custom_op_counts, export_model
from deploytk.exporter.onnx_io import data_file_name, save_onnx
from deploytk.exporter.ort_fusion import FUSABLE_PRECISIONS, fuse_for_ort
from deploytk.exporter.source import HeldObject
from deploytk.files import claim_directory
from deploytk.merging.merged_vit import MergedViT
from deploytk.merging.precision import to_precision
from deploytk.models import build_reference
from deploytk.progress import SILENT, Progress

#: ``fmt``: the plugin-ready file alone, or with a standard-op copy for runtimes without model-local functions, or with
#: ONNX Runtime's fused copy
FORMATS = ("onnx", "onnx-inlined", "onnx-ort")


def external_data(folder: Path, name: str | None) -> dict:
    """The manifest's record of an ONNX file's external data file (none for a model under protobuf's limit)."""
    return {"external_data": {"file": name, "sha256": sha256_file(folder / name)}} if name else {}


def output_records(proto, kind: str) -> list[dict]:
    """The manifest's ``outputs``: each graph output's name, dtype, shape (``batch`` symbolic) and kind (the first is the
    ``export.output`` kind; ``token_sizes`` and ``patch_to_token`` are their own)."""
    records = []
    for i, value in enumerate(proto.graph.output):
        tensor = value.type.tensor_type
        shape = [d.dim_param or int(d.dim_value) for d in tensor.shape.dim]
        dtype = str(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        records.append({"name": value.name, "dtype": dtype, "shape": shape, "kind": kind if i == 0 else value.name})
    return records


def model_folder_record(model: str) -> dict:
    """For ``hf:<folder>``: the folder's content hash, so the artifact knows when the weights it was made from changed."""
    folder = Path(model[len(HF_PREFIX) :]) if model.startswith(HF_PREFIX) else None
    return {"model_folder_sha256": sha256_tree(folder)} if folder is not None and folder.is_dir() else {}


def write_ort_copy(proto: onnx.ModelProto, folder: Path) -> dict:
    """``folder``/model.ort.onnx, ONNX Runtime's fused copy of ``proto``; returns the manifest's ``onnx_ort`` record."""
    fused, fusions = fuse_for_ort(proto)
    data = save_onnx(fused, folder / ORT_MODEL_FILE, check=False)  # contrib ops: onnx's checker does not know them
    record = {"file": ORT_MODEL_FILE, "sha256": sha256_file(folder / ORT_MODEL_FILE), **external_data(folder, data)}
    return record | {"fusions": fusions, "onnxruntime": package_versions().get("onnxruntime")}


#: the manifest's ``notes``: what an export says about the artifact it wrote, by topic (``deploytk.export`` warns each)
NOTE_CAPPED = "schedule_capped"
NOTE_NOT_REBUILDABLE = "not_rebuildable"


def record_applied_schedule(cfg: DeployConfig, model: MergedViT, config: dict, schedule: dict) -> str | None:
    """A capped ``merge.r`` is recorded as it runs: ``config``'s (the manifest's) `merge.r` becomes the per-block r after the
    cap, which rebuilds the same schedule, and ``schedule["configured_r"]`` keeps what was asked. Returns the note that
    says so (None: nothing was capped)."""
    if not (cfg.merge.reduction.uses_r and model.schedule.capped):
        return None
    asked = config["merge"]["r"]
    config["merge"]["r"] = list(model.schedule.effective_r)
    schedule["configured_r"] = asked
    shown = f"({asked['r']}, {asked['inflection']})" if isinstance(asked, dict) else str(asked)
    return (
        f"r = {shown} (`merge.r`) capped to {list(model.schedule.effective_r)} per block: {model.reduction.cap_rule}; "
        "the manifest records the capped r, the schedule that runs"
    )


def not_rebuildable_note(source: HeldObject) -> str | None:
    """The note on a model object whose PyTorch reference cannot be rebuilt in another process (None: it can)."""
    if source.cannot_rebuild is None:
        return None
    return (
        f"the model object ({source.model_class}) cannot be rebuilt in another process: {source.cannot_rebuild}. Its PyTorch "
        "reference exists only in this process: validate the artifact here (`artifact.validate()` on what deploytk.export "
        "returned); `deploytk validate` and the other commands that compare with the reference refuse it elsewhere"
    )


def given_pipeline(preprocess: dict | None) -> dict | None:
    """The caller's ``preprocess=`` record, checked by the one implementation that applies it, as the manifest keeps it."""
    if preprocess is None:
        return None
    from deploytk.inputs.preprocess import ImagePipeline

    if not isinstance(preprocess, dict):
        raise DeploytkError(
            f"`preprocess=` is a {type(preprocess).__name__}; it takes a record (a dict), as `Artifact.preprocessing` shows one."
        )
    record = ImagePipeline.from_record(preprocess).record()
    return record | {"from": str(preprocess.get("from") or "the caller (preprocess=)")}


def require_fitting(record: dict, kind) -> None:
    """A caller's pipeline must make what the model takes, whatever the picture's shape (a landscape and a portrait one
    are tried): an image model's [3, H, W]."""
    if kind.kind != "image":
        raise DeploytkError(
            f"`preprocess=` records an image pipeline, and this model's input is a {kind.noun}.",
            hint="Leave `preprocess=` out for a video or audio model.",
        )
    from PIL import Image

    from deploytk.inputs.preprocess import ImagePipeline

    pipeline = ImagePipeline.from_record(record)
    _, height, width = kind.shape
    for size in ((3 * width, 2 * height), (2 * width, 3 * height)):
        made = tuple(pipeline.apply(Image.new("RGB", size)).shape)
        if made != tuple(kind.shape):
            raise DeploytkError(
                f"`preprocess=` makes {list(made)} from a {size[0]}x{size[1]} picture, and the model takes {list(kind.shape)}.",
                hint="Resize and crop to the model's size (e.g. a `shorter` resize followed by a centre crop of [H, W]).",
            )


def run_export(
    cfg: DeployConfig,
    output: Path,
    progress: Progress = SILENT,
    fmt: str = "onnx",
    force: bool = False,
    source: HeldObject | None = None,
    preprocess: dict | None = None,
) -> dict:
    """Export and return the manifest; nothing is left at ``output`` if anything fails.

    ``output`` is claimed before any work (deploytk.files): a new or empty folder, or an earlier export, whose
    own files are replaced; ``force`` keeps other files in an earlier export instead of refusing it.
    ``fmt="onnx-inlined"`` also writes ``model.inlined.onnx``: every deploytk node replaced by
    its function body (OpenVINO's reader takes no custom-domain functions), hashed in the manifest; ``fmt="onnx-ort"``
    also writes ``model.ort.onnx``, the graph fused for ONNX Runtime's CPU kernels (``deploytk.exporter.ort_fusion``),
    which the ``ort`` backend then runs.
    ``source``: the model object ``cfg.model`` holds (``memory:``), whose stored files go to ``source/``.
    The manifest's ``notes`` say what the caller should know about the artifact (``NOTE_CAPPED``, ``NOTE_NOT_REBUILDABLE``).
    ``preprocess``: the input pipeline to record (``deploytk.inputs.preprocess``'s record) instead of the family's own.
    """
    given = given_pipeline(preprocess)  # refused before any work
    if fmt not in FORMATS:
        raise DeploytkError(f"`fmt={fmt!r}` is not one of {', '.join(FORMATS)}.")
    if fmt == "onnx-ort" and cfg.export.precision not in FUSABLE_PRECISIONS:
        raise DeploytkError(
            f"`fmt='onnx-ort'` writes a graph for ONNX Runtime's CPU kernels, which have no {cfg.export.precision} kernels "
            f"(`precision={cfg.export.precision}`).",
            hint="Export with `precision=fp32` (or fp16) for ONNX Runtime's CPU, or with `fmt='onnx'` for a GPU runtime.",
        )
    with claim_directory(output, EXPORT, force=force) as target:
        progress.step("building the PyTorch reference")
        model = build_reference(cfg)
        if given is not None:
            require_fitting(given, model.family.input_kind)
        progress.step("counting FLOPs")
        flops = flops_summary(model)
        if cfg.export.precision != "fp32":
            progress.step(f"casting to {cfg.export.precision} (norms, softmax, sizes, matching in fp32)")
            to_precision(model, cfg.export.precision)
        img = img_size_of(model)
        family = model.family
        with target.write() as tmp:
            progress.step("exporting to ONNX (torch.onnx, dynamo)")
            t0 = time.perf_counter()
            proto = export_model(model, family.input_kind, cfg.export.batch_size, cfg.export.opset, tmp / MODEL_FILE)
            seconds = time.perf_counter() - t0
            counts = custom_op_counts(proto)
            inlined = None
            if fmt == "onnx-inlined":
                progress.step("writing the inlined copy (standard ONNX ops only)")
                inlined_data = save_onnx(inline_deploytk_functions(proto), tmp / INLINED_MODEL_FILE)
                inlined = {"file": INLINED_MODEL_FILE, "sha256": sha256_file(tmp / INLINED_MODEL_FILE), **external_data(tmp, inlined_data)}
            fused = None
            if fmt == "onnx-ort":
                progress.step("writing ONNX Runtime's fused copy (attention, LayerNorm, GELU fused)")
                fused = write_ort_copy(proto, tmp)
            if source is not None:
                progress.step("storing the model object's weights and architecture")
                source.copy_files(tmp)
            progress.step("writing manifest")
            config = config_to_dict(cfg) | {"checkpoint": str(Path(cfg.checkpoint).resolve()) if cfg.checkpoint else None}
            schedule = schedule_summary(model)
            notes = {NOTE_CAPPED: record_applied_schedule(cfg, model, config, schedule)}
            if source is not None:
                notes[NOTE_NOT_REBUILDABLE] = not_rebuildable_note(source)
            manifest = {
                "format": MANIFEST_FORMAT,
                "created": now_utc(),
                "config": config,
                "model": {
                    "name": cfg.model,
                    "family": family.name,
                    "class": type(model.vit).__name__,
                    "img_size": list(img),
                    "num_classes": family.num_classes,
                    "blocks": family.depth,
                    "checkpoint_sha256": sha256_file(Path(cfg.checkpoint)) if cfg.checkpoint else None,
                    **model_folder_record(cfg.model),
                    **({"source": source.record(tmp)} if source is not None else {}),
                },
                "schedule": schedule,
                "method": method_summary(cfg),
                **flops,
                "inputs": [family.input_kind.record()],
                "preprocess": given or family.preprocess_record(),
                "outputs": output_records(proto, model.output_kind),
                "output": output_summary(model),
                "custom_ops": counts,
                "onnx": {
                    "file": MODEL_FILE,
                    "sha256": sha256_file(tmp / MODEL_FILE),
                    **external_data(tmp, data_file_name(MODEL_FILE) if (tmp / data_file_name(MODEL_FILE)).is_file() else None),
                    "ir_version": IR_VERSION,
                    "opset": cfg.export.opset,
                    "precision": cfg.export.precision,
                    "export_seconds": round(seconds, 2),
                },
                "onnx_inlined": inlined,
                "onnx_ort": fused,
                "versions": package_versions(),
                "notes": {topic: note for topic, note in notes.items() if note},
            }
            manifest = write_manifest(tmp, manifest)
        return manifest
