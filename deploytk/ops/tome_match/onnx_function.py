"""ONNX function body of ``deploytk.ToMeMatch`` (standard ops only)."""

from onnxscript import FLOAT, INT64, script

from deploytk.ops.onnx_common import SLICE_END, deploytk_opset, op


@script(deploytk_opset, default_opset=op)
def ToMeMatch(
    metric: FLOAT,
    r: int,
    protected: int,
    sort_unmerged: int,
    tokens: int,
    plugin_namespace: str = "deploytk",
    plugin_version: str = "1",
) -> INT64:
    """Scores matmul, ArgMax, TopK, one ScatterElements (unique indices, no reduction).

    Everything but the batch size comes from attributes (``tokens`` is the static N), so a
    runtime folds the index arithmetic, including the output-slot tables, into constants.
    """
    zero = op.Constant(value_ints=[0])
    one = op.Constant(value_ints=[1])
    two = op.Constant(value_ints=[2])
    end = op.Constant(value_ints=[SLICE_END])
    ax1 = op.Constant(value_ints=[1])
    last = op.Constant(value_ints=[-1])
    s0 = op.Constant(value_int=0)
    s1 = op.Constant(value_int=1)
    r1 = op.Reshape(op.Constant(value_int=r), one)
    p1 = op.Reshape(op.Constant(value_int=protected), one)
    n1 = op.Reshape(op.Constant(value_int=tokens), one)
    pa = op.Div(op.Add(p1, one), two)  # protected tokens in A (even positions)
    pb = op.Div(p1, two)  # protected tokens in B (odd positions)
    na = op.Div(op.Add(n1, one), two)
    nb = op.Div(n1, two)
    n_unm = op.Sub(na, r1)

    # Protected A rows may not be sources, protected B columns not destinations: replaced by -inf (ops/ties.py).
    neg_inf = op.Constant(value_float=float("-inf"))
    f0 = op.Constant(value_float=0.0)
    f1 = op.Constant(value_float=1.0)
    row_block = op.Unsqueeze(op.Less(op.Range(s0, op.Squeeze(na), s1), pa), ax1)  # [Na, 1]
    col_block = op.Less(op.Range(s0, op.Squeeze(nb), s1), pb)  # [Nb]
    blocked = op.Or(row_block, col_block)  # [Na, Nb]

    # Cosine-normalised metric (in fp32), split by alternation: A = even tokens, B = odd tokens.
    metric = op.Cast(metric, to=1)
    norm = op.ReduceL2(metric, last, keepdims=1)
    m = op.Div(metric, op.Where(op.Equal(norm, f0), f1, norm))  # a zero row stays zero: cosine 0 (ops/ties.py)
    scores = op.MatMul(op.Slice(m, zero, end, ax1, two), op.Transpose(op.Slice(m, one, end, ax1, two), perm=[0, 2, 1]))
    scores = op.Where(blocked, neg_inf, scores)
    node_max = op.ReduceMax(scores, last, keepdims=0)
    node_idx = op.ArgMax(scores, axis=-1, keepdims=0)
    _, edge_idx = op.TopK(node_max, na, axis=-1, largest=1, sorted=1)
    src_idx = op.Slice(edge_idx, zero, r1, ax1)  # [B, r]: the r best-matched A tokens
    unm_idx = op.Slice(edge_idx, r1, end, ax1)  # [B, Na-r]
    unm_sorted_f, _ = op.TopK(op.Cast(unm_idx, to=1), n_unm, axis=-1, largest=0, sorted=1)
    do_sort = op.Cast(op.Constant(value_int=sort_unmerged), to=9)
    unm_idx = op.Where(do_sort, op.Cast(unm_sorted_f, to=7), unm_idx)
    dst_idx = op.GatherElements(node_idx, src_idx, axis=1)  # [B, r]: their B partners

    # Output slots (reference.tome_slots): protected prefix interleaved, other A, other B.
    k = op.Range(s0, op.Squeeze(n_unm), s1)
    unm_slot = op.Where(op.Less(k, pa), op.Mul(k, two), op.Add(op.Sub(k, pa), p1))
    j = op.Range(s0, op.Squeeze(nb), s1)
    b_slot = op.Where(op.Less(j, pb), op.Add(op.Mul(j, two), one), op.Add(op.Add(p1, op.Sub(n_unm, pa)), op.Sub(j, pb)))

    # One scatter into token order: B tokens (odd positions) keep their fixed slots, a constant the runtime folds;
    # every A token (even position 2a) is written: the unmerged and the sources together cover all of A.
    t = op.Range(s0, op.Squeeze(n1), s1)
    half = op.Div(t, two)
    odd = op.Equal(op.Sub(t, op.Mul(half, two)), s1)  # t % 2 == 1 without Mod, which not every ONNX parser takes on int64
    base = op.Where(odd, op.Gather(b_slot, op.Where(odd, half, s0), axis=0), s0)  # [N]
    batch = op.Shape(metric, start=0, end=1)
    pos = op.Mul(op.Concat(unm_idx, src_idx, axis=1), two)  # [B, Na]: token positions of A
    slots = op.Concat(op.Expand(unm_slot, op.Shape(unm_idx)), op.Gather(b_slot, dst_idx, axis=0), axis=1)
    return op.ScatterElements(op.Expand(base, op.Concat(batch, n1, axis=0)), pos, slots, axis=1)
