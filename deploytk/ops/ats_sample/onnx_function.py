"""ONNX function body of ``deploytk.ATSSample`` (standard ops only)."""

from onnxscript import FLOAT, INT64, script

from deploytk.ops.onnx_common import deploytk_opset, op


@script(deploytk_opset, default_opset=op)
def ATSSample(
    scores: FLOAT,
    size: FLOAT,
    steps: FLOAT,
    plugin_namespace: str = "deploytk",
    plugin_version: str = "1",
) -> INT64:
    """CumSum for the CDF, ArgMin of |step - cdf| per step, a picked mask (ScatterElements max) and slots by CumSum."""
    one = op.Constant(value_ints=[1])
    last = op.Constant(value_ints=[-1])
    s = op.Cast(scores, to=1)
    cdf = op.CumSum(op.Div(s, op.Add(op.ReduceSum(s, last, keepdims=1), op.Constant(value_float=1e-6))), op.Constant(value_int=1))
    empty = op.Not(op.Greater(op.Squeeze(size, last), op.Constant(value_float=0.0)))
    cdf = op.Where(empty, op.Add(cdf, op.Constant(value_float=0.1)), cdf)
    gap = op.Abs(op.Sub(op.Unsqueeze(steps, op.Constant(value_ints=[0, 2])), op.Unsqueeze(cdf, one)))  # [B, S, M]
    picked = op.ArgMin(gap, axis=2, keepdims=0, select_last_index=0)  # [B, S]
    zeros = op.Expand(op.Constant(value_int=0), op.Shape(cdf))
    sampled = op.ScatterElements(zeros, picked, op.Expand(op.Constant(value_int=1), op.Shape(picked)), axis=1, reduction="max")
    slots = op.Sub(op.CumSum(sampled, op.Constant(value_int=1)), one)
    return op.Where(op.Cast(sampled, to=9), slots, op.Shape(steps))
