"""TokenAggregate's ONNX body as a one-node model, run on ONNX Runtime or OpenVINO (tests/ops, tests/merging)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper


def aggregate_model(n: int, c: int, tokens_out: int, normalize: bool, x_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """One TokenAggregate node calling its local function, as the exporter writes it: static N and C, symbolic batch."""
    from deploytk.ops import OPS, PLUGIN_ATTRIBUTES

    node = helper.make_node(
        "TokenAggregate",
        ["x", "weight", "dest"],
        ["out"],
        domain="deploytk",
        tokens_out=tokens_out,
        normalize=int(normalize),
        **PLUGIN_ATTRIBUTES,
    )
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", x_type, ["batch", n, c]),
            helper.make_tensor_value_info("weight", TensorProto.FLOAT, ["batch", n, 1]),
            helper.make_tensor_value_info("dest", TensorProto.INT64, ["batch", n]),
        ],
        [helper.make_tensor_value_info("out", x_type, ["batch", tokens_out, c])],
    )
    fn = OPS["TokenAggregate"].onnx_function.to_function_proto()
    model = helper.make_model(graph, functions=[fn], opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("deploytk", 1)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


def aggregate_runner(runtime: str, model: onnx.ModelProto):
    """feeds -> the output, on ONNX Runtime ("ort") or OpenVINO ("openvino": the inlined graph, f32, as the backend runs it)."""
    if runtime == "ort":
        import onnxruntime as ort

        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return lambda feeds: session.run(None, feeds)[0]
    openvino = pytest.importorskip("openvino", reason="the openvino extra is not installed")
    from deploytk.exporter.inline import inline_deploytk_functions

    core = openvino.Core()
    compiled = core.compile_model(
        core.read_model(inline_deploytk_functions(model).SerializeToString(), b""), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}
    )
    return lambda feeds: np.asarray(compiled(feeds)[compiled.outputs[0]])
