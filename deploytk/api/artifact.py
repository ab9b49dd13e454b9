"""``deploytk.Artifact``: an export folder as a Python object, with the verbs that act on one.

Each method calls the same library function the CLI command does and returns its typed report; ``runner`` runs the
artifact from Python with numpy arrays in and out, whatever the runtime.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from deploytk.api.renamed import old_names
from deploytk.api.reports import (
    BuildReport,
    EvaluationReport,
    InspectReport,
    PackageReport,
    ProfileReport,
    ValidationReport,
    VisualizationReport,
)
from deploytk.defaults import DEFAULT_BACKEND, DEFAULT_CALIBRATION_IMAGES
from deploytk.defaults import VISUALIZE_REFERENCE as REFERENCE
from deploytk.errors import DeploytkError
from deploytk.exporter import artifacts
from deploytk.inputs import InputKind
from deploytk.progress import SILENT, Progress

if TYPE_CHECKING:
    from deploytk.backends import LoadedModel
    from deploytk.inputs.preprocess import ImagePipeline

# Each verb imports the library code it runs when it runs: opening an artifact (``deploytk.load``) needs none of it,
# and torch, ONNX Runtime and OpenVINO take seconds to import.


def _backends(backend: str | list[str] | tuple[str, ...]) -> list[str]:
    names = backend.split(",") if isinstance(backend, str) else list(backend)
    return [name.strip() for name in names if name.strip()]


class Runner:
    """The artifact loaded on one runtime, loaded once. ``runner(inputs)`` returns the first output (logits, embedding,
    ...), ``runner.run(inputs)`` every output by name.

    ``inputs`` is the model's own input as float32 (an image model's [batch, 3, H, W], a video model's [batch, frames,
    3, H, W], an audio model's [batch, time, mel]; ``input`` in the repr), or, where the artifact records its
    preprocessing (``Artifact.preprocessing``), images: a file path, a PIL image, a uint8 [H, W, 3] / [N, H, W, 3]
    array or a list of these, preprocessed as the model's own eval transform does. A torch tensor in gives torch
    tensors out, numpy gives numpy. ``with artifact.runner("ort") as run:`` keeps the runtime's context acquired
    between calls (a TensorRT execution context) and releases it at the end; outside a ``with`` each call acquires and
    releases it. One runner serves one thread at a time."""

    def __init__(self, artifact: artifacts.Artifact, backend: str):
        from deploytk.backends import get_backend

        self.backend = backend
        self.output_name = artifact.output_name
        self.img_size = artifact.img_size
        self.input_kind = artifact.input_kind
        self._artifact = artifact
        self._loaded: LoadedModel = get_backend(backend, validating=True).load(artifact, [1])
        self._active = 0  # nested `with` blocks: the context is acquired by the first and released by the last

    def run(self, inputs: Any) -> dict[str, Any]:
        """Every output by name, for ``inputs`` as ``Runner`` takes them.

        Args:
            inputs: float32 model input (numpy or torch), or images where the artifact records its preprocessing.
        """
        batch, torch_out = model_input(self._artifact, inputs, "`inputs`")
        self._loaded.check_batch(batch.shape[0], f"the runner on {self.backend}")
        if not self._active:
            self._loaded.activate()
        try:
            outputs = dict(self._loaded.run(batch))
        finally:
            if not self._active:
                self._loaded.deactivate()
        if torch_out:
            import torch

            return {name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in outputs.items()}
        return outputs

    def __call__(self, inputs: Any) -> Any:
        return self.run(inputs)[self.output_name]

    def __enter__(self) -> Runner:
        if not self._active:
            self._loaded.activate()
        self._active += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._active -= 1
        if not self._active:
            self._loaded.deactivate()

    def __repr__(self) -> str:
        return f"Runner(backend={self.backend!r}, input={self.input_kind.describe()!r}, output={self.output_name!r})"


def model_input(artifact: artifacts.Artifact, inputs: Any, what: str) -> tuple[np.ndarray, bool]:
    """(``inputs`` as the graph's float32 batch, whether they came as a torch tensor): images through the recorded
    preprocessing, the model's own float input checked against its shape; uint8 pixels in the model's layout are
    refused, as they would run un-normalised."""
    from deploytk.inputs.preprocess import as_images

    images = as_images(inputs)
    if images is not None:
        return artifact_pipeline(artifact).apply_all(images), False
    torch = sys.modules.get("torch")  # a tensor exists only where torch was imported: nothing to import for numpy
    torch_in = torch is not None and isinstance(inputs, torch.Tensor)
    array = inputs.detach().cpu().numpy() if torch_in else np.asarray(inputs)
    if array.dtype == np.uint8 or not np.issubdtype(array.dtype, np.floating):
        raise DeploytkError(
            f"{what} is a {array.dtype} array of shape {list(array.shape)} in the model's layout: it would run without the "
            "model's resize and normalisation.",
            hint="Pass images (paths, PIL images, uint8 [N, H, W, 3]) for the recorded preprocessing, or the model's input "
            "as float32, already preprocessed.",
        )
    batch = np.ascontiguousarray(array, dtype=np.float32)
    artifact.input_kind.check_batch(batch, what)
    return batch, torch_in


def artifact_pipeline(artifact: artifacts.Artifact) -> ImagePipeline:
    """The artifact's recorded preprocessing, or a refusal that says why there is none and what to pass instead."""
    from deploytk.inputs.preprocess import ImagePipeline

    record = artifact.manifest.get("preprocess")
    if not record or record.get("kind") is None:
        why = (record or {}).get("reason") or "it was exported before deploytk recorded preprocessing"
        raise DeploytkError(
            f"{artifact.directory} records no preprocessing ({why}), so it cannot turn images into its input.",
            hint=f"Pass the model's input as float32 ({artifact.input_kind.describe()}), preprocessed as the model expects"
            + ("" if record else ", or export the model again"),
            parameter="inputs",
        )
    return ImagePipeline.from_record(record)


class Artifact:
    """An export folder (model.onnx + manifest.json), opened and checked (``deploytk.load``, or what ``deploytk.export``
    returns). ``to_dict()`` is what ``deploytk export`` prints as JSON."""

    def __init__(self, directory: str | Path):
        self._artifact = artifacts.Artifact.open(Path(directory))

    @property
    def directory(self) -> Path:
        return self._artifact.directory

    @property
    def manifest(self) -> dict[str, Any]:
        """The sealed manifest: the config, the model, the schedule, FLOPs, the files' sha256."""
        return self._artifact.manifest

    @property
    def onnx_path(self) -> Path:
        return self._artifact.onnx_path

    @property
    def img_size(self) -> tuple[int, int]:
        return self._artifact.img_size

    @property
    def input_kind(self) -> InputKind:
        """What one sample of the model's input is (an image, a clip, a spectrogram): its ONNX name and shape,
        ``input_kind.describe()`` in words, ``input_kind.synthetic(batch, rng)`` a batch of it."""
        return self._artifact.input_kind

    @property
    def output_names(self) -> list[str]:
        return self._artifact.output_names

    @property
    def rebuild_problem(self) -> str | None:
        """Why another process cannot rebuild this artifact's PyTorch reference (what ``validate``, ``inspect`` and
        ``evaluate`` compare with), or None where it can: only an export of a model object deploytk could not store has one
        (the manifest's ``model.source.cannot_rebuild``), decided at export."""
        source = self.manifest["model"].get("source")
        if source is None or source.get("rebuild") is not None:
            return None
        return str(source.get("cannot_rebuild") or "its architecture was not stored")

    @property
    def rebuildable(self) -> bool:
        """Whether a process other than the exporting one can rebuild the PyTorch reference (``rebuild_problem``: why not)."""
        return self.rebuild_problem is None

    @property
    def notes(self) -> list[str]:
        """What the export said about this artifact (the manifest's ``notes``): a schedule capped to what the model can
        take, a reference that cannot be rebuilt in another process. ``deploytk.export`` warns each as it returns."""
        return list((self.manifest.get("notes") or {}).values())

    def to_dict(self) -> dict[str, Any]:
        """``{"directory": DIR, **manifest}``: the JSON output of the CLI's ``export`` and ``quantize``. Not ``output``:
        the manifest has an ``output`` of its own (what the graph outputs), which would hide the folder."""
        return {"directory": str(self.directory), **self.manifest}

    def __repr__(self) -> str:
        m = self.manifest
        merge = m["config"]["merge"]
        r = f", r={merge['r']!r}" if "r" in merge else ""
        ratio = m["gflops"] / m["dense_gflops"] if m.get("dense_gflops") else float("nan")
        return (
            f"Artifact({str(self.directory)!r}, model={m['model']['name']!r}, method={merge['method']!r}{r}, "
            f"{m['gflops']:.2f} GFLOPs ({ratio:.2f} of dense), outputs={self.output_names})"
        )

    @old_names("validate")
    def validate(
        self,
        backend: str | list[str] = DEFAULT_BACKEND,
        *,
        data: str | Path | None = None,
        num_samples: int = 64,
        batch_size: int = 8,
        atol: float | None = None,
        rtol: float | None = None,
        min_cosine: float | None = None,
        min_top1_agreement: float | None = None,
        max_flipped_choices: float | None = None,
        max_branch_flips: float | None = None,
        progress: Progress | None = None,
    ) -> ValidationReport:
        """Compare each backend's outputs with the fp32 PyTorch reference (run once); tolerances default by precision.

        ``max_flipped_choices``: the largest share of matching decisions (one per token per matching op per image) that
        may differ from the reference's at proven near-ties. ``max_branch_flips`` (deprecated, judged only where given):
        the largest share of images that may.

        Args:
            backend: one runtime or several (``"ort,openvino"`` or a list): ort, ort-cuda, openvino, trt; each is judged
                against one run of the reference.
            data: a folder of inputs (images, clips or sounds, as the model takes) instead of seeded synthetic ones.
            num_samples: how many inputs are compared.
            batch_size: inputs per batch.
            atol: largest absolute difference of the outputs. None: the precision's default.
            rtol: largest relative difference. None: the precision's default.
            min_cosine: smallest per-input cosine similarity. None: the precision's default.
            min_top1_agreement: smallest share of inputs whose top-1 class agrees. None: the precision's default.
            max_flipped_choices: largest share of matching decisions flipped at proven near-ties. None: the default.
            max_branch_flips: deprecated; largest share of images with a flip, judged only where given.
            progress: where progress is reported (the CLI draws it); None: silent.
        """
        from deploytk.validate.validator import run_validations

        reports, _ = run_validations(
            self.directory,
            list(_backends(backend)),  # a list of str | Backend, as run_validations takes
            data=Path(data) if data is not None else None,
            num_samples=num_samples,
            batch_size=batch_size,
            progress=progress or SILENT,
            atol=atol,
            rtol=rtol,
            min_cosine=min_cosine,
            min_top1_agreement=min_top1_agreement,
            max_flipped_choices=max_flipped_choices,
            max_branch_flips=max_branch_flips,
        )
        return ValidationReport(
            {"passed": all(r.passed for r in reports), "backends": [r.backend for r in reports], "reports": [r.to_dict() for r in reports]}
        )

    def profile(
        self,
        backend: str = DEFAULT_BACKEND,
        *,
        batch_sizes: str | list[int] | tuple[int, ...] = (1, 8),
        warmup: int = 5,
        iterations: int = 20,
        progress: Progress | None = None,
    ) -> ProfileReport:
        """Latency of the reduced model and of the same weights unreduced, alternating in one run.

        Args:
            backend: the runtime: ort, ort-cuda, openvino, torch or trt.
            batch_sizes: the batch sizes timed: a list, or text such as ``"1,8"``.
            warmup: untimed runs before timing, per batch size and model.
            iterations: timed runs per batch size and model.
            progress: where progress is reported; None: silent.
        """
        from deploytk.profile.profiler import parse_batch_sizes
        from deploytk.profile.profiler import profile as profile_artifact

        sizes = parse_batch_sizes(batch_sizes) if isinstance(batch_sizes, str) else list(batch_sizes)
        return ProfileReport(profile_artifact(self.directory, backend, sizes, warmup, iterations, progress or SILENT))

    @old_names("quantize")
    def quantize(
        self,
        backend: str,
        *,
        output: str | Path | None = None,
        data: str | Path | None = None,
        synthetic: int | None = None,
        num_samples: int = DEFAULT_CALIBRATION_IMAGES,
        force: bool = False,
        progress: Progress | None = None,
    ) -> Artifact:
        """INT8 for one runtime (openvino, ort, trt), calibrated on ``data`` (a folder of inputs) or ``synthetic`` seeded
        inputs: a new artifact (default: this folder's name + ``-int8-BACKEND`` beside it).

        Args:
            backend: the runtime the int8 model is for: openvino, ort or trt.
            output: the new artifact's folder. None: this folder's name + ``-int8-BACKEND`` beside it.
            data: a folder of calibration inputs.
            synthetic: this many seeded synthetic inputs instead of ``data``.
            num_samples: how many calibration inputs are taken from ``data``.
            force: replace an earlier export at ``output``.
            progress: where progress is reported; None: silent.
        """
        from deploytk.quantize import default_output, run_quantize

        target = Path(output) if output is not None else default_output(self.directory, backend)
        run_quantize(
            self.directory,
            backend,
            output=target,
            data=Path(data) if data is not None else None,
            synthetic=synthetic,
            num_samples=num_samples,
            force=force,
            progress=progress or SILENT,
        )
        return Artifact(target)

    @old_names("package")
    def package(
        self,
        triton: str | Path,
        *,
        name: str | None = None,
        max_batch: int | None = None,
        backend: str | None = None,
        data: str | Path | None = None,
        force: bool = False,
        progress: Progress | None = None,
    ) -> PackageReport:
        """A Triton Inference Server model repository entry (config.pbtxt, the model, README) under ``triton``.

        Args:
            triton: the model repository folder the entry is written into.
            name: the model's name in the repository. None: the artifact folder's name.
            max_batch: Triton's ``max_batch_size``. None: 8 for ONNX, a TensorRT engine's profile maximum.
            backend: the runtime Triton serves it with: ort, openvino or trt (Triton's onnxruntime, openvino or
                tensorrt backend). None: trt where the folder has an engine, else ort.
            data: with ``backend="openvino"``, a folder of the model's inputs the IR is validated on before it is
                written. None: seeded synthetic inputs.
            force: replace an earlier entry of the same name.
            progress: where progress is reported; None: silent.
        """
        from deploytk.package import package_triton

        return PackageReport(
            package_triton(
                self.directory,
                Path(triton),
                name=name,
                max_batch=max_batch,
                force=force,
                progress=progress or SILENT,
                backend=backend,
                data=Path(data) if data is not None else None,
            )
        )

    @old_names("build")
    def build(
        self,
        *,
        batch_sizes: str | tuple[int, int, int] = "1,8,64",
        merge_impl: str = "plugin",
        attention_impl: str = "plugin",
        opt_level: int = 3,
        timing_cache: str | Path | None = None,
        baseline: bool = True,
        progress: Progress | None = None,
    ) -> BuildReport:
        """The TensorRT engine (and the dense baseline's) with deploytk's plugins: needs TensorRT and an NVIDIA GPU.

        Args:
            batch_sizes: the engine's batch profile, ``"min,opt,max"`` or a tuple of three.
            merge_impl: ``plugin`` (the matching ops and TokenAggregate as deploytk's plugins) or ``native`` (TensorRT
                inlines their standard-op bodies).
            attention_impl: how proportional attention is built: ``plugin`` or ``native`` (TensorRT's own attention).
            opt_level: TensorRT's builder optimisation level.
            timing_cache: a timing cache file to read and update. None: none.
            baseline: also build the dense baseline engine that ``profile`` compares with.
            progress: where progress is reported; None: silent.
        """
        from deploytk.build.builder import build_engine
        from deploytk.build.options import build_options

        spec = batch_sizes if isinstance(batch_sizes, str) else ",".join(str(b) for b in batch_sizes)
        options = build_options(
            spec,
            merge_impl=merge_impl,
            attention_impl=attention_impl,
            opt_level=opt_level,
            timing_cache=str(timing_cache) if timing_cache else None,
            baseline=baseline,
        )
        return BuildReport(build_engine(self.directory, options, progress or SILENT))

    def inspect(self, progress: Progress | None = None) -> InspectReport:
        """The exported schedule and GFLOPs per layer (``deploytk inspect`` of the config this artifact was made from).

        Args:
            progress: where progress is reported; None: silent.
        """
        from deploytk.analysis.inspect import inspect_config

        return InspectReport(inspect_config(self._artifact.reference_config, progress or SILENT))

    @old_names("eval")
    def evaluate(
        self,
        data: str | Path,
        *,
        backend: str = DEFAULT_BACKEND,
        batch_size: int = 64,
        num_samples: int | None = None,
        progress: Progress | None = None,
    ) -> EvaluationReport:
        """Top-1/top-5 on an ImageFolder of the dense model, the reference and this artifact on ``backend``.

        Args:
            data: an ImageFolder tree (one folder per class) of the model's inputs.
            backend: the runtime the artifact runs on: ort, ort-cuda, openvino or trt.
            batch_size: inputs per batch.
            num_samples: evaluate this many inputs, taken across the classes. None: all.
            progress: where progress is reported; None: silent.
        """
        from deploytk.evaluation.accuracy import evaluate as evaluate_accuracy

        cfg = self._artifact.reference_config
        return EvaluationReport(
            evaluate_accuracy(
                cfg,
                Path(data),
                artifacts=self.directory,
                batch_size=batch_size,
                num_samples=num_samples,
                config_name=str(self.directory),
                backend=backend,
                progress=progress or SILENT,
            )
        )

    def visualize(
        self,
        image: str | Path,
        *,
        output: str | Path = "merge.png",
        layers: str | list[int] | None = None,
        backend: str = REFERENCE,
        colors: str = "mean",
        progress: Progress | None = None,
    ) -> VisualizationReport:
        """``image`` with every patch coloured by the token it belongs to after each chosen block, written to ``output``
        (``deploytk.visualize`` of this artifact): ``backend="reference"`` draws its PyTorch reference's choices, a runtime
        (``ort``, ``openvino``) the choices this artifact's graph makes there.

        Args:
            image: the input file drawn (an image; a clip or a sound for video and audio models).
            output: the picture written (PNG).
            layers: the blocks after which the tokens are drawn (a list, or text such as ``"3,6,9"``). None: a few evenly
                spaced reducing blocks.
            backend: ``reference`` (the PyTorch reference's choices) or a runtime: ort, ort-cuda, openvino.
            colors: how a token's patches are coloured: ``mean`` (their mean colour) or ``random``.
            progress: where progress is reported; None: silent.
        """
        from deploytk.visualization import visualize as draw

        return VisualizationReport(
            draw(
                self._artifact.reference_config,
                Path(image),
                output=Path(output),
                layers=",".join(str(v) for v in layers) if isinstance(layers, list) else layers,
                backend=backend,
                artifacts=None if backend == REFERENCE else self.directory,
                colors=colors,
                config_name=str(self.directory),
                progress=progress or SILENT,
            )
        )

    def runner(self, backend: str = DEFAULT_BACKEND) -> Runner:
        """A callable that runs this artifact on ``backend``, loaded once (``Runner``: images or the model's input in,
        numpy or torch out as it came; ``with artifact.runner() as run:`` keeps it ready between calls).

        Args:
            backend: the runtime: ort, openvino, ort-cuda or trt.
        """
        return Runner(self._artifact, backend)

    @property
    def preprocessing(self) -> dict[str, Any] | None:
        """The recorded input pipeline (the manifest's ``preprocess``: resize, crop, rescale, mean, std), or None where
        none is recorded (``manifest["preprocess"]["reason"]`` says why)."""
        record = self.manifest.get("preprocess")
        return record if record and record.get("kind") is not None else None

    def preprocess(self, images: Any) -> np.ndarray:
        """``images`` as the model's input batch, float32, through the recorded preprocessing (no torch needed).

        Args:
            images: a file path, a PIL image, a uint8 [H, W, 3] or [N, H, W, 3] RGB array, or a list of these.
        """
        from deploytk.inputs.preprocess import as_images

        given = as_images(images)
        if given is None:
            raise DeploytkError(
                f"`images` is a {type(images).__name__}, not images: preprocess takes file paths, PIL images or uint8 [N, H, W, 3] arrays.",
                parameter="images",
            )
        return artifact_pipeline(self._artifact).apply_all(given)

    def __call__(self, inputs: Any) -> Any:
        """The first output for ``inputs`` (as ``Runner`` takes them) on ONNX Runtime, loaded on first use and kept."""
        if getattr(self, "_default_runner", None) is None:
            self._default_runner = Runner(self._artifact, DEFAULT_BACKEND)
        return self._default_runner(inputs)
