"""One deploytk node calling its op's ONNX function body, as the exporter writes it, run on ONNX Runtime or OpenVINO.

Shared by the body tests (tests/ops) and the OpenVINO tie tests (tests/backends). Inputs are numpy arrays of any
element type ONNX has (fp32, fp16, int64; bf16 as ``ml_dtypes.bfloat16``, handed to ONNX Runtime as an OrtValue,
since its numpy bridge has no bf16).
"""

from __future__ import annotations

import io

import numpy as np
import onnx
from onnx import TensorProto, helper


def body_model(
    op_name: str, inputs: dict, out_types: list[int], out_rank: int, static_batch: bool = False, unbatched: tuple = (), **attrs
) -> onnx.ModelProto:
    """A one-node model calling ``op_name``'s local function, checked in full: the inputs' first dimension a symbolic
    batch unless ``static_batch``, or the input is named in ``unbatched`` (ATSSample's steps [S])."""
    from deploytk.ops import OPS, PLUGIN_ATTRIBUTES

    outputs = [f"out{i}" for i in range(len(out_types))]
    node = helper.make_node(op_name, list(inputs), outputs, domain="deploytk", **attrs, **PLUGIN_ATTRIBUTES)

    def info(name: str, value: np.ndarray):
        dims = list(value.shape) if static_batch or name in unbatched else ["batch", *value.shape[1:]]
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), dims)

    graph = helper.make_graph(
        [node],
        "g",
        [info(k, v) for k, v in inputs.items()],
        [helper.make_tensor_value_info(name, t, [None] * out_rank) for name, t in zip(outputs, out_types, strict=True)],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("deploytk", 1)]
    model = helper.make_model(graph, functions=[OPS[op_name].onnx_function.to_function_proto()], opset_imports=opsets)
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


def ort_session(model: onnx.ModelProto):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def ort_run(session, feeds: dict) -> list[np.ndarray]:
    """The session's outputs; bf16 inputs go in as OrtValues (outputs come back as ONNX Runtime gives them)."""
    import ml_dtypes
    import onnxruntime as ort

    if not any(v.dtype == ml_dtypes.bfloat16 for v in feeds.values()):
        return session.run(None, feeds)
    values = {
        k: ort.OrtValue.ortvalue_from_numpy_with_onnx_type(v.view(np.uint16), TensorProto.BFLOAT16)
        if v.dtype == ml_dtypes.bfloat16
        else ort.OrtValue.ortvalue_from_numpy(v)
        for k, v in feeds.items()
    }
    names = [o.name for o in session.get_outputs()]
    return [_to_numpy(v) for v in session.run_with_ort_values(names, values)]


def _to_numpy(value) -> np.ndarray:
    """An OrtValue as numpy; a bf16 one (which OrtValue.numpy() refuses) read from its buffer."""
    import ctypes

    import ml_dtypes

    if value.data_type() != "tensor(bfloat16)":
        return value.numpy()
    shape = value.shape()
    count = int(np.prod(shape))
    raw = np.ctypeslib.as_array((ctypes.c_uint16 * count).from_address(value.data_ptr()))
    return raw.copy().view(ml_dtypes.bfloat16).reshape(shape)


def openvino_compiled(model: onnx.ModelProto):
    """The model with its function inlined, read, made tie-stable and compiled as the OpenVINO backend does (f32),
    and how many TopK nodes were made stable."""
    import openvino

    from deploytk.backends.openvino_backend import stable_topk
    from deploytk.exporter.inline import inline_deploytk_functions

    core = openvino.Core()
    read = core.read_model(io.BytesIO(inline_deploytk_functions(model).SerializeToString()))
    stabilized = stable_topk(read)
    return core.compile_model(read, "CPU", {"INFERENCE_PRECISION_HINT": "f32"}), stabilized
