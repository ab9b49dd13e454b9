"""The Python API's verbs: the same jobs as the CLI's commands, from whatever model the caller holds.

``model`` may be a ``torch.nn.Module`` of a supported family (never changed: deploytk works on a copy), a timm name, an
``hf:`` name or folder, a YAML config path or a ``DeployConfig``. Keyword arguments override the config; method options
(``keep_rate=0.7``) are keywords too, checked by the method's own schema.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploytk.api.artifact import Artifact
from deploytk.api.reports import (
    CalibrationReport,
    CleanReport,
    DoctorReport,
    EvaluationReport,
    FamiliesReport,
    InspectReport,
    MethodsReport,
    SelftestReport,
    TuneReport,
    VisualizationReport,
)
from deploytk.defaults import CONFIG_SUFFIXES, DEFAULT_BACKEND, HF_PREFIX
from deploytk.defaults import VISUALIZE_REFERENCE as REFERENCE
from deploytk.errors import DeploytkError, ExportNotice, NotRebuildableWarning
from deploytk.exporter.artifacts import MANIFEST_FILE
from deploytk.progress import SILENT, Progress

if TYPE_CHECKING:
    from torch import nn

    from deploytk.api.inputs import ModelLike
    from deploytk.config import DeployConfig
    from deploytk.merging.merged_vit import MergedViT

# Each verb imports the library code it runs when it runs (as ``Artifact``'s methods do): ``import deploytk`` and
# ``deploytk.load`` need none of it, and torch alone takes seconds to import.


def _default_output(model: ModelLike, cfg: DeployConfig) -> Path:
    """artifacts/<config stem>, or artifacts/<model>-<method> for a name or an object (as `deploytk export` names it)."""
    from torch import nn

    if isinstance(model, (str, Path)) and Path(model).suffix in CONFIG_SUFFIXES:
        return Path("artifacts") / Path(model).stem
    name = type(model).__name__ if isinstance(model, nn.Module) else str(cfg.model).rstrip("/").split("/")[-1]
    return Path("artifacts") / re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{name}-{cfg.merge.method}")


def _name_of(model: ModelLike) -> str:
    """How reports and errors name ``model``: the name or path given, else "the model" (an object or a config object)."""
    return str(model) if isinstance(model, (str, Path)) else "the model"


def export(
    model: ModelLike,
    output: str | Path | None = None,
    *,
    method: str | None = None,
    r: Any = None,
    options: dict[str, Any] | None = None,
    img_size: int | tuple[int, int] | None = None,
    precision: str | None = None,
    output_kind: str | None = None,
    feature_layer: int | None = None,
    batch_size: int | None = None,
    checkpoint: str | Path | None = None,
    fmt: str = "onnx",
    force: bool = False,
    progress: Progress | None = None,
    **method_options: Any,
) -> Artifact:
    """Export ``model`` reduced by ``method`` (default: the config's, else tome) to ``output``/model.onnx +
    manifest.json, written atomically, and return the artifact.

    ``r``: an int, one int per block, or ``(r, inflection)``; ``output_kind``: logits, embedding, patch_features or
    tokens (default: the model's own); ``fmt="onnx-inlined"`` also writes a standard-ops copy. A model object's weights
    and architecture are stored in the artifact (``source/``) when they rebuild it, so a later process can validate it;
    when they cannot, ``artifact.rebuildable`` is False, ``artifact.rebuild_problem`` says why and a
    ``NotRebuildableWarning`` is warned. What the export says about the artifact (that, or an r capped to what the model
    can take, recorded as it runs) is in ``artifact.notes``, each warned as an ``ExportNotice``.

    ```python
    import timm
    import deploytk

    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, depth=2, num_classes=10)
    artifact = deploytk.export(model, "artifacts/tiny", method="tome", r=2)
    assert artifact.validate(num_images=8).passed
    ```
    """
    from deploytk.api.inputs import resolve
    from deploytk.exporter.pipeline import NOTE_NOT_REBUILDABLE, run_export

    cfg, held = resolve(
        model,
        "deploytk.export()",
        method=method,
        r=r,
        options=options,
        img_size=img_size,
        precision=precision,
        output_kind=output_kind,
        feature_layer=feature_layer,
        batch_size=batch_size,
        checkpoint=checkpoint,
        store=True,
        **method_options,
    )
    target = Path(output) if output is not None else _default_output(model, cfg)
    try:
        run_export(cfg, target, progress or SILENT, fmt, force=force, source=held)
    finally:
        if held is not None:
            held.close()
    artifact = Artifact(target)
    for topic, note in (artifact.manifest.get("notes") or {}).items():
        warnings.warn(NotRebuildableWarning(note) if topic == NOTE_NOT_REBUILDABLE else ExportNotice(note), stacklevel=2)
    return artifact


def load(directory: str | Path) -> Artifact:
    """An earlier export, checked (its manifest's seal, model.onnx's sha256)."""
    return Artifact(directory)


def patch(
    model: nn.Module,
    method: str = "tome",
    r: Any = None,
    *,
    prop_attn: bool = True,
    output_kind: str | None = None,
    feature_layer: int | None = None,
    **options: Any,
) -> MergedViT:
    """The reduced PyTorch model, for work that stays in PyTorch: the same reference ``export`` traces, built on a copy
    of ``model`` (which is not changed). ``r`` defaults to 16 for the methods that take it.

    ```python
    import timm
    import torch
    import deploytk

    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, depth=2)
    merged = deploytk.patch(model, "tome", r=4)
    logits = merged(torch.zeros(1, 3, 32, 32))
    ```
    """
    from torch import nn

    from deploytk.api.inputs import resolve
    from deploytk.models import build_reference

    if not isinstance(model, nn.Module):
        raise DeploytkError(f"`model` is a {type(model).__name__}; patch takes a torch.nn.Module (a timm or transformers ViT).")
    cfg, _ = resolve(
        model, "deploytk.patch()", method=method, r=r, prop_attn=prop_attn, output_kind=output_kind, feature_layer=feature_layer, **options
    )
    return build_reference(cfg)


def inspect(
    model: ModelLike, *, method: str | None = None, r: Any = None, progress: Progress | None = None, **options: Any
) -> InspectReport:
    """Token schedule and GFLOPs (fvcore convention) per layer and in total; weights do not matter."""
    from deploytk.analysis.inspect import inspect_config
    from deploytk.api.inputs import resolve

    cfg, _ = resolve(model, "deploytk.inspect()", method=method, r=r, **options)
    return InspectReport(inspect_config(cfg, progress or SILENT))


def _config_path(config: Any, where: str) -> Path:
    if isinstance(config, (str, Path)) and Path(config).suffix in CONFIG_SUFFIXES:
        return Path(config)
    raise DeploytkError(
        f"`config` is {config!r}; {where} takes the path of a YAML config, because it writes a new config beside it.",
        hint="Write the model's settings to a YAML file (see export_configs/) and pass its path.",
    )


def tune(
    config: str | Path,
    budget_ms: float,
    *,
    batch: int = 8,
    backend: str = DEFAULT_BACKEND,
    percentile: str = "p50",
    data: str | Path | None = None,
    limit: int | None = 256,
    inflections: list[float] | None = None,
    output: str | Path | None = None,
    cache: str | Path | None = None,
    warmup: int = 3,
    iterations: int = 10,
    progress: Progress | None = None,
    command_line: Callable[[Path, dict[str, Any]], str] | None = None,
) -> TuneReport:
    """The least aggressive schedule of ``config``'s method whose latency meets ``budget_ms`` here, written as a config.

    ``command_line``: how the report's ``command`` (what reproduces the run) is spelt, ``command_line(config, arguments)``;
    default: this Python call. The CLI passes its own, which writes the shell command."""
    from deploytk.tuning import tune as tune_config

    report = tune_config(
        _config_path(config, "deploytk.tune()"),
        budget_ms,
        batch=batch,
        backend=backend,
        percentile=percentile,
        data=Path(data) if data is not None else None,
        limit=limit,
        inflections=inflections,
        output=Path(output) if output is not None else None,
        cache=Path(cache) if cache is not None else None,
        warmup=warmup,
        iterations=iterations,
        progress=progress or SILENT,
        command_line=command_line,
    )
    return TuneReport(report)


def calibrate(
    config: str | Path,
    *,
    images: str | Path | None = None,
    synthetic: int | None = None,
    num_images: int = 256,
    batch_size: int = 16,
    quantile: float = 0.5,
    output: str | Path | None = None,
    progress: Progress | None = None,
) -> CalibrationReport:
    """ATM run dynamically on calibration images, its per-layer r fixed as a new config (``output``)."""
    from deploytk.calibration import calibrate_config

    report = calibrate_config(
        _config_path(config, "deploytk.calibrate()"),
        images=Path(images) if images is not None else None,
        synthetic=synthetic,
        num_images=num_images,
        batch_size=batch_size,
        quantile=quantile,
        output=Path(output) if output is not None else None,
        progress=progress or SILENT,
    )
    return CalibrationReport(report)


def visualize(
    model: ModelLike,
    image: str | Path,
    *,
    output: str | Path = "merge.png",
    layers: str | list[int] | None = None,
    backend: str = REFERENCE,
    artifacts: str | Path | None = None,
    colors: str = "mean",
    method: str | None = None,
    r: Any = None,
    config_name: str | None = None,
    progress: Progress | None = None,
    **options: Any,
) -> VisualizationReport:
    """``image`` with every patch coloured by the token it belongs to after each chosen block, written to ``output``.
    ``image`` is the model's input kind: an image file, a clip (video models) or a sound (audio models). ``model`` may
    also be an export's folder: its reference's choices are drawn, or with a runtime ``backend`` its graph's
    (``Artifact.visualize``).

    ``config_name``: how the report and errors name the model (default: the name or path given, else "the model"; the CLI
    passes its CONFIG path with the config object it built)."""
    from deploytk.api.inputs import resolve
    from deploytk.visualization import visualize as draw

    directory = _export_folder(model)
    if directory is not None:
        given = next((k for k, v in {"method": method, "r": r, **options}.items() if v is not None), None)
        if given is not None:
            raise DeploytkError(
                f"`model` is the export {directory}, whose method and schedule were fixed when it was exported: `{given}=` "
                "cannot change them.",
                hint=f"Leave `{given}=` out to draw that export, or pass the config or model to change instead.",
            )
        if artifacts is not None and Path(artifacts).resolve() != directory.resolve():
            raise DeploytkError(
                f"`model` is the export {directory} and `artifacts={artifacts}` another folder: with an export as `model`, its "
                "own graph is the one a runtime runs.",
                hint="Leave `artifacts=` out, or pass the config the other export was made from as `model`.",
            )
        return load(directory).visualize(image, output=output, layers=layers, backend=backend, colors=colors, progress=progress)
    cfg, _ = resolve(model, "deploytk.visualize()", method=method, r=r, **options)
    report = draw(
        cfg,
        Path(image),
        output=Path(output),
        layers=",".join(str(v) for v in layers) if isinstance(layers, list) else layers,
        backend=backend,
        artifacts=Path(artifacts) if artifacts is not None else None,
        colors=colors,
        config_name=config_name or _name_of(model),
        progress=progress or SILENT,
    )
    return VisualizationReport(report)


def _export_folder(model: ModelLike) -> Path | None:
    """``model`` as an export's folder (it holds a manifest.json), else None; a folder that is neither an export nor an
    ``hf:`` name is refused here, saying what ``model`` may be, instead of being looked up as a timm name."""
    if not isinstance(model, (str, Path)) or str(model).startswith(HF_PREFIX) or not Path(model).is_dir():
        return None
    if (Path(model) / MANIFEST_FILE).is_file():
        return Path(model)
    raise DeploytkError(
        f"`model` is the folder {model}, which holds no {MANIFEST_FILE}: it is not a deploytk export.",
        hint="Pass an export's folder (what deploytk.export wrote), a YAML config, a timm name, hf:<folder> for a "
        "transformers model saved with save_pretrained, or the model object.",
    )


def evaluate(
    model: ModelLike,
    data: str | Path,
    *,
    artifacts: str | Path | None = None,
    backend: str = DEFAULT_BACKEND,
    batch_size: int = 64,
    limit: int | None = None,
    method: str | None = None,
    r: Any = None,
    config_name: str | None = None,
    progress: Progress | None = None,
    **options: Any,
) -> EvaluationReport:
    """Top-1/top-5 on an ImageFolder of the dense model, the reduced reference and its export on ``backend``.

    ``config_name``: how the report and errors name the model (as for ``visualize``)."""
    from deploytk.api.inputs import resolve
    from deploytk.evaluation.accuracy import evaluate as evaluate_accuracy
    from deploytk.evaluation.accuracy import scan_image_folder

    if batch_size < 1:
        raise DeploytkError(f"`batch_size={batch_size}`: must be an int >= 1.")
    scan_image_folder(Path(data), limit)  # bad data / limit fail before any model is built
    cfg, _ = resolve(model, "deploytk.evaluate()", method=method, r=r, **options)
    report = evaluate_accuracy(
        cfg,
        Path(data),
        artifacts=Path(artifacts) if artifacts is not None else None,
        batch_size=batch_size,
        limit=limit,
        config_name=config_name or _name_of(model),
        backend=backend,
        progress=progress or SILENT,
    )
    return EvaluationReport(report)


def methods() -> MethodsReport:
    """Every token-reduction method, its paper, options and the ops it exports."""
    from deploytk.reducers import describe_methods

    return MethodsReport({"methods": describe_methods()})


def families() -> FamiliesReport:
    """Every model family: how a config names its models, the classes it runs."""
    from deploytk.adapters import describe_families

    return FamiliesReport({"families": describe_families()})


def doctor() -> DoctorReport:
    """What this environment can run: versions, ONNX Runtime's providers, the GPU, TensorRT, OpenVINO, the pip extras."""
    from deploytk.diagnostics import environment_report

    return DoctorReport(environment_report())


def clean(path: str | Path, dry_run: bool = False) -> CleanReport:
    """Remove what killed deploytk runs left under ``path`` (``.NAME.tmp-*`` / ``.NAME.old-*`` temporaries, lock files
    whose writer is gone); a live writer's entries are listed as in use and never touched. ``dry_run``: list only."""
    from deploytk.files import stale_entries

    entries = stale_entries(Path(path), remove=not dry_run)
    return CleanReport({"path": str(path), "removed": not dry_run, "entries": entries})


def selftest(seed: int = 0, progress: Progress | None = None) -> SelftestReport:
    """Every Triton kernel against its PyTorch reference: natively on a CUDA GPU, or in Triton's interpreter when the
    process was started with ``TRITON_INTERPRET=1`` (small shapes)."""
    from deploytk.ops.selftest import run_selftest

    return SelftestReport(run_selftest(seed, progress or SILENT))
