"""Run a bf16 graph on ONNX Runtime's CPU provider, which has almost no bfloat16 kernels.

The rewritten graph computes in fp32 but rounds every tensor that is bf16 in the original
to bf16 where it is produced (``Cast`` to bf16 and back), and holds the bf16 weights as the
fp32 numbers they equal. A GPU bf16 matmul or element-wise op also computes in fp32 and
rounds its output, so this reproduces bf16 numerics closely; it is for *validation* only
(latency measured on it means nothing). TensorRT and ONNX Runtime's CUDA provider run the
bf16 graph as is.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from deploytk.exporter.onnx_io import infer_shapes

EMULATION_NOTE = (
    "bf16 emulated on ONNX Runtime CPU (no bf16 kernels there): fp32 arithmetic, every bf16 tensor rounded to bf16 where it is produced"
)
BF16 = TensorProto.BFLOAT16
FLOAT = TensorProto.FLOAT


def _to_fp32(tensor: TensorProto) -> TensorProto:
    return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name)


def _rounding(name: str, raw: str) -> list[onnx.NodeProto]:
    """raw (fp32) -> bf16 -> fp32 named ``name``."""
    return [
        helper.make_node("Cast", [raw], [f"{raw}__bf16"], to=BF16, name=f"{raw}__round_bf16"),
        helper.make_node("Cast", [f"{raw}__bf16"], [name], to=FLOAT, name=f"{raw}__back_fp32"),
    ]


def emulate_bf16(model: onnx.ModelProto) -> onnx.ModelProto:
    """An fp32 copy of ``model`` that rounds every bf16 tensor of the main graph to bf16."""
    inferred = infer_shapes(model)
    bf16_values = {v.name for v in list(inferred.graph.value_info) + list(inferred.graph.output) if v.type.tensor_type.elem_type == BF16}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    for i, init in enumerate(graph.initializer):
        if init.data_type == BF16:
            graph.initializer[i].CopyFrom(_to_fp32(init))
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.op_type in ("Constant", "ConstantOfShape") and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.name == "value" and attr.t.data_type == BF16:
                    attr.t.CopyFrom(_to_fp32(attr.t))  # bf16 values are exact in fp32: no rounding needed
            nodes.append(node)
            continue
        rounded = [o for o in node.output if o in bf16_values]
        for o in rounded:
            node.output[list(node.output).index(o)] = f"{o}__fp32"
        if node.op_type == "Cast" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.name == "to" and attr.i == BF16:
                    attr.i = FLOAT
        nodes.append(node)
        for o in rounded:
            nodes.extend(_rounding(o, f"{o}__fp32"))
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]
    for value in list(graph.input) + list(graph.output):
        if value.type.tensor_type.elem_type == BF16:
            value.type.tensor_type.elem_type = FLOAT
    return out
