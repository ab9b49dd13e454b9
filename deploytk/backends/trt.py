"""TensorRT at run time: engine checks, Polygraphy's runner for outputs, CUDA-event timing.

Runs the engines ``deploytk build`` wrote (``model.engine`` and, for profile, ``baseline.engine``)
after checking ``engine.json``: an engine built from another ONNX file, with another TensorRT or
for another GPU, or a batch outside its profile, is refused with the reason before any work.

Written against TensorRT's Python API (10.9+ and 11.x) and NOT RUN here (TensorRT cannot be
installed where deploytk is built; see docs/results/verified-on.md). API used:
``trt.Runtime.deserialize_cuda_engine``, ``ICudaEngine.num_io_tensors`` /
``get_tensor_name`` / ``get_tensor_mode`` / ``get_tensor_dtype``,
``ICudaEngine.create_execution_context``, ``IExecutionContext.set_input_shape`` /
``get_tensor_shape`` / ``set_tensor_address`` / ``execute_async_v3(stream_handle)``;
Polygraphy's ``EngineFromBytes`` and ``TrtRunner``. Everything that needs no libnvinfer (the
checks) is tested.
"""

from __future__ import annotations

from pathlib import Path

import torch

from deploytk.backends.base import Backend, LoadedModel
from deploytk.backends.engine_manifest import check_engine, gpu_identity, read_engine_manifest
from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import BASELINE_ENGINE_FILE, ENGINE_FILE, Artifact
from deploytk.exporter.manifest import sha256_file
from deploytk.inputs import InputKind
from deploytk.optional import require_tensorrt
from deploytk.progress import SILENT, Progress


def check_batch_sizes(engine_manifest: dict, batch_sizes: list[int], what: str) -> None:
    """Every batch size must lie in the engine's optimization profile (min..max)."""
    lo, _, hi = engine_manifest["build"]["batch"]
    outside = [b for b in batch_sizes if not lo <= b <= hi]
    if outside:
        raise DeploytkError(
            f"{what}: batch size(s) {', '.join(map(str, outside))} outside the engine's optimization profile {lo}..{hi}.",
            hint=f"Rebuild the engine (`deploytk build`) with `batch_sizes={min(lo, *outside)},{engine_manifest['build']['batch'][1]},"
            f"{max(hi, *outside)}` or use batch sizes in {lo}..{hi}.",
        )


def checked_engine_manifest(artifact: Artifact, what: str) -> dict:
    """engine.json after checking the engines were built from this ONNX, with this TensorRT, for this GPU."""
    require_tensorrt(what)
    import tensorrt as trt  # optional: guarded above

    manifest = read_engine_manifest(artifact.directory)
    gpu, capability = gpu_identity()
    check_engine(manifest, onnx_sha256=sha256_file(artifact.onnx_path), tensorrt=trt.__version__, compute_capability=capability, gpu=gpu)
    return manifest


def read_engine(directory: Path, what: str, baseline: bool = False) -> bytes:
    """The serialized engine (``baseline``: the unmerged one built alongside unless ``baseline=False``)."""
    path = Path(directory) / (BASELINE_ENGINE_FILE if baseline else ENGINE_FILE)
    if not path.is_file():
        raise DeploytkError(
            f"{what}: {path} is missing (the engine was built with `baseline=False`).",
            hint=f"Rebuild it with `baseline=True` (`deploytk build {directory}`).",
        )
    return path.read_bytes()


class TrtModel(LoadedModel):
    """One engine: outputs through Polygraphy's TrtRunner, latency through ``EngineTimer``."""

    def __init__(self, engine: bytes, kind: InputKind, manifest: dict | None = None):
        self.engine = engine
        self.kind = kind
        #: engine.json: its optimization profile bounds the batch (None: not checked here)
        self.manifest = manifest
        self._runner = None
        self._timer = None

    def activate(self):
        from polygraphy.backend.trt import EngineFromBytes, TrtRunner  # imports tensorrt (optional)

        self._runner = TrtRunner(EngineFromBytes(self.engine), name="tensorrt")
        self._runner.activate()

    def deactivate(self):
        if self._runner is not None:
            self._runner.deactivate()
            self._runner = None

    def check_batch(self, size: int, what: str) -> None:
        if self.manifest is not None:
            check_batch_sizes(self.manifest, [size], what)

    def run(self, batch):
        return dict(self._runner.infer({self.kind.onnx_name: batch}))

    def timer(self, batch_size):
        if self._timer is None:
            self._timer = EngineTimer(self.engine, self.kind.onnx_name)
        self._timer.prepare(batch_size, self.kind.shape)
        return self._timer.time_once


