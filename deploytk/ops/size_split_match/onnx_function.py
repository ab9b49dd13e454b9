"""ONNX function body of ``deploytk.SizeSplitMatch`` (standard ops only)."""

from onnxscript import FLOAT, INT64, script

from deploytk.ops.onnx_common import SLICE_END, deploytk_opset, op


@script(deploytk_opset, default_opset=op)
def SizeSplitMatch(
    metric: FLOAT,
    size: FLOAT,
    r: int,
    protected: int,
    tokens: int,
    plugin_namespace: str = "deploytk",
    plugin_version: str = "1",
) -> INT64:
    """Sort by size (TopK smallest), batched gathers of the halves, one scores matmul."""
    one = op.Constant(value_ints=[1])
    zero = op.Constant(value_ints=[0])
    two = op.Constant(value_ints=[2])
    ax1 = op.Constant(value_ints=[1])
    last = op.Constant(value_ints=[-1])
    end = op.Constant(value_ints=[SLICE_END])
    r1 = op.Reshape(op.Constant(value_int=r), one)
    p1 = op.Reshape(op.Constant(value_int=protected), one)
    n1 = op.Reshape(op.Constant(value_int=tokens), one)
    mc_n = op.Sub(n1, p1)
    na = op.Div(op.Add(mc_n, one), two)
    metric = op.Cast(metric, to=1)  # decided in fp32 whatever the input type
    cand_size = op.Slice(op.Squeeze(op.Cast(size, to=1), last), p1, end, ax1)
    _, order = op.TopK(cand_size, mc_n, axis=-1, largest=0, sorted=1)
    oa = op.Slice(order, zero, na, ax1)
    ob = op.Slice(order, na, end, ax1)
    f0 = op.Constant(value_float=0.0)
    f1 = op.Constant(value_float=1.0)
    norm = op.ReduceL2(metric, last, keepdims=1)
    m = op.Div(metric, op.Where(op.Equal(norm, f0), f1, norm))  # a zero row stays zero: cosine 0 (ops/ties.py)
    mc = op.Slice(m, p1, end, ax1)
    a = op.GatherND(mc, op.Unsqueeze(oa, last), batch_dims=1)
    b = op.GatherND(mc, op.Unsqueeze(ob, last), batch_dims=1)
    scores = op.MatMul(a, op.Transpose(b, perm=[0, 2, 1]))
    node_max = op.ReduceMax(scores, last, keepdims=0)
    node_idx = op.ArgMax(scores, axis=-1, keepdims=0)
    _, src_pos = op.TopK(node_max, r1, axis=-1, largest=1, sorted=1)
    src_tok = op.GatherElements(oa, src_pos, axis=1)
    zeros = op.Expand(op.Constant(value_int=0), op.Shape(order))
    merged = op.ScatterElements(zeros, src_tok, op.Expand(op.Constant(value_int=1), op.Shape(src_tok)), axis=1)
    target = op.ScatterElements(zeros, oa, op.GatherElements(ob, node_idx, axis=1), axis=1)
    pads = op.Concat(zero, p1, zero, zero, axis=0)
    merged = op.Cast(op.Pad(merged, pads, op.Constant(value_int=0)), to=9)  # [B, N]
    target = op.Add(op.Pad(target, pads, op.Constant(value_int=0)), p1)
    slots = op.Sub(op.CumSum(op.Cast(op.Not(merged), to=7), op.Constant(value_int=1)), one)
    return op.Where(merged, op.GatherElements(slots, target, axis=1), slots)
