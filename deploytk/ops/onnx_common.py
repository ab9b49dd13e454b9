"""Shared ONNX pieces of the deploytk custom-op function bodies."""

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
