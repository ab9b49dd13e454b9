"""`deploytk quantize` with `backend=ort` or `backend=trt`: ONNX Runtime's static quantizer, QDQ format, on the plugin-ready graph.

The graph keeps its deploytk nodes (function bodies for ONNX Runtime, plugins for TensorRT): the quantizer does not
look inside functions, and only the ops that carry weights are handed to it (``weight_ops``: the projections, the MLP,
the patch embedding and the head), so the matching / selection ops, their inputs (the metric, the scores, the
attention the class token pays), the attention products inside ProportionalAttention, softmax, the norms and the
token sizes stay fp32 by construction; ``choice_inputs_quantized`` checks it on the result.

Two rule sets:

- ``ort``: what ONNX Runtime's CPU provider runs fastest: uint8 activations with a zero point (a GELU's output is
  almost all positive, a symmetric range would waste half the codes), int8 weights symmetric per output channel;
- ``trt``: TensorRT's explicit quantization (a strongly typed network takes INT8 only as Q/DQ nodes): int8
  everywhere, symmetric (zero point 0), per-tensor activations, per-channel weights on the output axis, Q/DQ on both
  inputs of each MatMul / Gemm / Conv (where TensorRT fuses them into an int8 kernel) and nowhere else, float biases.
  ``trt_rule_violations`` checks those rules on a graph. NVIDIA's ModelOpt ONNX quantizer would make the same kind of
  graph, but its ``[onnx]`` extra replaces onnxruntime with onnxruntime-gpu and pins an older onnx (seen with
  nvidia-modelopt 0.47.0), so it cannot share deploytk's environment.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx

from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import BASELINE_DIR, MODEL_FILE, Artifact
from deploytk.exporter.manifest import sha256_file
from deploytk.exporter.probes import choice_inputs_quantized
from deploytk.quantize.base import Quantizer

#: ops that carry a weight and that both runtimes run in int8
WEIGHT_OP_TYPES = ("MatMul", "Gemm", "Conv")

ORT_SETTINGS = {
    "format": "QDQ",
    "activations": "uint8, asymmetric, per tensor",
    "weights": "int8, symmetric, per output channel",
    "calibration": "MinMax",
    "biases": "int32 (ONNX Runtime's default)",
}
TRT_SETTINGS = {
    "format": "QDQ (TensorRT explicit quantization)",
    "activations": "int8, symmetric (zero point 0), per tensor",
    "weights": "int8, symmetric (zero point 0), per output channel",
    "calibration": "MinMax",
    "biases": "float (not quantized)",
}


def weight_ops(proto: onnx.ModelProto) -> list[str]:
    """Names of the main graph's MatMul / Gemm / Conv nodes whose second input is a weight (an initializer or a Constant)."""
    constants = {i.name for i in proto.graph.initializer} | {o for n in proto.graph.node if n.op_type == "Constant" for o in n.output}
    missing = [n for n in proto.graph.node if n.op_type in WEIGHT_OP_TYPES and not n.name]
    if missing:
        raise DeploytkError("internal: the graph has unnamed MatMul/Gemm/Conv nodes; the quantizer selects nodes by name.")
    return [n.name for n in proto.graph.node if n.domain == "" and n.op_type in WEIGHT_OP_TYPES and n.input[1] in constants]


class _Batches:
    """ONNX Runtime's CalibrationDataReader protocol over the calibration batches."""

    def __init__(self, batches: list[np.ndarray], input_name: str):
        self._it, self._name = iter(batches), input_name

    def get_next(self):
        batch = next(self._it, None)
        return None if batch is None else {self._name: batch}

    def rewind(self):  # pragma: no cover (the quantizer reads once)
        raise NotImplementedError


