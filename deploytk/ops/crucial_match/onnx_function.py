"""ONNX function body of ``deploytk.CrucialMatch`` (standard ops only)."""

from onnxscript import FLOAT, INT64, script

from deploytk.ops.onnx_common import SLICE_END, deploytk_opset, op


@script(deploytk_opset, default_opset=op)
def CrucialMatch(
    metric: FLOAT,
    scores: FLOAT,
    keep: int,
    protected: int,
    tokens: int,
    plugin_namespace: str = "deploytk",
    plugin_version: str = "1",
) -> INT64:
    """Kept ("crucial") tokens as in TopKSelect; the rest join their most similar crucial token."""
    one = op.Constant(value_ints=[1])
    zero = op.Constant(value_ints=[0])
    ax1 = op.Constant(value_ints=[1])
    last = op.Constant(value_ints=[-1])
    end = op.Constant(value_ints=[SLICE_END])
    k1 = op.Reshape(op.Constant(value_int=keep), one)
    p1 = op.Reshape(op.Constant(value_int=protected), one)
    scores = op.Cast(scores, to=1)  # decided in fp32 whatever the input type
    metric = op.Cast(metric, to=1)
    _, order = op.TopK(op.Slice(scores, p1, end, ax1), k1, axis=-1, largest=1, sorted=1)
    cand = op.Expand(op.Constant(value_int=0), op.Shape(op.Slice(scores, p1, end, ax1)))
    picked = op.ScatterElements(cand, order, op.Expand(op.Constant(value_int=1), op.Shape(order)), axis=1)
    kept_c = op.Pad(picked, op.Concat(zero, p1, zero, zero, axis=0), op.Constant(value_int=0))  # crucial, not protected
    kept = op.Pad(picked, op.Concat(zero, p1, zero, zero, axis=0), op.Constant(value_int=1))
    slots = op.Sub(op.CumSum(kept, op.Constant(value_int=1)), one)
    f0 = op.Constant(value_float=0.0)
    f1 = op.Constant(value_float=1.0)
    norm = op.ReduceL2(metric, last, keepdims=1)
    m = op.Div(metric, op.Where(op.Equal(norm, f0), f1, norm))  # a zero row stays zero: cosine 0 (ops/ties.py)
    sim = op.MatMul(m, op.Transpose(m, perm=[0, 2, 1]))
    sim = op.Where(op.Unsqueeze(op.Cast(kept_c, to=9), ax1), sim, op.Constant(value_float=float("-inf")))
    target = op.ArgMax(sim, axis=-1, keepdims=0)
    return op.Where(op.Cast(kept, to=9), slots, op.GatherElements(slots, target, axis=1))
