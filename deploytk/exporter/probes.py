"""The matching ops' choices as graph outputs: what validate diagnoses near-tie flips with and visualize draws.

A matching node (ToMeMatch, TopKSelect, ...) makes discrete choices (``dest``); exposing its inputs and ``dest`` as
extra graph outputs lets a runtime report the choices that made its logits. In ``model.inlined.onnx`` (the deploytk
functions inlined, what OpenVINO runs) the same tensors exist under the same names, because the inliner keeps a
call's input and output names, so they are found through the artifact's ``model.onnx``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import onnx

from deploytk.exporter.onnx_io import infer_shapes
from deploytk.ops import DOMAIN, MATCHING_OPS


@dataclass
class Probe:
    """One matching node: its op type, the names of its inputs and of its ``dest`` output."""

    op: str
    inputs: list[str]
    dest: str


def with_matching_outputs(model: Path | onnx.ModelProto, matching_from: Path | None = None) -> tuple[onnx.ModelProto | None, list[Probe]]:
    """A copy of the ONNX model with every matching node's inputs and ``dest`` added as graph outputs, and the probes
    in graph order (the order the reference calls them: the exporter traces the forward pass).

    ``matching_from``: the artifact's model.onnx, whose matching nodes are probed by tensor name when ``model`` has
    the deploytk functions inlined. ``(None, [])`` when there is nothing to probe.
    """
    if isinstance(model, Path):
        model = onnx.load(str(model))
    else:
        model = copy.deepcopy(model)
    nodes = [n for n in model.graph.node if n.domain == DOMAIN and n.op_type in MATCHING_OPS]
    if not nodes and not any(n.domain == DOMAIN for n in model.graph.node) and matching_from is not None:
        nodes = [n for n in onnx.load(str(matching_from)).graph.node if n.domain == DOMAIN and n.op_type in MATCHING_OPS]
    present = {v.name for v in [*model.graph.input, *model.graph.initializer]} | {o for n in model.graph.node for o in n.output}
    if not nodes or any(name not in present for n in nodes for name in [*n.input, n.output[0]]):
        return None, []
    typed = {v.name: v for v in infer_shapes(model).graph.value_info}
    outputs = {o.name for o in model.graph.output}
    probes = []
    for node in nodes:
        probes.append(Probe(node.op_type, list(node.input), node.output[0]))
        for name in [*node.input, node.output[0]]:
            if name not in outputs:
                elem = (
                    typed[name].type.tensor_type.elem_type
                    if name in typed
                    else (onnx.TensorProto.INT64 if name == node.output[0] else onnx.TensorProto.FLOAT)
                )
                model.graph.output.append(onnx.helper.make_tensor_value_info(name, elem, None))
                outputs.add(name)
    return model, probes


def choice_inputs_quantized(model: onnx.ModelProto) -> list[str]:
    """The matching nodes of a quantized (QDQ) graph whose inputs come through a DequantizeLinear: their choices would
    be made on int8-rounded metrics or scores. Empty for a graph that keeps every discrete choice in fp32."""
    dequantized = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return [
        f"{n.op_type} {n.name} (input {name})"
        for n in model.graph.node
        if n.domain == DOMAIN and n.op_type in MATCHING_OPS
        for name in n.input
        if name in dequantized
    ]
