"""ONNX function body of ``deploytk.MctfMatch`` (standard ops only)."""

from onnxscript import FLOAT, INT64, script

from deploytk.ops.onnx_common import SLICE_END, deploytk_opset, op


@script(deploytk_opset, default_opset=op)
def MctfMatch(
    metric: FLOAT,
    received: FLOAT,
    size: FLOAT,
    r: int,
    protected: int,
    tau_sim: float,
    tau_info: float,
    tau_size: float,
    bidirection: int,
    tokens: int,
    plugin_namespace: str = "deploytk",
    plugin_version: str = "1",
) -> INT64:
    """MCTF matching in standard ops; ``tokens`` (static N) lets a runtime fold all index math."""
    zero = op.Constant(value_ints=[0])
    one = op.Constant(value_ints=[1])
    two = op.Constant(value_ints=[2])
    end = op.Constant(value_ints=[SLICE_END])
    ax1 = op.Constant(value_ints=[1])
    last = op.Constant(value_ints=[-1])
    s0 = op.Constant(value_int=0)
    s1 = op.Constant(value_int=1)
    neg_inf = op.Constant(value_float=float("-inf"))
    f0 = op.Constant(value_float=0.0)
    f1 = op.Constant(value_float=1.0)
    n1 = op.Reshape(op.Constant(value_int=tokens), one)
    p1 = op.Reshape(op.Constant(value_int=protected), one)
    r_ = op.Reshape(op.Constant(value_int=r), one)
    bidir = op.Cast(op.Constant(value_int=bidirection), to=9)
    r1 = op.Where(bidir, op.Div(r_, two), r_)
    r2 = op.Sub(r_, r1)
    na = op.Div(op.Add(n1, one), two)
    nb = op.Div(n1, two)
    pa = op.Div(op.Add(p1, one), two)
    pb = op.Div(p1, two)
    n_unm = op.Sub(na, r1)

    # scores = W_sim * W_info * W_size on the alternation split, in fp32
    metric = op.Cast(metric, to=1)
    received = op.Cast(received, to=1)
    size = op.Cast(size, to=1)
    norm = op.ReduceL2(metric, last, keepdims=1)
    m = op.Div(metric, op.Where(op.Equal(norm, f0), f1, norm))  # a zero row stays zero: cosine 0 (ops/ties.py)
    cos = op.MatMul(op.Slice(m, zero, end, ax1, two), op.Transpose(op.Slice(m, one, end, ax1, two), perm=[0, 2, 1]))
    e_sim = op.Where(op.Greater(op.Constant(value_float=tau_sim), f0), op.Div(f1, op.Constant(value_float=tau_sim)), f0)
    e_info = op.Where(op.Greater(op.Constant(value_float=tau_info), f0), op.Div(f1, op.Constant(value_float=tau_info)), f0)
    e_size = op.Where(op.Greater(op.Constant(value_float=tau_size), f0), op.Div(f1, op.Constant(value_float=tau_size)), f0)
    w_sim = op.Pow(op.Div(op.Add(cos, f1), op.Constant(value_float=2.0)), e_sim)
    info = op.Div(f1, received)
    info = op.Div(info, op.ReduceMax(info, ax1, keepdims=1))
    w_info = op.Pow(
        op.Mul(op.Unsqueeze(op.Slice(info, zero, end, ax1, two), last), op.Unsqueeze(op.Slice(info, one, end, ax1, two), ax1)), e_info
    )
    inv = op.Div(f1, op.Squeeze(size, last))
    inv = op.Div(inv, op.ReduceMax(inv, ax1, keepdims=1))
    w_size = op.Pow(
        op.Mul(op.Unsqueeze(op.Slice(inv, zero, end, ax1, two), last), op.Unsqueeze(op.Slice(inv, one, end, ax1, two), ax1)), e_size
    )
    row_a = op.Range(s0, op.Squeeze(na), s1)
    row_b = op.Range(s0, op.Squeeze(nb), s1)
    blocked = op.Or(op.Unsqueeze(op.Less(row_a, pa), ax1), op.Less(row_b, pb))  # [Na, Nb]
    scores = op.Where(blocked, neg_inf, op.Mul(op.Mul(w_sim, w_info), w_size))

    # A -> B: the r1 best A tokens are sources
    node_max = op.ReduceMax(scores, last, keepdims=0)
    node_idx = op.ArgMax(scores, axis=-1, keepdims=0)
    _, order_a = op.TopK(node_max, na, axis=-1, largest=1, sorted=1)
    pos_a = op.Expand(row_a, op.Shape(order_a))
    rank_a = op.ScatterElements(pos_a, order_a, pos_a, axis=1)
    is_src = op.Less(rank_a, r1)
    sorted_slot = op.Sub(op.CumSum(op.Cast(op.Not(is_src), to=7), s1), one)
    slot_unm = op.Where(op.Greater(p1, zero), sorted_slot, op.Sub(rank_a, r1))

    # B -> unmerged A (bidirection), or B stays in order after the unmerged A tokens
    back = op.Where(op.Unsqueeze(is_src, ax1), neg_inf, op.Transpose(scores, perm=[0, 2, 1]))
    back = op.Where(op.Unsqueeze(op.Less(row_b, pb), last), neg_inf, back)
    node_max2 = op.ReduceMax(back, last, keepdims=0)
    node_idx2 = op.ArgMax(back, axis=-1, keepdims=0)
    _, order_b = op.TopK(node_max2, nb, axis=-1, largest=1, sorted=1)
    pos_b = op.Expand(row_b, op.Shape(order_b))
    rank_b = op.ScatterElements(pos_b, order_b, pos_b, axis=1)
    slot_b_bi = op.Where(op.Less(rank_b, r2), op.GatherElements(slot_unm, node_idx2, axis=1), op.Add(n_unm, op.Sub(rank_b, r2)))
    slot_b = op.Where(bidir, slot_b_bi, op.Add(n_unm, pos_b))
    slot_a = op.Where(is_src, op.GatherElements(slot_b, node_idx, axis=1), slot_unm)

    # interleave back to token order: [a0, b0, a1, b1, ...]
    pad_b = op.Pad(slot_b, op.Concat(zero, zero, zero, op.Sub(na, nb), axis=0))  # equal lengths; the pad is sliced off
    dest = op.Reshape(
        op.Concat(op.Unsqueeze(slot_a, last), op.Unsqueeze(pad_b, last), axis=-1),
        op.Concat(op.Shape(slot_a, start=0, end=1), op.Mul(na, two), axis=0),
    )
    dest = op.Slice(dest, zero, n1, ax1)

    # protected tokens' slots first, in order (identity for protected <= 1)
    t_out = op.Sub(n1, r_)
    q1 = op.Max(p1, one)
    rows = op.Slice(dest, zero, q1, ax1)  # [B, Q]
    q_ids = op.Range(s0, op.Squeeze(q1), s1)
    match = op.And(
        op.Equal(op.Unsqueeze(rows, last), op.Range(s0, op.Squeeze(t_out), s1)),
        op.Reshape(op.Less(q_ids, p1), op.Constant(value_ints=[1, -1, 1])),
    )
    is_prefix = op.Cast(op.ReduceMax(op.Cast(match, to=1), ax1, keepdims=0), to=9)  # [B, T]
    prefix_pos = op.Cast(
        op.ReduceMax(
            op.Where(match, op.Cast(op.Reshape(q_ids, op.Constant(value_ints=[1, -1, 1])), to=1), op.Constant(value_float=-1.0)),
            ax1,
            keepdims=0,
        ),
        to=7,
    )
    other_pos = op.Add(p1, op.Sub(op.CumSum(op.Cast(op.Not(is_prefix), to=7), s1), one))
    new_pos = op.Where(is_prefix, prefix_pos, other_pos)
    new_pos = op.Concat(new_pos, op.Expand(t_out, op.Concat(op.Shape(new_pos, start=0, end=1), one, axis=0)), axis=1)
    return op.GatherElements(new_pos, dest, axis=1)
