"""ONNX function body of ``deploytk.PiToMeMatch`` (standard ops only)."""

from onnxscript import FLOAT, INT64, script

from deploytk.ops.onnx_common import SLICE_END, deploytk_opset, op


@script(deploytk_opset, default_opset=op)
def PiToMeMatch(
    metric: FLOAT,
    r: int,
    protected: int,
    margin: float,
    alpha: float,
    protect: int,
    tokens: int,
    plugin_namespace: str = "deploytk",
    plugin_version: str = "1",
) -> INT64:
    """Energy (MatMul, Elu, ReduceMean), its order (TopK), the A x B scores gathered from the cosines, ToMe's ArgMax and
    TopK on them, the closed-form slots (``reference.pitome_dest``) and one ScatterElements back to token order."""
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
    t1 = op.Sub(op.Reshape(op.Constant(value_int=tokens), one), p1)
    span = op.Where(op.Cast(op.Constant(value_int=protect), to=9), op.Mul(r1, two), t1)  # matched tokens of the energy order
    na = op.Div(op.Add(span, one), two)
    nb = op.Div(span, two)
    n_unm = op.Sub(na, r1)
    rest = op.Sub(t1, span)
    batch = op.Shape(metric, start=0, end=1)

    # energy of every patch token, and the patch tokens by descending energy
    patches = op.Slice(op.Cast(metric, to=1), p1, end, ax1)  # in fp32 whatever the input type
    f0 = op.Constant(value_float=0.0)
    f1 = op.Constant(value_float=1.0)
    norm = op.ReduceL2(patches, last, keepdims=1)
    m = op.Div(patches, op.Where(op.Equal(norm, f0), f1, norm))  # a zero row stays zero: cosine 0 (ops/ties.py)
    sim = op.MatMul(m, op.Transpose(m, perm=[0, 2, 1]))  # [B, T, T]
    energy = op.ReduceMean(op.Elu(op.Sub(sim, op.Constant(value_float=margin)), alpha=alpha), last, keepdims=0)
    _, order = op.TopK(energy, t1, axis=-1, largest=1, sorted=1)  # [B, T]

    # A = even, B = odd positions of the matched span; each A token's best B, and the r best-matched A tokens
    a_tok = op.Slice(order, zero, span, ax1, two)
    b_tok = op.Slice(order, one, span, ax1, two)
    rows = op.GatherElements(sim, op.Expand(op.Unsqueeze(a_tok, last), op.Concat(batch, na, t1, axis=0)), axis=1)
    scores = op.GatherElements(rows, op.Expand(op.Unsqueeze(b_tok, ax1), op.Concat(batch, na, nb, axis=0)), axis=2)
    node_max = op.ReduceMax(scores, last, keepdims=0)
    node_idx = op.ArgMax(scores, axis=-1, keepdims=0)
    _, edge = op.TopK(node_max, na, axis=-1, largest=1, sorted=1)
    positions = op.Range(s0, op.Squeeze(na), s1)
    rank = op.ScatterElements(op.Expand(op.Constant(value_int=0), op.Shape(edge)), edge, op.Expand(positions, op.Shape(edge)), axis=1)

    # slots after the prefix: unmerged A (by rank), the protected rest (energy order), B (energy order)
    b_slot = op.Add(op.Add(op.Add(p1, n_unm), rest), op.Range(s0, op.Squeeze(nb), s1))
    a_slot = op.Where(op.Less(rank, r1), op.Gather(b_slot, node_idx, axis=0), op.Sub(op.Add(p1, rank), r1))
    rest_slot = op.Add(op.Add(p1, n_unm), op.Range(s0, op.Squeeze(rest), s1))
    b_pad = op.Pad(op.Expand(b_slot, op.Concat(batch, nb, axis=0)), op.Concat(zero, zero, zero, op.Sub(na, nb), axis=0))
    spanned = op.Reshape(
        op.Concat(op.Unsqueeze(a_slot, last), op.Unsqueeze(b_pad, last), axis=-1), op.Concat(batch, op.Mul(na, two), axis=0)
    )
    slot_of_position = op.Concat(op.Slice(spanned, zero, span, ax1), op.Expand(rest_slot, op.Concat(batch, rest, axis=0)), axis=1)
    patch_dest = op.ScatterElements(op.Expand(op.Constant(value_int=0), op.Shape(order)), order, slot_of_position, axis=1)
    prefix = op.Expand(op.Range(s0, op.Squeeze(p1), s1), op.Concat(batch, p1, axis=0))
    return op.Concat(prefix, patch_dest, axis=1)
