"""OpenVINO on the CPU (``openvino``): the deploytk ops run as their inlined function bodies.

Its rules:
- OpenVINO's ONNX reader does not inline model-local functions of a custom domain, so the graph
  is inlined in memory (``model.onnx`` is never changed);
- its CPU plugin computes in bf16 by default on CPUs with bf16 instructions (AVX512-BF16, AMX),
  which an fp32 graph must not, so the inference precision follows the graph: fp32 -> f32;
  fp16 -> f32 on the graph's fp16 weights and casts (the report says so), because OpenVINO's
  f16 precision, where the CPU has fp16 arithmetic, also lowers the graph's fp32 parts; bf16 ->
  refused, because OpenVINO's bf16 precision also lowers the graph's fp32 parts (matching
  scores, softmax, norms);
- its ONNX reader converts TopK (and ArgMax/ArgMin, which become TopK) with ``stable=False``:
  equal values then come out in any order, where ONNX specifies the lower index first, and the
  matching ops' tie rules (sizes, which tie all the time in SizeSplitMatch, or equal scores)
  silently change; every TopK is set stable after reading (``stable_topk``);
- every compiled model has a static batch (one per batch size): with a dynamic batch the CPU
  plugin re-infers shapes at every call, which on the merged graphs' many small index ops cost
  9% of a batch-1 inference (DeiT-S ToMe r=16 on 2 cores: 29.4 ms dynamic, 26.9 ms static). The dense model is
  compiled the same way, so the speedup compares like with like;
- the thread count and performance hint are fixed (``LATENCY``, one stream, all CPUs this
  process may use) and reported.
"""

from __future__ import annotations

import collections
import io
import os
from pathlib import Path

import numpy as np
import onnx

from deploytk.backends.base import Backend, LoadedModel, host_timer, seeded_batch
from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import Artifact
from deploytk.exporter.baseline import baseline_onnx, quantized_baseline_path, verified_quantized_baseline
from deploytk.exporter.inline import inline_deploytk_functions
from deploytk.exporter.onnx_io import runnable
from deploytk.inputs import InputKind
from deploytk.ops import MATCHING_OPS
from deploytk.optional import openvino_version, require_openvino
from deploytk.progress import SILENT, Progress

PERFORMANCE_HINT = "LATENCY"
FP16_IN_FP32_NOTE = (
    "fp16 graph computed in fp32 by OpenVINO's CPU plugin (its f16 precision would lower the graph's fp32 parts too): "
    "fp16 weights and casts, fp32 arithmetic"
)