class TrtBackend(Backend):
    name = "trt"
    display_name = "TensorRT"
    timing = "CUDA events around execute_async_v3 (CUDA graph when capturable)"
    runs_onnx = False

    def device(self) -> str:
        return "cuda"

    def needs_build(self, directory: Path) -> bool:
        return not (Path(directory) / ENGINE_FILE).is_file()  # `deploytk build` makes model.engine + baseline.engine

    def load(self, artifact, batch_sizes, graph=None, progress: Progress = SILENT) -> TrtModel:
        what = "validate `backend=trt`"
        manifest = checked_engine_manifest(artifact, what)
        check_batch_sizes(manifest, batch_sizes, what)  # refuse a stale engine before any work
        return TrtModel(read_engine(artifact.directory, what), artifact.input_kind, manifest)

    def load_for_timing(self, artifact, batch_sizes, progress: Progress = SILENT) -> tuple[TrtModel, TrtModel]:
        what = "profile `backend=trt`"
        check_batch_sizes(checked_engine_manifest(artifact, what), batch_sizes, what)
        progress.step("loading the TensorRT engines")
        return tuple(TrtModel(read_engine(artifact.directory, what, baseline), artifact.input_kind) for baseline in (False, True))


class EngineTimer:
    """Times one engine at one batch size with CUDA events around ``execute_async_v3``.

    Input and output buffers are torch CUDA tensors bound once; the enqueue is captured into
    a CUDA graph when TensorRT allows it (TensorRT's documented pattern: one enqueue first,
    then capture), else launched directly. ``cuda_graph`` says which was timed.
    """

    def __init__(self, engine_bytes: bytes, input_name: str):
        import tensorrt as trt  # optional: only reached after require_tensorrt

        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = self.runtime.deserialize_cuda_engine(engine_bytes)
        if self.engine is None:
            raise DeploytkError(
                "TensorRT could not deserialize the engine (see its log above).",
                hint="Rebuild it with `deploytk build DIR` on this machine.",
            )
        self.context = self.engine.create_execution_context()
        self.input_name = input_name
        self.stream = torch.cuda.Stream()
        self.dtypes = {
            trt.float32: torch.float32,
            trt.float16: torch.float16,
            trt.bfloat16: torch.bfloat16,
            trt.int32: torch.int32,
            trt.int64: torch.int64,
        }
        self.is_input = {
            name: self.engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            for name in (self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors))
        }
        self.graph = None
        self.cuda_graph = False

    def prepare(self, batch: int, sample_shape: tuple[int, ...]) -> None:
        if not self.context.set_input_shape(self.input_name, (batch, *sample_shape)):
            raise DeploytkError(f"TensorRT refused input shape {(batch, *sample_shape)} (outside the engine's optimization profile?).")
        self.buffers = {}
        for name, is_input in self.is_input.items():
            shape = tuple(self.context.get_tensor_shape(name))
            dtype = self.dtypes.get(self.engine.get_tensor_dtype(name))
            if dtype is None or -1 in shape:
                raise DeploytkError(
                    f"engine tensor {name!r} ({self.engine.get_tensor_dtype(name)}, shape {shape}) is not a deploytk "
                    "graph's: expected fp32/fp16/bf16/int tensors with static shapes once the batch is set."
                )
            t = torch.randn(shape, device="cuda").to(dtype) if is_input else torch.empty(shape, dtype=dtype, device="cuda")
            self.buffers[name] = t
            self.context.set_tensor_address(name, t.data_ptr())
        self.stream.wait_stream(torch.cuda.current_stream())  # the inputs were written on the current stream
        self._enqueue()  # also lets TensorRT finish deferred work before a capture
        self.stream.synchronize()
        self.graph, self.cuda_graph = None, False
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=self.stream, capture_error_mode="thread_local"):  # as trtexec captures
                self._enqueue()
            self.graph, self.cuda_graph = graph, True
        except Exception:  # some plugins/layers cannot be captured: time the plain enqueue
            torch.cuda.synchronize()

    def _enqueue(self) -> None:
        if not self.context.execute_async_v3(self.stream.cuda_stream):
            raise DeploytkError("TensorRT's execute_async_v3 failed (see its log above).")

    def time_once(self) -> float:
        """Seconds of one inference on the GPU (CUDA events on the engine's stream)."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            start.record(self.stream)
            if self.graph is not None:
                self.graph.replay()
            else:
                self._enqueue()
            end.record(self.stream)
        end.synchronize()
        return start.elapsed_time(end) / 1e3
