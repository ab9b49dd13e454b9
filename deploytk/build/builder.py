"""`deploytk build`: parse the artifact's ONNX with the deploytk plugins registered and build an engine.

Written against TensorRT's Python API (10.9+ and 11.x) and NOT RUN (TensorRT cannot be
installed where deploytk is built): ``trt.Builder``, ``Builder.create_network`` with
``NetworkDefinitionCreationFlag.STRONGLY_TYPED`` (TensorRT 11 networks are always strongly
typed: precision comes from the graph), ``trt.OnnxParser.parse`` / ``get_error``,
``Builder.create_optimization_profile`` + ``IOptimizationProfile.set_shape`` (min/opt/max
batch), ``IBuilderConfig.builder_optimization_level``, ``create_timing_cache`` /
``set_timing_cache`` / ``ITimingCache.serialize``, ``IBuilderConfig.progress_monitor`` (an
``trt.IProgressMonitor`` with ``phase_start``/``step_complete``/``phase_finish``) and
``Builder.build_serialized_network``. Plugin nodes carry ``aot=1``: onnx-tensorrt then
requires the AOT implementation, so the engine embeds the PTX and needs no Python at run time.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import onnx
from deploytk_plugins.aot import arch_of_capability, check_arch
from deploytk_plugins.tensorrt_plugins import PLUGIN_OPS, register_plugins
from onnx import helper

from deploytk.backends.engine_manifest import engine_manifest, gpu_identity
from deploytk.build.graph import check_tensorrt_supports, prepare_for_build
from deploytk.build.options import BuildOptions
from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import BASELINE_ENGINE_FILE, ENGINE_FILE, ENGINE_MANIFEST_FILE, MODEL_FILE, Artifact, require_artifact_dir
from deploytk.exporter.baseline import baseline_onnx
from deploytk.exporter.manifest import now_utc, sha256_file
from deploytk.exporter.onnx_io import runnable
from deploytk.files import write_atomically
from deploytk.inputs import InputKind
from deploytk.optional import require_tensorrt
from deploytk.progress import SILENT, Progress


def _force_aot(model: onnx.ModelProto, plugin_ops: list[str]) -> None:
    for node in model.graph.node:
        names = {a.name for a in node.attribute}
        if node.op_type in plugin_ops and "plugin_namespace" in names and "aot" not in names:
            node.attribute.append(helper.make_attribute("aot", 1))


def build_engine(directory: Path, options: BuildOptions, progress: Progress = SILENT) -> dict:
    """Build DIR/model.engine (+ DIR/baseline.engine) and DIR/engine.json, written only once the engines exist."""
    require_artifact_dir(Path(directory))
    # an ort int8 graph has uint8 activations, which TensorRT does not take: said before TensorRT is even looked for
    Artifact.open(directory, verify=False).require_runtime("deploytk build (TensorRT)", ("trt",))
    require_tensorrt("deploytk build")
    import tensorrt as trt  # optional: guarded above

    artifact = Artifact.open(directory)  # also checks model.onnx against its sha256
    directory = artifact.directory
    gpu, capability = gpu_identity()
    exported = onnx.load(str(artifact.onnx_path))
    check_tensorrt_supports(exported, options, trt.__version__)
    model, plugin_ops = prepare_for_build(exported, options, PLUGIN_OPS)
    if plugin_ops:
        check_arch(arch_of_capability(capability))  # before the build, not mid-build inside aot_impl
        progress.step("registering the deploytk plugins")
        register_plugins()
    _force_aot(model, plugin_ops)

    logger = trt.Logger(trt.Logger.WARNING)
    if options.merge_impl == "native":
        # TokenAggregate's inlined body scatters with reduction="min"/"add", which TensorRT's ONNX parser maps to
        # the scatterElements plugin of its own plugin library: registered here, before parsing
        trt.init_libnvinfer_plugins(logger, "")
    kind = artifact.input_kind
    serialized, seconds = _build(trt, logger, model, options, kind, directory / MODEL_FILE, progress, "merged model")
    baseline = None
    if options.baseline:
        progress.step("exporting the unmerged baseline (same weights and precision)")
        dense_path = baseline_onnx(artifact)
        dense_bytes, dense_seconds = _build(trt, logger, onnx.load(str(dense_path)), options, kind, dense_path, progress, "baseline")
        baseline = {"file": BASELINE_ENGINE_FILE, "onnx_sha256": sha256_file(dense_path), "build_seconds": round(dense_seconds, 1)}
        write_atomically(directory / BASELINE_ENGINE_FILE, dense_bytes)
    record = engine_manifest(
        onnx_sha256=sha256_file(directory / MODEL_FILE),
        tensorrt=trt.__version__,
        gpu=gpu,
        compute_capability=capability,
        options=options.model_dump(mode="json"),
        plugin_ops=plugin_ops,
        build_seconds=seconds,
        created=now_utc(),
        baseline=baseline,
    )
    write_atomically(directory / ENGINE_FILE, serialized)
    write_atomically(directory / ENGINE_MANIFEST_FILE, json.dumps(record, indent=2) + "\n")
    return record


def _build(trt, logger, model: onnx.ModelProto, options: BuildOptions, kind: InputKind, source: Path, progress: Progress, what: str):
    """Parse ``model`` into a strongly typed network and build it: (serialized engine, seconds)."""
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    progress.step(f"parsing the ONNX ({what})")
    with runnable(model) as graph:  # bytes, or a temporary file with external data past protobuf's limit
        parsed = parser.parse(graph) if isinstance(graph, bytes) else parser.parse_from_file(graph)
    if not parsed:
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise DeploytkError(
            f"TensorRT's ONNX parser rejected {source}: {errors}",
            hint="Try `merge_impl=native` / `attention_impl=native` to isolate a plugin problem.",
        )

    config = builder.create_builder_config()
    config.builder_optimization_level = options.opt_level
    lo, opt, hi = options.batch
    profile = builder.create_optimization_profile()
    profile.set_shape(kind.onnx_name, kind.batch_shape(lo), kind.batch_shape(opt), kind.batch_shape(hi))
    config.add_optimization_profile(profile)
    cache_path = Path(options.timing_cache) if options.timing_cache else None
    attach_timing_cache(config, cache_path)
    config.progress_monitor = _progress_monitor(trt, progress)

    progress.step(f"building the {what} engine (minutes)")
    t0 = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise DeploytkError(
            f"TensorRT could not build the {what} engine (see its log above).",
            hint="Try a smaller max in `batch_sizes=`, `opt_level=2`, or the native paths.",
        )
    seconds = time.perf_counter() - t0
    if cache_path:
        write_atomically(cache_path, bytes(memoryview(config.get_timing_cache().serialize())))
    return bytes(serialized), seconds


def attach_timing_cache(config, cache_path: Path | None) -> None:
    """Give the build the timing cache at ``cache_path`` (a new one when the file does not exist yet), or refuse it.

    TensorRT's ``create_timing_cache`` returns None for bytes that are not a timing cache, and
    ``set_timing_cache(..., ignore_mismatch=False)`` returns False for a cache made on another GPU
    or TensorRT version: both are refused here, before the build, so the user's file is never
    overwritten by a cache of this device.
    """
    data = cache_path.read_bytes() if cache_path and cache_path.is_file() else b""
    cache = config.create_timing_cache(data)
    if cache is None:
        if data:
            raise DeploytkError(
                f"{cache_path} is not a TensorRT timing cache (or it is damaged): TensorRT could not read it.",
                hint="Delete it, or pass a new `timing_cache=` path; the build writes a fresh cache there.",
            )
        raise DeploytkError("TensorRT could not create an empty timing cache.")
    if not config.set_timing_cache(cache, ignore_mismatch=False):
        raise DeploytkError(
            f"{cache_path} was made on another GPU or with another TensorRT version, so TensorRT will not use it; it was left as it is.",
            hint="Keep one `timing_cache=` file per GPU model and TensorRT version, e.g. timing-H100-10.13.cache.",
        )


def _progress_monitor(trt, progress: Progress):
    """trt.IProgressMonitor reporting build phases through ``progress`` (the CLI's progress line)."""

    class Monitor(trt.IProgressMonitor):
        def __init__(self):
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name, parent_phase, num_steps):
            progress.step(f"TensorRT: {phase_name} ({num_steps} steps)")

        def step_complete(self, phase_name, step_index):
            return True  # False would cancel the build

        def phase_finish(self, phase_name):
            pass

    return Monitor()
