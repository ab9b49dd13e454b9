"""ONNX function body of ``deploytk.TopKSelect`` (standard ops only)."""

from onnxscript import FLOAT, INT64, script

from deploytk.ops.onnx_common import SLICE_END, deploytk_opset, op


@script(deploytk_opset, default_opset=op)
def TopKSelect(
    scores: FLOAT,
    keep: int,
    protected: int,
    tokens: int,
    plugin_namespace: str = "deploytk",
    plugin_version: str = "1",
) -> INT64:
    """TopK on the candidates' scores, a kept mask, and kept slots by cumulative count."""
    one = op.Constant(value_ints=[1])
    zero = op.Constant(value_ints=[0])
    ax1 = op.Constant(value_ints=[1])
    end = op.Constant(value_ints=[SLICE_END])
    k1 = op.Reshape(op.Constant(value_int=keep), one)
    p1 = op.Reshape(op.Constant(value_int=protected), one)
    scores = op.Cast(scores, to=1)  # decided in fp32 whatever the input type (exact: fp16 and bf16 values are fp32 values)
    _, order = op.TopK(op.Slice(scores, p1, end, ax1), k1, axis=-1, largest=1, sorted=1)
    cand = op.Expand(op.Constant(value_int=0), op.Shape(op.Slice(scores, p1, end, ax1)))
    picked = op.ScatterElements(cand, order, op.Expand(op.Constant(value_int=1), op.Shape(order)), axis=1)
    kept = op.Pad(picked, op.Concat(zero, p1, zero, zero, axis=0), op.Constant(value_int=1))  # [B, N]
    slots = op.Sub(op.CumSum(kept, op.Constant(value_int=1)), one)
    return op.Where(op.Cast(kept, to=9), slots, op.Add(p1, k1))
