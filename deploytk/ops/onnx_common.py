"""Shared ONNX pieces of the deploytk custom-op function bodies.

The tie rule (``deploytk.ops.ties``) in ONNX, which every body that normalises a metric or masks scores writes as:

    metric = op.Cast(metric, to=1)                            # decide in fp32 whatever the input type
    norm = op.ReduceL2(metric, last, keepdims=1)
    m = op.Div(metric, op.Where(op.Equal(norm, f0), f1, norm))  # a zero row stays zero: cosine 0, not NaN
    scores = op.Where(blocked, neg_inf, scores)                # masked by replacement, never op.Add of a -inf bias

A call to a shared ``@script`` function would become a node of a nested function, which the exporter, TensorRT's
parser and OpenVINO's reader would each have to resolve, so each body writes these few ops itself;
``tests/ops/test_generated_inputs.py`` checks every body's ReduceL2 is guarded and that no -inf reaches arithmetic.
"""

from onnxscript import opset18 as op  # noqa: F401  (the standard-op set every body uses)
from onnxscript.values import Opset

DOMAIN = "deploytk"
DOMAIN_VERSION = 1
#: The opset every custom node and local function lives in.
deploytk_opset = Opset(DOMAIN, DOMAIN_VERSION)

#: Attributes every deploytk node carries so TensorRT's ONNX parser (>= 10.7) resolves it to a
#: registered plugin ``deploytk::<OpType>`` instead of inlining the function body.
PLUGIN_ATTRIBUTES = {"plugin_namespace": "deploytk", "plugin_version": "1"}

#: "to the end" for Slice (any end past the axis length clamps)
SLICE_END = 2**62
