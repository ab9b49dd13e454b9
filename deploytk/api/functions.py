"""The Python API's verbs: the same jobs as the CLI's commands, from whatever model the caller holds.

``model`` may be a ``torch.nn.Module`` of a supported family (never changed: deploytk works on a copy), a timm name, an
``hf:`` name or folder, a YAML config path, a ready-made config's name (``deploytk.configs()``) or a ``DeployConfig``.
Keyword arguments override the config; method options
(``keep_rate=0.7``) are keywords too, checked by the method's own schema.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploytk.api.artifact import Artifact
from deploytk.api.renamed import old_names
from deploytk.api.reports import (
    CalibrationReport,
    CleanReport,
    ConfigsReport,
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
    preprocess: dict[str, Any] | None = None,
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

    Args:
        model: what to export: a ``torch.nn.Module``, a timm name, an ``hf:`` name or folder, a YAML config path, a
            ready-made config's name or a ``DeployConfig``.
        output: the folder to write: new, empty or an earlier export. None: ``artifacts/<config stem>`` for a YAML path,
            else ``artifacts/<model>-<method>``.
        method: the token-reduction method (``deploytk.methods()``). None: the config's, else tome.
        r: tokens merged per block: an int, one int per block, ``(r, inflection)`` or the CLI's text (``"16:-1"``).
            None: the config's (16 where the method takes r).
        options: method options as a dict, merged with ``**method_options``. None: the config's.
        img_size: the input size: an int (square) or ``(H, W)``. None: the config's; a model object keeps its own size.
        precision: the graph's precision: fp32, fp16 or bf16. None: the config's (fp32 by default).
        output_kind: what the graph outputs: logits, embedding, patch_features or tokens. None: the model's own.
        feature_layer: with patch_features or tokens, the hidden state after this many blocks (negative: from the end).
            None: the model's final features.
        batch_size: the example batch the export traces; the batch axis stays dynamic. None: the config's (8 by default).
        checkpoint: a .safetensors / .pth state_dict or a JAX .npz to load. None: the config's; a model object keeps its
            own weights.
        fmt: ``"onnx"`` (the default): model.onnx; ``"onnx-inlined"``: also model.inlined.onnx, standard ops only (OpenVINO);
            ``"onnx-ort"``: also model.ort.onnx, fused for ONNX Runtime's CPU (fp32 or fp16 only).
        force: ``output`` is an earlier export that also holds other files: replace the export's own files and keep the
            others. False: such a folder is refused.
        preprocess: the input pipeline to record in the manifest (a record as ``Artifact.preprocessing`` shows one:
            resize, crop, rescale, mean, std), for a model whose own preprocessing deploytk does not record (a saved
            transformers image processor). None: the family's own, where it has one.
        progress: receives the steps as they run (the CLI's draws them). None: silent.
        **method_options: method options as keywords (``keep_rate=0.7``), checked by the method's schema.

    ```python
    import timm
    import deploytk

    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, depth=2, num_classes=10)
    artifact = deploytk.export(model, "artifacts/tiny", method="tome", r=2)
    assert artifact.validate(num_samples=8).passed
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
        run_export(cfg, target, progress or SILENT, fmt, force=force, source=held, preprocess=preprocess)
    finally:
        if held is not None:
            held.close()
    artifact = Artifact(target)
    for topic, note in (artifact.manifest.get("notes") or {}).items():
        warnings.warn(NotRebuildableWarning(note) if topic == NOTE_NOT_REBUILDABLE else ExportNotice(note), stacklevel=2)
    return artifact


def load(directory: str | Path) -> Artifact:
    """An earlier export, checked (its manifest's seal, model.onnx's sha256).

    Args:
        directory: the folder ``export`` wrote (model.onnx + manifest.json).
    """
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

    Args:
        model: a ``torch.nn.Module`` of a supported family (a timm or transformers ViT); deploytk works on a copy.
        method: the token-reduction method (``deploytk.methods()``); tome by default.
        r: tokens merged per block: an int, one int per block, ``(r, inflection)`` or the CLI's text (``"16:-1"``).
            None: 16 where the method takes r.
        prop_attn: proportional attention: log(token size) added to the attention logits. True by default.
        output_kind: what the model outputs: logits, embedding, patch_features or tokens. None: the model's own.
        feature_layer: with patch_features or tokens, the hidden state after this many blocks (negative: from the end).
            None: the model's final features.
        **options: method options as keywords (``keep_rate=0.7``), checked by the method's schema.

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
    model: ModelLike,
    *,
    method: str | None = None,
    r: Any = None,
    schedules: list[Any] | None = None,
    progress: Progress | None = None,
    **options: Any,
) -> InspectReport:
    """Token schedule and GFLOPs (fvcore convention) per layer and in total; weights do not matter. An answer for a
    config file or name is kept on disk (``deploytk.analysis.inspect_cache``): asking again takes a file read.

    With ``schedules``, one answer per r (the unreduced model counted once), under ``report["schedules"]``: picking r
    costs one run, ``deploytk.inspect("deit_small_tome_r16", schedules=[4, 8, 12, 16])``.

    Args:
        model: what to inspect: a ``torch.nn.Module``, a timm name, an ``hf:`` name or folder, a YAML config path, a
            ready-made config's name or a ``DeployConfig``.
        method: the token-reduction method (``deploytk.methods()``). None: the config's, else tome.
        r: tokens merged per block: an int, one int per block, ``(r, inflection)`` or the CLI's text (``"16:-1"``).
            None: the config's (16 where the method takes r).
        schedules: several r specs (each as ``r`` takes it) to inspect in one run instead of ``r``.
        progress: receives the steps as they run (the CLI's draws them). None: silent.
        **options: method options as keywords (``keep_rate=0.7``), checked by the method's schema.
    """
    from deploytk.analysis import inspect_cache

    if schedules is not None and r is not None:
        raise DeploytkError("`r=` and `schedules=` both given; pass one r, or every r as `schedules=`.")
    if schedules is not None and not schedules:
        raise DeploytkError("`schedules=[]` names no schedule; pass at least one r.")
    asked = {"method": method, "r": r, "schedules": schedules, **{f"options.{k}": v for k, v in options.items()}}
    cache_key = inspect_cache.key(model, asked) if isinstance(model, (str, Path)) else None
    answer = inspect_cache.read(cache_key)
    if answer is None:
        answer = _inspect(model, method, r, schedules, progress or SILENT, options)
        inspect_cache.write(cache_key, answer)
    return InspectReport(answer)


def _inspect(
    model: ModelLike, method: str | None, r: Any, schedules: list[Any] | None, progress: Progress, options: dict[str, Any]
) -> dict[str, Any]:
    from deploytk.analysis.inspect import inspect_config, inspect_schedules
    from deploytk.api.inputs import resolve

    if schedules is None:
        cfg, _ = resolve(model, "deploytk.inspect()", method=method, r=r, **options)
        return inspect_config(cfg, progress)
    configs = [resolve(model, "deploytk.inspect()", method=method, r=each, **options)[0] for each in schedules]
    answers = inspect_schedules(configs, progress)
    return {"model": answers[0]["model"], "method": answers[0]["method"], "schedules": answers}


def _config_path(config: Any, where: str) -> Path:
    if isinstance(config, (str, Path)) and Path(config).suffix in CONFIG_SUFFIXES:
        return Path(config)
    raise DeploytkError(
        f"`config` is {config!r}; {where} takes the path of a YAML config, because it writes a new config beside it.",
        hint="Write the model's settings to a YAML file and pass its path; to start from a ready-made config, copy its file "
        "(`deploytk.configs()` gives each one's path).",
    )


@old_names("tune")
def tune(
    config: str | Path,
    budget_ms: float,
    *,
    batch_size: int = 8,
    backend: str = DEFAULT_BACKEND,
    percentile: str = "p50",
    data: str | Path | None = None,
    num_samples: int | None = 256,
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
    default: this Python call. The CLI passes its own, which writes the shell command.

    Args:
        config: the path of a YAML config (.yaml / .yml) whose method's schedule knob is searched.
        budget_ms: the latency budget for one batch, in milliseconds (> 0).
        batch_size: the batch size the budget is for; 8 by default.
        backend: the runtime measured: ort, ort-cuda, openvino, torch or trt; ort by default.
        percentile: the latency statistic held to the budget: p50, p90 (10+ ``iterations``) or p99 (100+); p50 by default.
        data: an ImageFolder (``DIR/<class>/<image>``): also measure top-1 and pick the most accurate candidate within
            budget (logits models only). None: the least aggressive candidate within budget.
        num_samples: with ``data``, the inputs used per candidate (class-interleaved); 256 by default, None: all.
        inflections: r methods (tome, mctf) only: ToMe inflection schedules to search as well, e.g. ``[0, -0.5, -1]``.
            None: the config's.
        output: the tuned config to write (its .json report and .png plot go beside it). None:
            ``<config stem>_tuned.yaml`` in the config's folder.
        cache: where candidate exports are cached, so a rerun exports nothing. None: ``artifacts/tune/<config stem>``.
        warmup: untimed runs per candidate measurement; 3 by default.
        iterations: timed runs per candidate measurement, alternating with the dense model; 10 by default.
        progress: receives the steps as they run (the CLI's draws them). None: silent.
        command_line: spells the report's ``command`` from ``(config, arguments)``. None: this Python call.
    """
    from deploytk.tuning import tune as tune_config

    report = tune_config(
        _config_path(config, "deploytk.tune()"),
        budget_ms,
        batch_size=batch_size,
        backend=backend,
        percentile=percentile,
        data=Path(data) if data is not None else None,
        num_samples=num_samples,
        inflections=inflections,
        output=Path(output) if output is not None else None,
        cache=Path(cache) if cache is not None else None,
        warmup=warmup,
        iterations=iterations,
        progress=progress or SILENT,
        command_line=command_line,
    )
    return TuneReport(report)


@old_names("calibrate")
def calibrate(
    config: str | Path,
    *,
    data: str | Path | None = None,
    synthetic: int | None = None,
    num_samples: int = 256,
    batch_size: int = 16,
    quantile: float = 0.5,
    output: str | Path | None = None,
    progress: Progress | None = None,
) -> CalibrationReport:
    """ATM run dynamically on calibration images, its per-layer r fixed as a new config (``output``).

    Args:
        config: the path of a YAML config (.yaml / .yml) whose method is calibrated (``merge.method: atm``).
        data: a folder of calibration inputs, read recursively and preprocessed as the model's family does. Give
            exactly one of ``data`` and ``synthetic``.
        synthetic: the number of seeded synthetic (standard-normal) inputs to calibrate on instead of ``data``.
        num_samples: the most inputs taken from ``data``; 256 by default.
        batch_size: images per calibration batch (ATM's r adapts per batch); 16 by default.
        quantile: which quantile of the r ATM chose over the batches each layer keeps, floored (0 to 1); 0.5, the median,
            by default.
        output: the new config to write. None: ``<config stem>_calibrated.yaml`` in the config's folder.
        progress: receives the steps as they run (the CLI's draws them). None: silent.
    """
    from deploytk.calibration import calibrate_config

    report = calibrate_config(
        _config_path(config, "deploytk.calibrate()"),
        data=Path(data) if data is not None else None,
        synthetic=synthetic,
        num_samples=num_samples,
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
    passes its CONFIG path with the config object it built).

    Args:
        model: what to draw: an export's folder, a ``torch.nn.Module``, a timm name, an ``hf:`` name or folder, a YAML
            config path, a ready-made config's name or a ``DeployConfig``.
        image: the sample file: an image, a clip (video models) or a sound (audio models).
        output: the PNG to write (atomically); ``merge.png`` by default.
        layers: the 0-based blocks to draw, as a list or text (``"3,6,11"``). None: up to 4 evenly spaced reducing
            blocks, the first and last included.
        backend: whose choices are drawn: ``"reference"`` (the PyTorch reference's, the default) or a runtime running
            the exported graph: ort, ort-cuda or openvino.
        artifacts: with a runtime ``backend``, the model's existing export to run. None: a temporary export.
        colors: ``"mean"``: each token in the mean colour of its patches (the default); ``"random"``: a colour per token.
        method: the token-reduction method (``deploytk.methods()``). None: the config's, else tome. Refused for an export.
        r: tokens merged per block: an int, one int per block, ``(r, inflection)`` or the CLI's text (``"16:-1"``).
            None: the config's. Refused for an export.
        config_name: how the report and errors name the model. None: the name or path given, else "the model"; an
            export is named by its folder.
        progress: receives the steps as they run (the CLI's draws them). None: silent.
        **options: method options as keywords (``keep_rate=0.7``), checked by the method's schema. Refused for an export.
    """
    from deploytk.api.inputs import resolve
    from deploytk.visualization import visualize as draw

    directory = _export_folder(model)
    if directory is not None:
        _refuse_changes(directory, "draw", {"method": method, "r": r, **options})
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


def _refuse_changes(directory: Path, verb: str, keywords: dict[str, Any]) -> None:
    """``model`` is an export, which fixed its method and schedule: any of ``keywords`` given is refused, naming it."""
    given = next((k for k, v in keywords.items() if v is not None), None)
    if given is not None:
        raise DeploytkError(
            f"`model` is the export {directory}, whose method and schedule were fixed when it was exported: `{given}=` cannot change them.",
            hint=f"Leave `{given}=` out to {verb} that export, or pass the config or model to change instead.",
        )


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


@old_names("eval")
def evaluate(
    model: ModelLike,
    data: str | Path,
    *,
    artifacts: str | Path | None = None,
    backend: str = DEFAULT_BACKEND,
    batch_size: int = 64,
    num_samples: int | None = None,
    method: str | None = None,
    r: Any = None,
    config_name: str | None = None,
    progress: Progress | None = None,
    **options: Any,
) -> EvaluationReport:
    """Top-1/top-5 on an ImageFolder of the dense model, the reduced reference and its export on ``backend``.

    ``config_name``: how the report and errors name the model (as for ``visualize``).

    Args:
        model: what to evaluate: a ``torch.nn.Module``, a timm name, an ``hf:`` name or folder, a YAML config path, a
            ready-made config's name, a ``DeployConfig``, or an export's folder (its graph against its reference).
        data: an ImageFolder tree ``DIR/<class>/<image>`` (clips or sounds for video or audio models); the classes are
            the sorted folder names.
        artifacts: an existing export of ``model`` to run (checked to be one). None: a temporary export, removed after.
        backend: the runtime of the exported model: ort, ort-cuda, openvino or trt; ort by default.
        batch_size: images per batch (>= 1); 64 by default.
        num_samples: evaluate only this many inputs, class-interleaved so the subset stays balanced. None: all.
        method: the token-reduction method (``deploytk.methods()``). None: the config's, else tome.
        r: tokens merged per block: an int, one int per block, ``(r, inflection)`` or the CLI's text (``"16:-1"``).
            None: the config's (16 where the method takes r).
        config_name: how the report and errors name the model. None: the name or path given, else "the model".
        progress: receives the steps as they run (the CLI's draws them). None: silent.
        **options: method options as keywords (``keep_rate=0.7``), checked by the method's schema.
    """
    from deploytk.api.inputs import resolve
    from deploytk.evaluation.accuracy import evaluate as evaluate_accuracy
    from deploytk.evaluation.accuracy import scan_image_folder

    if batch_size < 1:
        raise DeploytkError(f"`batch_size={batch_size}`: must be an int >= 1.")
    directory = _export_folder(model)
    if directory is not None:  # an export: its own graph against its own reference
        _refuse_changes(directory, "evaluate", {"method": method, "r": r, "artifacts": artifacts, **options})
        return load(directory).evaluate(data, backend=backend, batch_size=batch_size, num_samples=num_samples, progress=progress)
    scan_image_folder(Path(data), num_samples)  # bad data / num_samples fail before any model is built
    cfg, _ = resolve(model, "deploytk.evaluate()", method=method, r=r, **options)
    report = evaluate_accuracy(
        cfg,
        Path(data),
        artifacts=Path(artifacts) if artifacts is not None else None,
        batch_size=batch_size,
        num_samples=num_samples,
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


def configs(contains: str | None = None) -> ConfigsReport:
    """The ready-made export configs that ship with deploytk: each one's name (what ``export``, ``inspect`` and the CLI
    take instead of a YAML path), what it is, its model, method and schedule, and its file (copy it to make your own).

    Args:
        contains: only the configs whose name, model or method contains this text (any case).
    """
    from deploytk.ready_made import FOLDER, listing

    return ConfigsReport({"folder": str(FOLDER), "configs": listing(contains)})


def doctor() -> DoctorReport:
    """What this environment can run: versions, ONNX Runtime's providers, the GPU, TensorRT, OpenVINO, the pip extras."""
    from deploytk.diagnostics import environment_report

    return DoctorReport(environment_report())


def clean(path: str | Path, dry_run: bool = False) -> CleanReport:
    """Remove what killed deploytk runs left under ``path`` (``.NAME.tmp-*`` / ``.NAME.old-*`` temporaries, lock files
    whose writer is gone); a live writer's entries are listed as in use and never touched. ``dry_run``: list only.

    Args:
        path: a folder outputs were written into; its subfolders are searched too.
        dry_run: list what is stale and remove nothing. False by default: remove it.
    """
    from deploytk.files import stale_entries

    entries = stale_entries(Path(path), remove=not dry_run)
    return CleanReport({"path": str(path), "removed": not dry_run, "entries": entries})


def selftest(seed: int = 0, progress: Progress | None = None) -> SelftestReport:
    """Every Triton kernel against its PyTorch reference: natively on a CUDA GPU, or in Triton's interpreter when the
    process was started with ``TRITON_INTERPRET=1`` (small shapes).

    Args:
        seed: the seed of the randomized shapes and inputs; 0 by default.
        progress: receives the steps as they run (the CLI's draws them). None: silent.
    """
    from deploytk.ops.selftest import run_selftest

    return SelftestReport(run_selftest(seed, progress or SILENT))
