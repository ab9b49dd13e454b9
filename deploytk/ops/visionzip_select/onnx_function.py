"""ONNX function body of ``deploytk.VisionZipSelect`` (standard ops only)."""

from onnxscript import FLOAT, INT64, script

from deploytk.ops.onnx_common import SLICE_END, deploytk_opset, op


@script(deploytk_opset, default_opset=op)
def VisionZipSelect(
    scores: FLOAT,
    metric: FLOAT,
    dominant: int,
    contextual: int,
    protected: int,
    tokens: int,
    plugin_namespace: str = "deploytk",
    plugin_version: str = "1",
) -> INT64:
    """Dominant tokens as TopKSelect's kept ones; targets by the remaining tokens' running count (CumSum, Mod); every
    other remaining token's most similar target (MatMul, ArgMax)."""
    one = op.Constant(value_ints=[1])
    zero = op.Constant(value_ints=[0])
    ax1 = op.Constant(value_ints=[1])
    last = op.Constant(value_ints=[-1])
    end = op.Constant(value_ints=[SLICE_END])
    d1 = op.Reshape(op.Constant(value_int=dominant), one)
    c1 = op.Reshape(op.Constant(value_int=contextual), one)
    p1 = op.Reshape(op.Constant(value_int=protected), one)
    remaining_count = op.Sub(op.Sub(op.Reshape(op.Constant(value_int=tokens), one), p1), d1)
    step = op.Max(op.Div(remaining_count, c1), one)

    # dominant: the protected tokens and the best-scored patches, slots in index order
    scores = op.Cast(scores, to=1)  # decided in fp32 whatever the input type
    metric = op.Cast(metric, to=1)
    candidates = op.Slice(scores, p1, end, ax1)
    _, order = op.TopK(candidates, d1, axis=-1, largest=1, sorted=1)
    picked = op.ScatterElements(
        op.Expand(op.Constant(value_int=0), op.Shape(candidates)), order, op.Expand(op.Constant(value_int=1), op.Shape(order)), axis=1
    )
    kept = op.Pad(picked, op.Concat(zero, p1, zero, zero, axis=0), op.Constant(value_int=1))  # [B, N]
    slots = op.Sub(op.CumSum(kept, op.Constant(value_int=1)), one)

    # contextual targets: every step-th remaining token, the first `contextual` of them
    remaining = op.Sub(one, kept)
    rank = op.Sub(op.CumSum(remaining, op.Constant(value_int=1)), one)
    is_target = op.And(op.Cast(remaining, to=9), op.And(op.Equal(op.Mod(rank, step), zero), op.Less(rank, op.Mul(step, c1))))
    target = op.Where(is_target, op.Div(rank, step), op.Constant(value_ints=[-1]))

    # every other remaining token: its most similar target
    f0 = op.Constant(value_float=0.0)
    f1 = op.Constant(value_float=1.0)
    norm = op.ReduceL2(metric, last, keepdims=1)
    m = op.Div(metric, op.Where(op.Equal(norm, f0), f1, norm))  # a zero row stays zero: cosine 0 (ops/ties.py)
    sim = op.MatMul(m, op.Transpose(m, perm=[0, 2, 1]))
    sim = op.Where(op.Unsqueeze(is_target, ax1), sim, op.Constant(value_float=float("-inf")))
    joined = op.GatherElements(target, op.ArgMax(sim, axis=-1, keepdims=0), axis=1)
    contextual_slot = op.Add(op.Add(p1, d1), op.Where(is_target, target, joined))
    return op.Where(op.Cast(kept, to=9), slots, contextual_slot)
