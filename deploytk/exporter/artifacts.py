"""An artifact directory: ``model.onnx`` and ``manifest.json`` (everything needed to rebuild the reference
and to trust the ONNX file) of one export, opened and checked once."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from deploytk.errors import DeploytkError
from deploytk.exporter.manifest import sha256_file, sha256_tree
from deploytk.files import DirectoryKind
from deploytk.inputs import InputKind, input_from_record

if TYPE_CHECKING:  # opening an artifact needs no model code (deploytk.load stays fast); its config is read when asked for
    from deploytk.config import DeployConfig

MODEL_FILE = "model.onnx"
#: `export` with `fmt='onnx-inlined'`: the same graph with the deploytk functions inlined (standard ops only)
INLINED_MODEL_FILE = "model.inlined.onnx"
#: `export` with `fmt='onnx-ort'`: the graph fused for ONNX Runtime's CPU kernels (deploytk.exporter.ort_fusion)
ORT_MODEL_FILE = "model.ort.onnx"
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "deploytk-artifact/1"
#: what `deploytk build` adds: the engine, the unmerged model built the same way (profile's baseline), and engine.json
ENGINE_FILE = "model.engine"
BASELINE_ENGINE_FILE = "baseline.engine"
ENGINE_MANIFEST_FILE = "engine.json"
#: the unmerged baseline's cache (exporter/baseline.py): dense-<sha>.onnx files
BASELINE_DIR = ".baseline"
#: `deploytk quantize` with `backend=openvino`: the quantized graph as OpenVINO IR (model.onnx stays the fp32 graph it came from)
IR_FILE = "model.xml"
IR_WEIGHTS_FILE = "model.bin"
#: an export of a Python model object: its stored weights and architecture (deploytk.exporter.source)
SOURCE_DIR = "source"


def _artifact_files(directory: Path) -> set[str] | None:
    """The files deploytk writes in an export folder (export, build, profile's baseline cache); None if it is not one."""
    try:
        manifest = json.loads((directory / MANIFEST_FILE).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return None
    baseline = directory / BASELINE_DIR
    cached = {f"{BASELINE_DIR}/{p.name}" for p in baseline.glob("dense-*")} if baseline.is_dir() else set()
    models = {MODEL_FILE, INLINED_MODEL_FILE, ORT_MODEL_FILE}
    ir = {IR_FILE, IR_WEIGHTS_FILE}
    from deploytk.exporter.onnx_io import data_file_name  # imports ONNX: only a command that writes an export asks

    data = {data_file_name(m) for m in models}
    source = (manifest.get("model") or {}).get("source") or {}
    stored = set(source.get("files") or {}) if isinstance(source, dict) else set()
    return stored | {MANIFEST_FILE, ENGINE_FILE, BASELINE_ENGINE_FILE, ENGINE_MANIFEST_FILE} | models | data | ir | cached


#: an export folder, as `deploytk export` claims its `output` (deploytk.files: the rule for every output)
EXPORT = DirectoryKind("deploytk export", MANIFEST_FILE, _artifact_files)


def rebuild_config(cfg: DeployConfig, recipe: dict, folder: Path) -> DeployConfig:
    """``cfg`` (whose ``model`` is a ``memory:`` name) naming the model the stored files in ``folder`` rebuild (the
    recipe a family's ``save_source`` returned: ``{folder}`` in ``model`` stands for the folder)."""
    model = recipe["model"].replace("{folder}", str(folder))
    checkpoint = str(folder / recipe["checkpoint"]) if recipe.get("checkpoint") else None
    return cfg.model_copy(update={"model": model, "model_kwargs": dict(recipe["model_kwargs"]), "checkpoint": checkpoint})


def require_artifact_dir(directory: Path) -> Path:
    """The artifact dir of an earlier export, or a clear error if it is not one."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DeploytkError(
            f"artifact directory {directory} does not exist.",
            hint="Create it with `deploytk export` first.",
        )
    for name in (MODEL_FILE, MANIFEST_FILE):
        if not (directory / name).is_file():
            raise DeploytkError(
                f"{directory} is not a deploytk artifact directory: {name} is missing.",
                hint="Export again into a new folder with `deploytk export` and pass that folder.",
            )
    return directory


#: the manifest's seal: the sha256 of its own content without this key (``seal``), checked by every read
SEAL_KEY = "content_sha256"


def _content_sha256(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != SEAL_KEY}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()


def seal(manifest: dict) -> dict:
    """``manifest`` with its seal: a manifest edited by hand (a schedule, a flag) no longer matches the graph it
    describes, and every command refuses it before any work instead of failing deep inside a runtime."""
    return {**{k: v for k, v in manifest.items() if k != SEAL_KEY}, SEAL_KEY: _content_sha256(manifest)}


def write_manifest(folder: Path, manifest: dict) -> dict:
    """Write ``folder``/manifest.json sealed; returns what was written."""
    sealed = seal(manifest)
    (Path(folder) / MANIFEST_FILE).write_text(json.dumps(sealed, indent=2) + "\n")
    return sealed


def read_manifest(directory: Path, verify_model: bool = True) -> dict:
    path = Path(directory) / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DeploytkError(f"{path} could not be read as JSON ({err}).", hint="Re-run `deploytk export`.") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise DeploytkError(f"{path} is not a deploytk manifest (no `format: {MANIFEST_FORMAT}`).", hint="Re-run `deploytk export`.")
    if manifest.get(SEAL_KEY) != _content_sha256(manifest):
        state = (
            "has no seal (written by an older deploytk, or rewritten)" if SEAL_KEY not in manifest else "was edited after deploytk wrote it"
        )
        raise DeploytkError(
            f"{path} {state}: its content no longer matches its {SEAL_KEY}, so nothing it says (the schedule, the "
            "method's settings, the files' hashes) can be trusted to describe model.onnx; it was refused before any work.",
            hint="Re-run `deploytk export` (or `deploytk quantize`) to regenerate the artifact; to change a setting, "
            "change the config and export again.",
        )
    if verify_model:
        record = manifest.get("onnx", {})
        files = [(MODEL_FILE, record.get("sha256"))]
        if record.get("external_data"):  # the weights of a model past protobuf's 2 GiB limit
            files.append((record["external_data"]["file"], record["external_data"]["sha256"]))
        for name, expected in files:
            path = Path(directory) / name
            actual = sha256_file(path) if path.is_file() else "(missing)"
            if actual != expected:
                raise DeploytkError(
                    f"{path} does not match its manifest (sha256 {actual[:12]}... vs {str(expected)[:12]}...): the file was "
                    "changed or removed after export.",
                    hint="Re-run `deploytk export` to regenerate the artifact.",
                )
    return manifest


@dataclass
class Artifact:
    """What every command that reads an export needs: its files, its manifest, its config."""

    directory: Path
    manifest: dict

    @classmethod
    def open(cls, directory: Path, verify: bool = True) -> Artifact:
        """Check ``directory`` is an export and read its manifest (``verify``: model.onnx must match its sha256)."""
        directory = require_artifact_dir(directory)
        return cls(directory, read_manifest(directory, verify_model=verify))

    @cached_property
    def config(self) -> DeployConfig:
        from deploytk.config import config_from_dict

        return config_from_dict(self.manifest["config"], f"{self.directory}/manifest.json")

    @cached_property
    def reference_config(self) -> DeployConfig:
        """``config`` for rebuilding the PyTorch reference, after checking that the weights it names are the ones the
        artifact was made from (the checkpoint file, the ``hf:`` folder): a moved or changed source is refused with its
        path before any work, instead of a reference of other weights failing validation (or a Hub lookup)."""
        from deploytk.adapters.hf_common import HF_PREFIX

        cfg, model = self.config, self.manifest["model"]
        if model.get("source") is not None:
            return self._object_reference_config(cfg, model["source"])
        checks = []
        if cfg.checkpoint:
            checks.append(("checkpoint", Path(cfg.checkpoint), model.get("checkpoint_sha256"), sha256_file))
        if cfg.model.startswith(HF_PREFIX) and model.get("model_folder_sha256"):
            checks.append(("model folder", Path(cfg.model[len(HF_PREFIX) :]), model["model_folder_sha256"], sha256_tree))
        for what, path, recorded, digest in checks:
            if not path.exists():
                raise DeploytkError(
                    f"{self.directory} was exported from the {what} {path}, which no longer exists; the PyTorch reference "
                    "cannot be rebuilt without it.",
                    hint=f"Put the {what} back at that path, or export again from where it is now.",
                )
            if recorded and digest(path) != recorded:
                raise DeploytkError(
                    f"the {what} {path} changed after {self.directory} was exported from it (sha256 {recorded[:12]}... then); "
                    "a reference built from other weights cannot validate this graph.",
                    hint="Export again from the current weights, or restore the ones the artifact was made from.",
                )
        return cfg

    def _object_reference_config(self, cfg: DeployConfig, source: dict) -> DeployConfig:
        """An export of a Python model object: the object itself while this process holds it, else the model its stored
        files rebuild (checked against their sha256), else a refusal that says why and what to do."""
        from deploytk.models import is_held

        if is_held(cfg.model):
            return cfg
        if source.get("rebuild") is None:
            # an export before deploytk left the temporary folder out of the reason named it: it was gone by the time it was read
            why = re.sub(r"\S*deploytk-source-[^/\s]+/source/", "", str(source.get("cannot_rebuild"))).rstrip(".")
            raise DeploytkError(
                f"{self.directory} was exported from a Python object ({source['object']}) that cannot be rebuilt in another "
                f"process: {why}; its PyTorch reference existed only in the process that exported it.",
                hint="Validate it there (`artifact.validate()` on what deploytk.export returned), or export a model whose "
                "architecture deploytk can store (a timm model made by timm.create_model from plain arguments, a transformers "
                "model, or a config naming one).",
            )
        for name, recorded in source["files"].items():
            path = self.directory / name
            if not path.is_file() or sha256_file(path) != recorded:
                raise DeploytkError(
                    f"{path}, the stored weights of the model object {self.directory} was exported from, is missing or was "
                    "changed after export; the PyTorch reference cannot be rebuilt from it.",
                    hint="Export the model object again.",
                )
        return rebuild_config(cfg, source["rebuild"], self.directory / SOURCE_DIR)

    @property
    def onnx_path(self) -> Path:
        return self.directory / MODEL_FILE

    @cached_property
    def inlined_path(self) -> Path | None:
        """model.inlined.onnx when the export wrote one (``fmt='onnx-inlined'``), checked against its sha256."""
        return self._extra_graph("onnx_inlined", "onnx-inlined")

    @cached_property
    def ort_path(self) -> Path | None:
        """model.ort.onnx, ONNX Runtime's fused copy, when the export wrote one (``fmt='onnx-ort'``), checked against its sha256."""
        return self._extra_graph("onnx_ort", "onnx-ort")

    def _extra_graph(self, key: str, fmt: str) -> Path | None:
        """The file of the manifest's ``key`` record (and its external data), refused if changed since the export."""
        record = self.manifest.get(key)
        if not record:
            return None
        path = self.directory / record["file"]
        data = record.get("external_data")
        if any(
            not p.is_file() or sha256_file(p) != sha
            for p, sha in [(path, record["sha256"])] + ([(self.directory / data["file"], data["sha256"])] if data else [])
        ):
            raise DeploytkError(
                f"{path} is missing or does not match its manifest: the file was changed after export.",
                hint=f"Export again with `fmt='{fmt}'` to regenerate the artifact.",
            )
        return path

    @property
    def img_size(self) -> tuple[int, int]:
        """The size the model's patch grid is cut from (an image's, a video frame's)."""
        return tuple(self.manifest["model"]["img_size"])

    def input_transform(self, family):
        """What a file of this artifact's input becomes its input with: the recorded pipeline, the one its runners
        apply (``export(preprocess=...)``'s included), else the family's (``ModelFamily.input_transform``)."""
        record = self.manifest.get("preprocess")
        if record and record.get("kind") == "image":
            from deploytk.inputs.preprocess import ImagePipeline

            return ImagePipeline.from_record(record).apply
        return family.input_transform()

    @cached_property
    def input_kind(self) -> InputKind:
        """What one sample of the graph's input is (``deploytk.inputs``), as the manifest's ``inputs[0]`` records it."""
        return input_from_record(self.manifest["inputs"][0])

    @property
    def output_kind(self) -> str:
        """``export.output`` as exported: logits, embedding, patch_features or tokens (deploytk.merging.outputs); an export
        from before output kinds has none recorded: a model without classes gave its embedding."""
        first = self.manifest["outputs"][0]
        return first.get("kind") or ("embedding" if self.manifest["model"].get("num_classes") == 0 else "logits")

    @property
    def output_name(self) -> str:
        """The graph's first output: the one validate, eval and package compare and describe."""
        return self.manifest["outputs"][0]["name"]

    @property
    def output_names(self) -> list[str]:
        return [o["name"] for o in self.manifest["outputs"]]

    @property
    def precision(self) -> str:
        """export.precision: the float precision of what is not quantized (fp32 for every `deploytk quantize` artifact)."""
        return self.manifest["config"].get("export", {}).get("precision", "fp32")

    @property
    def quantization(self) -> dict | None:
        """What `deploytk quantize` recorded (``runtime``: openvino, ort or trt; tool, settings, calibration); None for an export."""
        return self.manifest.get("quantization")

    @property
    def numerics(self) -> str:
        """What the reports and the tolerances go by: ``int8`` for a quantized artifact, else the precision."""
        return "int8" if self.quantization else self.precision

    def require_runtime(self, what: str, runs: tuple[str, ...]) -> None:
        """Refuse a quantized artifact made for another runtime than ``runs`` (the int8 graphs ``what`` takes)."""
        quantized = self.quantization
        if quantized and quantized["runtime"] not in runs:
            made = quantized.get("backend", quantized["runtime"])
            raise DeploytkError(
                f"{self.directory} was quantized for {quantized['runtime']} (`deploytk quantize` with `backend={quantized['runtime']}`); "
                f"{what} does not run that graph.",
                hint=f"Run it with `backend={made}`, or quantize the fp32 export {quantized['source']['directory']} for this runtime.",
            )

    @cached_property
    def ir_path(self) -> Path | None:
        """model.xml (+ model.bin) of an OpenVINO-quantized artifact, checked against the manifest's sha256; else None."""
        record = self.manifest.get("openvino_ir")
        if not record:
            return None
        weights = record["weights"]
        files = [(self.directory / record["file"], record["sha256"]), (self.directory / weights["file"], weights["sha256"])]
        if any(not p.is_file() or sha256_file(p) != sha for p, sha in files):
            raise DeploytkError(
                f"{files[0][0]} or its weights are missing or do not match the manifest: the files were changed after quantization.",
                hint="Re-run `deploytk quantize` to regenerate the artifact.",
            )
        return files[0][0]

    def require_exported_from(self, cfg: DeployConfig, config_name: str, img_size) -> None:
        """Refuse an export (``artifacts``) of another model, method, schedule, image size or weights than ``cfg``."""
        if self.manifest["model"].get("source") is not None and cfg.model_dump() == self.reference_config.model_dump():
            return  # the artifact's own reference (a model object's, rebuilt from its stored files)
        want, have = _export_identity(cfg), _export_identity(self.config)
        if want.get("merge.r") == self.manifest["schedule"].get("configured_r"):
            want["merge.r"] = have.get("merge.r")  # the manifest records a capped r as it runs, and what was asked
        problems = [f"`{k}` is {have.get(k)!r} there but {want[k]!r} in {config_name}" for k in want if want[k] != have.get(k)]
        if list(self.img_size) != list(img_size):
            problems.append(f"the input size is {list(self.img_size)} there but {list(img_size)} in {config_name}")
        want_sha = sha256_file(Path(cfg.checkpoint)) if cfg.checkpoint else None
        have_sha = self.manifest["model"].get("checkpoint_sha256")
        if want_sha != have_sha:
            problems.append(
                "the weights differ ("
                + (f"checkpoint sha256 {have_sha[:12]}..." if have_sha else "random init")
                + " there, "
                + (f"{cfg.checkpoint} sha256 {want_sha[:12]}..." if want_sha else "random init")
                + f" in {config_name})"
            )
        if problems:
            raise DeploytkError(
                f"`artifacts={self.directory}` was not exported from {config_name}: " + "; ".join(problems) + ".",
                hint=f"Export {config_name} again into {self.directory} (`deploytk export`), "
                "or omit `artifacts=` to export to a temporary directory.",
            )


def _export_identity(cfg: DeployConfig) -> dict:
    """What must agree between an artifact and a config: the model and every merge setting."""
    data = cfg.model_dump(mode="json")
    return {"model": data["model"], "model_kwargs": data["model_kwargs"], **{f"merge.{k}": v for k, v in data["merge"].items()}}