def quantize_qdq(source: Path, target: Path, batches: list[np.ndarray], input_name: str, tensorrt_rules: bool) -> dict:
    """Quantize the ONNX file ``source`` into ``target`` (``tensorrt_rules``: trt's, else ort's); returns what was quantized."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    proto = onnx.load(str(source))
    nodes = weight_ops(proto)
    symmetric = tensorrt_rules
    quantize_static(
        proto,
        str(target),
        _Batches(batches, input_name),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        nodes_to_quantize=nodes,
        calibrate_method=CalibrationMethod.MinMax,
        extra_options={
            "ActivationSymmetric": symmetric,
            "WeightSymmetric": True,
            "QuantizeBias": not symmetric,
            # an int8 op's output stays float: the bias Add, the residual and the norms that follow are not int8
            "OpTypesToExcludeOutputQuantization": list(WEIGHT_OP_TYPES),
        },
    )
    out = onnx.load(str(target))
    bad = choice_inputs_quantized(out)
    if bad:
        raise DeploytkError(f"internal: the quantizer put Q/DQ on the inputs of matching ops: {', '.join(bad[:4])}.")
    if tensorrt_rules:
        problems = trt_rule_violations(out)
        if problems:
            raise DeploytkError("internal: the trt graph breaks TensorRT's Q/DQ rules: " + "; ".join(problems[:5]))
    chosen = set(nodes)
    quantized = Counter(n.op_type for n in out.graph.node if n.name in chosen)
    return {"quantized_ops": dict(quantized), "quantized_op_count": len(nodes)}


class QdqQuantizer(Quantizer):
    """ONNX Runtime's static quantizer writing model.onnx (QDQ, deploytk nodes kept) and the dense baseline the same way."""

    def __init__(self, name: str, backend: str, settings: dict, tensorrt_rules: bool):
        self.name, self.backend, self.settings, self.tensorrt_rules = name, backend, settings, tensorrt_rules

    def tool(self) -> str:
        from onnxruntime import __version__

        return f"onnxruntime {__version__} quantize_static"

    def quantize(self, source: Artifact, dense: Path, folder: Path, batches: list[np.ndarray], keep_choices_fp32: bool = True) -> dict:
        name = source.input_kind.onnx_name
        summary = quantize_qdq(source.onnx_path, folder / MODEL_FILE, batches, name, self.tensorrt_rules)
        sha = sha256_file(folder / MODEL_FILE)
        quantize_qdq(dense, folder / BASELINE_DIR / f"dense-{sha[:16]}.onnx", batches, name, self.tensorrt_rules)
        return summary


ORT = QdqQuantizer("ort", "ort", ORT_SETTINGS, tensorrt_rules=False)
#: validated on ONNX Runtime here (TensorRT takes the same file in `deploytk build`)
TRT = QdqQuantizer("trt", "ort", TRT_SETTINGS, tensorrt_rules=True)


def _axis(node: onnx.NodeProto, rank: int) -> int:
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    return axis + rank if axis < 0 else axis


def _output_axis(consumer: onnx.NodeProto) -> int:
    """The axis of a weight that indexes output channels: MatMul's B is [K, N]; Gemm's B is [N, K] when transB; Conv's W [M, C, ...]."""
    if consumer.op_type == "Gemm":
        return 0 if any(a.name == "transB" and a.i for a in consumer.attribute) else 1
    return 0 if consumer.op_type == "Conv" else 1


def trt_rule_violations(proto: onnx.ModelProto) -> list[str]:
    """Where a QDQ graph breaks TensorRT's explicit-quantization rules (see the module docstring); empty when it keeps them."""
    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    problems = []
    for n in graph.node:
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        scale = onnx.numpy_helper.to_array(inits[n.input[1]]) if n.input[1] in inits else None
        zero = onnx.numpy_helper.to_array(inits[n.input[2]]) if len(n.input) > 2 and n.input[2] in inits else None
        if zero is None or zero.dtype != np.int8 or np.any(zero != 0):
            found = None if zero is None else (zero.dtype, zero.ravel()[:3])
            problems.append(f"{n.name}: zero point must be int8 zeros (symmetric), is {found}")
        if n.op_type == "QuantizeLinear":
            if scale is None or scale.size != 1:
                problems.append(f"{n.name}: an activation is quantized per tensor (one scale)")
            continue
        users = [u for u in consumers.get(n.output[0], []) if u.op_type != "Shape"]  # reading a shape computes nothing
        if not users or any(u.op_type not in WEIGHT_OP_TYPES or u.domain for u in users):
            problems.append(f"{n.name}: Q/DQ only in front of MatMul/Gemm/Conv, here before {[u.op_type for u in users]}")
            continue
        if n.input[0] in inits:  # a weight: int8 initializer, one scale per output channel
            weight = inits[n.input[0]]
            if weight.data_type != onnx.TensorProto.INT8:
                problems.append(f"{n.name}: weight {weight.name} must be int8")
            want = _output_axis(users[0])
            if scale is None or scale.size != weight.dims[want] or _axis(n, len(weight.dims)) != want:
                problems.append(f"{n.name}: weight {weight.name} must be per channel on axis {want} (its output channels)")
        elif producer.get(n.input[0]) is None or producer[n.input[0]].op_type != "QuantizeLinear":
            problems.append(f"{n.name}: an activation's DequantizeLinear must follow its QuantizeLinear")
    for n in graph.node:  # TensorRT runs a MatMul/Gemm/Conv in int8 only with Q/DQ on both inputs
        if n.op_type in WEIGHT_OP_TYPES and not n.domain:
            fed = [producer.get(i) is not None and producer[i].op_type == "DequantizeLinear" for i in n.input[:2]]
            if any(fed) and not all(fed):
                problems.append(f"{n.name}: only one of its inputs goes through Q/DQ")
    return problems + [f"{name}: a matching op's input goes through Q/DQ" for name in choice_inputs_quantized(proto)]
