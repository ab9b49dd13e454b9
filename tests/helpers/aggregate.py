"""TokenAggregate's ONNX body as a one-node model, run on ONNX Runtime or OpenVINO (tests/ops, tests/merging)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto


def aggregate_model(n: int, c: int, tokens_out: int, normalize: bool, x_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """One TokenAggregate node calling its local function, as the exporter writes it: static N and C, symbolic batch."""
    from benchmarks.token_aggregate_body import single_node
    from deploytk.ops import OPS

    return single_node(OPS["TokenAggregate"].onnx_function, n, tokens_out, c, normalize, x_type)


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
