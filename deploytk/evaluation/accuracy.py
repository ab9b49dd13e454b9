"""`deploytk eval`: ImageFolder accuracy of the dense model, the merged reference and ONNX Runtime.

One pass over the images computes, on identical preprocessed batches
(the model family's ``eval_transform``, the preprocessing ``validate`` uses on its ``images``):

- ``dense``: the unmerged model as its family calls it (``create_model(cfg).plain()``),
- ``reference``: the merged PyTorch reference (``build_reference``),
- ``ort``: the exported ONNX model on ONNX Runtime (CPU),

top-1 and top-k (k = min(5, classes)) accuracy, plus the top-1 agreement of ORT with the
reference. The ONNX model is an existing artifact directory (its manifest must come from the
same model / method / r / weights) or is exported to a temporary directory that is removed
afterwards. Class indices follow torchvision's ImageFolder: sorted class-folder names.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from deploytk.backends import DEFAULT_BACKEND, Backend, get_backend
from deploytk.config import DeployConfig
from deploytk.data import load_samples
from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import Artifact
from deploytk.exporter.pipeline import run_export
from deploytk.inputs import KINDS, InputKind
from deploytk.models import build_reference, create_model
from deploytk.progress import SILENT, Progress

TOPK = 5


@dataclass
class ImageFolder:
    """An ImageFolder tree: ``classes[i]`` is the folder name of class index i."""

    root: Path
    classes: list[str]
    samples: list[tuple[Path, int]]  # (file, class index), class-interleaved order

    @property
    def num_images(self) -> int:
        return len(self.samples)


def _samples_in(folder: Path, suffixes: frozenset[str]) -> list[Path]:
    return sorted(
        p
        for p in folder.rglob("*")
        if p.suffix.lower() in suffixes and p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def scan_image_folder(root: Path, num_samples: int | None = None, kind: InputKind | None = None) -> ImageFolder:
    """Scan ``root/<class>/**/<sample>``; classes are the sorted sub-folder names. ``kind``: the model's input kind, whose
    files are taken (images, clips, sounds); None, before the model is built: any kind's files (the tree is checked).

    Samples are ordered class-interleaved (the first sample of every class, then the second,
    ...), so ``num_samples`` keeps a class-balanced, deterministic subset.
    """
    suffixes = kind.suffixes if kind is not None else frozenset().union(*(k.suffixes for k in KINDS.values()))
    noun, nouns = (kind.noun, kind.nouns) if kind is not None else ("image", "images")
    root = Path(root)
    if num_samples is not None and num_samples < 1:
        raise DeploytkError(f"`num_samples={num_samples}`: must be an int >= 1 (or omitted for all inputs).")
    if not root.is_dir():
        raise DeploytkError(
            f"data directory {root} does not exist or is not a directory (`data=`).",
            hint="Pass an ImageFolder tree DIR/<class>/<image>.png, e.g. the val split of `write_digits_imagefolder`.",
        )
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        loose = _samples_in(root, suffixes)
        what = f"{len(loose)} loose {noun}(s) but " if loose else ""
        raise DeploytkError(
            f"data directory {root} has {what}no class subfolders (`data=`); expected an ImageFolder tree "
            f"{root}/<class>/<{noun}> ({', '.join(sorted(suffixes))}), one sub-folder per class."
        )
    per_class = [_samples_in(root / c, suffixes) for c in classes]
    if not any(per_class):
        raise DeploytkError(
            f"data directory {root} has {len(classes)} class subfolder(s) but no {nouns} in them "
            f"(`data=`; looked for {', '.join(sorted(suffixes))})."
        )
    empty = [c for c, files in zip(classes, per_class, strict=True) if not files]
    if empty:
        raise DeploytkError(
            f"class folder(s) {', '.join(repr(c) for c in empty[:5])} in {root} hold no {nouns} (`data=`); "
            f"every class folder needs at least one {noun}, or the class indices would shift."
        )
    samples = []
    for rank in range(max(len(files) for files in per_class)):
        for index, files in enumerate(per_class):
            if rank < len(files):
                samples.append((files[rank], index))
    return ImageFolder(root, classes, samples[:num_samples] if num_samples else samples)


def _topk_correct(logits: np.ndarray, labels: np.ndarray, k: int) -> tuple[int, int, np.ndarray]:
    """(# top-1 correct, # top-k correct, top-1 predictions)."""
    top1 = logits.argmax(-1)
    topk = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    return int((top1 == labels).sum()), int((topk == labels[:, None]).any(-1).sum()), top1


def evaluate(
    cfg: DeployConfig,
    data: Path,
    *,
    artifacts: Path | None = None,
    batch_size: int = 64,
    num_samples: int | None = None,
    config_name: str = "the config",
    backend: str | Backend = DEFAULT_BACKEND,
    progress: Progress = SILENT,
) -> dict:
    """Top-1/top-k of dense, reference and the exported model on ``backend`` on the ImageFolder ``data``; see the module doc.

    All input checks (data tree, num_samples, batch size, artifacts vs config, class count) run
    before anything is exported; a temporary export is removed even on failure. The report
    calls the exported model's accuracy ``exported`` (``backend`` says what ran it).
    """
    if batch_size < 1:
        raise DeploytkError(f"`batch_size={batch_size}`: must be an int >= 1.")
    backend = get_backend(backend, validating=True) if isinstance(backend, str) else backend
    scan_image_folder(data, num_samples)  # a bad tree or num_samples fails before any model is built
    t_start = time.perf_counter()
    progress.step("building the unmerged model")
    family = create_model(cfg)
    folder = scan_image_folder(data, num_samples, family.input_kind)  # the files of the model's kind: images, clips or sounds
    dense = family.plain()
    img = family.img_size
    num_classes = family.num_classes
    _check_classes(folder, num_classes, cfg)
    manifest = None
    if artifacts is not None:
        artifact = Artifact.open(artifacts)  # also checks model.onnx against its sha256
        artifact.require_exported_from(cfg, config_name, img)
        manifest = artifact.manifest
    progress.step("building the merged reference")
    reference = build_reference(cfg)
    transform = family.input_transform()
    k = min(TOPK, num_classes)
    files = [f for f, _ in folder.samples]
    labels = np.array([c for _, c in folder.samples], dtype=np.int64)
    correct = {name: [0, 0] for name in ("dense", "reference", "exported")}
    seconds = {"preprocess": 0.0, "dense": 0.0, "reference": 0.0, "exported": 0.0, "export": 0.0}
    agree_exported_ref = agree_ref_dense = 0

    temporary = tempfile.TemporaryDirectory(prefix="deploytk-eval-") if manifest is None else contextlib.nullcontext()
    with temporary as tmp:
        if manifest is None:
            progress.step("exporting to a temporary directory")
            t0 = time.perf_counter()
            directory = Path(tmp) / "artifact"
            manifest = run_export(cfg, directory, progress)
            seconds["export"] = time.perf_counter() - t0
        else:
            directory = Path(artifacts)
        starts = range(0, len(files), batch_size)
        exported = backend.load(Artifact.open(directory, verify=False), sorted({len(files[b : b + batch_size]) for b in starts}))
        progress.start(len(starts), f"evaluating {len(files)} {family.input_kind.nouns}")
        exported.activate()
        try:
            with torch.inference_mode():
                for start in starts:
                    t0 = time.perf_counter()
                    x = load_samples(files[start : start + batch_size], transform, family.input_kind)
                    y = labels[start : start + batch_size]
                    t1 = time.perf_counter()
                    logits = {"dense": dense(torch.from_numpy(x)).float().numpy()}
                    t2 = time.perf_counter()
                    logits["reference"] = reference(torch.from_numpy(x)).float().numpy()
                    t3 = time.perf_counter()
                    logits["exported"] = exported.run(x)["logits"]
                    t4 = time.perf_counter()
                    for name, dt in (("preprocess", t1 - t0), ("dense", t2 - t1), ("reference", t3 - t2), ("exported", t4 - t3)):
                        seconds[name] += dt
                    preds = {}
                    for name, out_logits in logits.items():
                        c1, ck, preds[name] = _topk_correct(out_logits, y, k)
                        correct[name][0] += c1
                        correct[name][1] += ck
                    agree_exported_ref += int((preds["exported"] == preds["reference"]).sum())
                    agree_ref_dense += int((preds["reference"] == preds["dense"]).sum())
                    progress.advance()
        finally:
            exported.deactivate()

    n = len(files)
    return {
        "config": config_name,
        "model": cfg.model,
        "model_kwargs": dict(cfg.model_kwargs),
        "checkpoint": cfg.checkpoint,
        "method": cfg.merge.method,
        "r": cfg.merge.model_dump(mode="json")["r"],
        "prop_attn": cfg.merge.prop_attn,
        "merge": cfg.merge.model_dump(mode="json"),
        "precision": cfg.export.precision,
        "backend": backend.name,
        "emulation": exported.emulation,
        "runtime_settings": exported.settings(),
        "img_size": list(img),
        "data": str(folder.root),
        "num_images": n,
        "num_classes": num_classes,
        "classes": folder.classes,
        "limit": num_samples,
        "batch_size": batch_size,
        "topk": k,
        "gflops": manifest["gflops"],
        "dense_gflops": manifest["dense_gflops"],
        "tokens_per_layer": manifest["schedule"]["tokens_per_layer"],
        "tokens_out": manifest["schedule"]["tokens_out"],
        "dense": {"top1": correct["dense"][0] / n, "top5": correct["dense"][1] / n},
        "reference": {"top1": correct["reference"][0] / n, "top5": correct["reference"][1] / n},
        "exported": {"top1": correct["exported"][0] / n, "top5": correct["exported"][1] / n},
        "agreement": agree_exported_ref / n,
        "reference_vs_dense_agreement": agree_ref_dense / n,
        "artifacts": str(artifacts) if artifacts is not None else None,
        "seconds": {key: round(v, 3) for key, v in seconds.items()} | {"total": round(time.perf_counter() - t_start, 3)},
    }


def exported_accuracy(
    directory: Path, folder: ImageFolder, *, batch_size: int = 64, backend: str | Backend = DEFAULT_BACKEND, progress: Progress = SILENT
) -> dict:
    """Top-1/top-k of an exported artifact alone on ``backend`` (``tune`` ranks many candidates; ``evaluate`` also runs the references)."""
    backend = get_backend(backend, validating=True) if isinstance(backend, str) else backend
    artifact = Artifact.open(directory, verify=False)
    family = create_model(artifact.config.model_copy(update={"checkpoint": None, "pretrained": False}))  # only for its preprocessing
    _check_classes(folder, family.num_classes, artifact.config)
    transform = family.input_transform()
    files = [f for f, _ in folder.samples]
    labels = np.array([c for _, c in folder.samples], dtype=np.int64)
    k = min(TOPK, family.num_classes)
    starts = range(0, len(files), batch_size)
    exported = backend.load(artifact, sorted({len(files[b : b + batch_size]) for b in starts}))
    top1 = topk = 0
    progress.start(len(starts), f"top-1 of {directory.name} on {len(files)} {artifact.input_kind.nouns}")
    exported.activate()
    try:
        for start in starts:
            logits = exported.run(load_samples(files[start : start + batch_size], transform, artifact.input_kind))["logits"]
            c1, ck, _ = _topk_correct(logits, labels[start : start + batch_size], k)
            top1, topk = top1 + c1, topk + ck
            progress.advance()
    finally:
        exported.deactivate()
    return {"top1": top1 / len(files), f"top{k}": topk / len(files), "num_images": len(files)}


def _check_classes(folder: ImageFolder, num_classes: int, cfg: DeployConfig) -> None:
    output = cfg.export.output_spec().resolved(num_classes)
    if output != "logits":
        raise DeploytkError(
            f"top-1 accuracy needs class logits, and {cfg.model} exported with `export.output: {output}` gives "
            f"{'a pooled embedding' if output == 'embedding' else 'token features'}, no classes.",
            hint="Evaluate a config of the model with its classifier head and `export.output` unset (or `logits`); "
            "`deploytk validate` checks any output against the reference.",
        )
    if len(folder.classes) != num_classes:
        hint = ""
        if {"train", "val"} & set(folder.classes):
            hint = f" {folder.root} looks like a dataset root: pass its split, e.g. `data={folder.root / 'val'}`."
        shown = ", ".join(folder.classes[:12]) + (", ..." if len(folder.classes) > 12 else "")
        raise DeploytkError(
            f"data directory {folder.root} has {len(folder.classes)} class folder(s) ({shown}) but model "
            f"{cfg.model} has num_classes={num_classes} (`data=` / `model_kwargs.num_classes`); they must be equal." + hint
        )