def cpu_threads() -> int:
    """The CPUs this process may run on (a container's or taskset's limit, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def inference_precision(core, precision: str, what: str) -> tuple[str, str | None]:
    """(OpenVINO's INFERENCE_PRECISION_HINT for a graph of ``precision``, a note when it does not compute as the graph says)."""
    if precision == "fp32":
        return "f32", None
    if precision == "fp16":
        # On a CPU with fp16 arithmetic (AVX512-FP16, AMX-FP16) OpenVINO's f16 precision computes the parts the graph keeps
        # in fp32 (matching scores, softmax, norms, token sizes) in fp16 as well, as its bf16 does: measured on an Intel
        # Xeon with AMX-FP16 (family 6, model 167), the digits ViT ToMe r=4 fp16 graph reached cosine 0.994 and a largest
        # difference of 0.31 against the fp32 reference (tolerance 0.05). f32 runs the graph's fp16 weights and casts.
        return "f32", FP16_IN_FP32_NOTE
    raise DeploytkError(
        f"{what} is a bf16 graph, which OpenVINO's CPU plugin cannot run as the graph says: its bf16 inference precision "
        "also turns the parts the graph keeps in fp32 (matching scores, softmax, norms, token sizes) into bf16, so its "
        "merge choices differ from the graph's (measured on the digits ViT: cosine 0.89 against the fp32 reference).",
        hint="Validate it with `backend=ort` (emulated bf16) or run it with `backend=trt` / ort-cuda on a GPU; "
        "for OpenVINO export with `precision=fp32` or fp16.",
    )


def stable_topk(model) -> int:
    """Make every TopK of an ov.Model stable (ONNX's tie rule: the lower index first); returns how many there are."""
    count = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() == "TopK":
            node.set_attribute("stable", True)
            count += 1
    if count:
        model.validate_nodes_and_infer_types()
    return count


def fake_quantized_choices(model) -> list[str]:
    """Nodes of a matching op's inlined body (``ToMeMatch/...``) fed by a FakeQuantize: choices made on int8-rounded
    inputs. Empty for a model that keeps every discrete choice in fp32 (what `deploytk quantize` writes)."""
    found = []
    for node in model.get_ordered_ops():
        if node.get_friendly_name().split("/", 1)[0] in MATCHING_OPS and "/" in node.get_friendly_name():
            if any(node.input_value(i).get_node().get_type_name() == "FakeQuantize" for i in range(node.get_input_size())):
                found.append(node.get_friendly_name())
    return found


def read_onnx(core, graph: onnx.ModelProto):
    """``graph`` as an ov.Model, its deploytk functions inlined first (OpenVINO's reader refuses custom-domain functions)."""
    if graph.functions or any(n.domain for n in graph.graph.node):
        graph = inline_deploytk_functions(graph)
    with runnable(graph) as source:  # bytes, or a temporary file with external data past protobuf's limit
        return core.read_model(io.BytesIO(source) if isinstance(source, bytes) else source)


def attention_fusion(compiled, model) -> dict:
    """How the compiled model runs attention: of the graph's softmax ops, how many run in one CPU kernel together with
    both of attention's MatMuls (QK^T and AV), and which kernels those are (OpenVINO's snippets ``Subgraph``, its
    ``ScaledDotProductAttention``). Read from the runtime model, whose nodes list the original layers they execute."""
    types = {op.get_friendly_name(): op.get_type_name().lower() for op in model.get_ops()}
    softmax = {name for name, kind in types.items() if kind == "softmax"}
    kernels: collections.Counter = collections.Counter()
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        names = set(info["originalLayersNames"].astype(str).split(","))
        if names & softmax and sum(types.get(n) == "matmul" for n in names) >= 2:
            kernels[info["layerType"].astype(str)] += len(names & softmax)
    return {"softmax": len(softmax), "fused_with_both_matmuls": sum(kernels.values()), "kernels": dict(kernels)}


class OpenVinoModel(LoadedModel):
    """One ov.Model, compiled for one batch size at a time (static shapes).

    Only the latest compiled model is kept: each holds its own CPU threads, and with four alive
    (merged and dense at batch 1 and 8) batch-1 latency rose by a quarter on the 2-core machine
    (DeiT-S ToMe r=16: 32.8 ms instead of 26.4 ms merged, 52.7 instead of 45.8 ms dense).
    """

    def __init__(self, core, model, output_names: list[str], kind: InputKind, config: dict, emulation: str | None = None):
        self.core, self.model, self.config = core, model, config
        # the ONNX graph's names, in its order (OpenVINO's are a set per tensor, merged where its passes fuse nodes)
        self.output_names = output_names
        self.kind = kind
        self.emulation = emulation
        self.batch_size, self.compiled = None, None

    def request(self, batch_size: int):
        """An infer request of the model compiled for ``batch_size`` (compiled now unless it is the current one)."""
        if batch_size != self.batch_size:
            self.compiled = None  # release the other batch size's threads and memory first
            model = self.model.clone()
            model.reshape({model.inputs[0].get_any_name(): list(self.kind.batch_shape(batch_size))})
            self.compiled = self.core.compile_model(model, "CPU", self.config).create_infer_request()
            self.batch_size = batch_size
        return self.compiled

    def run(self, batch):
        request = self.request(len(batch))
        request.infer({0: batch})
        # copies: the request's output tensors are overwritten by its next inference
        return {name: np.array(request.get_tensor(out).data) for name, out in zip(self.output_names, request.model_outputs, strict=True)}

    def timer(self, batch_size):
        request = self.request(batch_size)
        return host_timer(lambda x: request.infer({0: x}), seeded_batch(batch_size, self.kind))

    def settings(self) -> dict:
        fusion = {"attention_fusion": attention_fusion(self.compiled.get_compiled_model(), self.model)} if self.compiled else {}
        static = "static, one compiled model per size"
        return {"runtime": f"openvino {openvino_version()}", "device": "CPU", **self.config, "batch": static, **fusion}

    def quantized_choices(self) -> list[str]:
        return fake_quantized_choices(self.model)


def dense_ir(artifact: Artifact) -> Path:
    """The int8 dense baseline `deploytk quantize` with `backend=openvino` wrote beside the model (DIR/.baseline/dense-<sha>.xml)."""
    return verified_quantized_baseline(artifact, quantized_baseline_path(artifact).with_suffix(".xml"))


class OpenVinoBackend(Backend):
    """``ir``: run that IR file instead of the artifact's graph (what `package` with `backend=openvino` validates before it
    writes it); the artifact still names the tensors and supplies the probed graph."""

    name = "openvino"
    display_name = "OpenVINO"
    timing = "host clock around a synchronous infer() of a model compiled for that batch size"

    def __init__(self, ir: Path | None = None):
        self.ir = ir

    def ir_of(self, artifact: Artifact) -> Path | None:
        return self.ir or artifact.ir_path

    def device(self) -> str:
        return "cpu"

    def core(self):
        require_openvino(f"`backend={self.name}`")
        import openvino  # optional: guarded above

        return openvino.Core()

    def graph(self, artifact: Artifact) -> tuple[onnx.ModelProto, str | None]:
        artifact.require_runtime(f"`backend={self.name}`", ("openvino",))
        # an int8 artifact runs model.xml; its model.onnx (the fp32 graph it was quantized from) names the tensors to probe
        # what a user deploys: model.inlined.onnx when the export wrote one (checked against the manifest's sha256);
        # else the function-bodied graph, which load() inlines in memory
        self.core()  # a missing OpenVINO is refused before any work
        return onnx.load(str(artifact.inlined_path or artifact.onnx_path)), None

    def settings(self, precision_hint: str) -> dict:
        return {"PERFORMANCE_HINT": PERFORMANCE_HINT, "INFERENCE_NUM_THREADS": cpu_threads(), "INFERENCE_PRECISION_HINT": precision_hint}

    def compile(self, core, artifact: Artifact, graph: onnx.ModelProto | None = None, path: Path | None = None) -> OpenVinoModel:
        """``graph`` (inlined here if it has deploytk nodes) or the ONNX file or IR at ``path`` (standard ops only), read by
        OpenVINO; for an int8 artifact, its IR with ``graph``'s extra outputs (the probes) added by tensor name."""
        hint, note = inference_precision(core, artifact.precision, str(artifact.directory))
        if self.ir_of(artifact) is not None and path is None:
            model = core.read_model(str(self.ir_of(artifact)))
            outputs = [o["name"] for o in artifact.manifest["outputs"]]
            extra = [o.name for o in graph.graph.output if o.name not in outputs] if graph is not None else []
            if extra:
                model.add_outputs(extra)
            outputs += extra
        elif graph is not None:
            model, outputs = read_onnx(core, graph), [o.name for o in graph.graph.output]
        else:
            model, outputs = core.read_model(str(path)), [o["name"] for o in artifact.manifest["outputs"]]
        stable_topk(model)
        return OpenVinoModel(core, model, outputs, artifact.input_kind, self.settings(hint), note)

    def load(self, artifact, batch_sizes, graph=None, progress: Progress = SILENT) -> OpenVinoModel:
        core = self.core()
        artifact.require_runtime(f"`backend={self.name}`", ("openvino",))
        if self.ir_of(artifact) is not None:  # `deploytk quantize` with `backend=openvino`, or an IR handed in
            progress.step(f"OpenVINO: reading {self.ir_of(artifact)}" + (" (int8)" if artifact.quantization else ""))
            loaded = self.compile(core, artifact, graph)
        elif graph is None and artifact.inlined_path is not None:  # what a user deploys: export with `fmt='onnx-inlined'`
            progress.step(f"OpenVINO: reading {artifact.inlined_path.name}")
            loaded = self.compile(core, artifact, path=artifact.inlined_path)
        else:
            progress.step("OpenVINO: inlining the deploytk functions and reading the graph")
            loaded = self.compile(core, artifact, graph if graph is not None else onnx.load(str(artifact.onnx_path)))
        progress.step(f"OpenVINO: compiling for batch {batch_sizes[0]}")
        loaded.request(batch_sizes[0])  # a graph OpenVINO cannot compile fails here, before any other work
        return loaded

    def load_for_timing(self, artifact, batch_sizes, progress: Progress = SILENT) -> tuple[OpenVinoModel, OpenVinoModel]:
        merged = self.load(artifact, batch_sizes, progress=progress)
        if artifact.ir_path is not None:  # the dense model quantized the same way, written by `deploytk quantize`
            dense = self.compile(merged.core, artifact, path=dense_ir(artifact))
        else:
            progress.step("exporting the unmerged baseline (cached after the first run)")
            dense = self.compile(merged.core, artifact, path=baseline_onnx(artifact))
        return merged, dense

    def write_ir(self, artifact: Artifact, xml: Path) -> dict:
        """The artifact as an OpenVINO IR (``xml`` and the .bin beside it) with every TopK stable and the batch axis
        dynamic, as Triton's openvino backend loads it; an int8 artifact's own IR is re-saved the same way."""
        core = self.core()
        import openvino  # optional: guarded by core()

        artifact.require_runtime("an OpenVINO IR", ("openvino",))
        inference_precision(core, artifact.precision, str(artifact.directory))  # a bf16 graph is refused, with the reason
        if artifact.ir_path is not None:
            model = core.read_model(str(artifact.ir_path))
        else:
            model = read_onnx(core, onnx.load(str(artifact.inlined_path or artifact.onnx_path)))
        if any(not port.get_partial_shape()[0].is_dynamic for port in model.inputs):  # Triton's batcher sends any batch size
            raise DeploytkError(
                f"{artifact.directory}'s graph has a fixed batch size ({model.inputs[0].get_partial_shape()}); Triton needs a dynamic one.",
                hint="Re-run `deploytk export` (exports have a dynamic 'batch' axis).",
            )
        topk = stable_topk(model)
        openvino.save_model(model, str(xml), compress_to_fp16=False)  # fp32 stays fp32; an fp16 export is fp16 already
        return {"openvino": openvino_version(), "stable_topk": topk}

    def describe(self) -> dict:
        info = super().describe()
        info["openvino"] = openvino_version()
        return info
