"""ONNX function body of ``deploytk.TokenAggregate`` (standard ops only)."""

from onnxscript import FLOAT, INT64, script

from deploytk.ops.onnx_common import deploytk_opset, op


@script(deploytk_opset, default_opset=op)
def TokenAggregate(
    x: FLOAT,
    weight: FLOAT,
    dest: INT64,
    tokens_out: int,
    normalize: int,
    plugin_namespace: str = "deploytk",
    plugin_version: str = "1",
) -> FLOAT:
    """Each slot's first token gathered, the few other kept tokens added on: work linear in N, no [B, T, N] matrix.

    The former body, a one-hot [B, T, N] assignment matrix and one MatMul (T*N*C), took 61.8 of 597 ms
    of VideoMAE-B (1,568 tokens) on ONNX Runtime. Here ScatterElements(min) of the token indices gives
    each slot its first token (N for a slot no token goes to: ATS, K-Medoids), whose row of x [B*N, C]
    is gathered. The other kept tokens (the extras) number at most N - tokens_out: the op's contract
    (deploytk/ops/token_aggregate/__init__.py). TopK of their 0/1 flag with k = N - tokens_out picks
    them, then fillers whose weight the flag (0) zeroes, and ScatterElements(add) adds their weighted
    rows, E = N - T of them, onto the first tokens': E*C additions. Weights are divided by the slot's
    total before they multiply x (one pass over [B, T, C] fewer than dividing the sums).

    Not ScatterND(reduction="add"): ONNX Runtime's multi-threaded CPU kernel races on duplicate
    indices and returns wrong sums now and then (microsoft/onnxruntime#18048, #23396; measured
    here on 1.31.1). ScatterElements(add) is exact there; over all N rows it was 2x slower than the
    one-hot MatMul at N=197; over the E extras it is 1.9-2.5x faster than a [B, T, E] matrix and a
    MatMul at N = 1,214-1,568 and 1.0-1.3x at 197 (benchmarks/token_aggregate_body.py).
    TopK's values feed one Mul only: OpenVINO 2026.4 refused to compile ("Default output not
    supported") a body that also cast them to bool. Sums in fp32 whatever x's type; the result is
    cast back to x's type.
    """
    zero = op.Constant(value_ints=[0])
    one = op.Constant(value_ints=[1])
    two = op.Constant(value_ints=[2])
    shape = op.Shape(x)
    batch = op.Slice(shape, zero, one)
    n = op.Slice(shape, one, two)  # [1]
    t = op.Unsqueeze(op.Constant(value_int=tokens_out), zero)  # [1]
    # first[b, s]: the smallest n with dest[b, n] == s, or N where no token goes to slot s; s in 0..T (T: dropped)
    ids = op.Expand(
        op.Unsqueeze(op.Range(op.Constant(value_int=0), op.Squeeze(n, zero), op.Constant(value_int=1)), zero), op.Concat(batch, n, axis=0)
    )
    first = op.ScatterElements(op.Expand(n, op.Concat(batch, op.Add(t, one), axis=0)), dest, ids, axis=1, reduction="min")  # [B, T+1]
    offsets = op.Unsqueeze(
        op.Mul(op.Range(op.Constant(value_int=0), op.Squeeze(batch, zero), op.Constant(value_int=1)), op.Squeeze(n, zero)), one
    )
    rows = op.Flatten(x, axis=2)  # [B*N, C]: row b*N + n is x[b, n]
    weights = op.Reshape(op.Cast(weight, to=1), op.Constant(value_ints=[-1]))  # [B*N] fp32
    first_out = op.Slice(first, zero, t, one)  # [B, T]
    at_first = op.Add(op.Min(first_out, op.Sub(n, one)), offsets)  # an empty slot reads row N-1 with weight 0
    w_first = op.Where(op.Less(first_out, n), op.Gather(weights, at_first), op.Constant(value_float=0.0))  # [B, T]
    # the extras: kept (dest < T) and not the first of their slot; then fillers of flag 0
    extra = op.And(op.Less(dest, t), op.Not(op.Equal(op.GatherElements(first, dest, axis=1), ids)))  # [B, N]
    k = op.Max(op.Sub(n, t), one)  # [1]: at least 1 (tokens_out == N: one filler)
    flag, picked = op.TopK(op.Cast(extra, to=1), k, axis=1)  # [B, E]
    at_extra = op.Add(picked, offsets)
    w_extra = op.Mul(op.Gather(weights, at_extra), flag)
    dest_extra = op.Min(op.GatherElements(dest, picked, axis=1), op.Sub(t, one))  # a dropped filler -> slot T-1, weight 0
    total = op.ScatterElements(w_first, dest_extra, w_extra, axis=1, reduction="add")  # [B, T]: each slot's weight
    scale = op.Where(op.Cast(op.Constant(value_int=normalize), to=9), total, op.Constant(value_float=1.0))
    x_first = op.Mul(op.Cast(op.Gather(rows, at_first), to=1), op.Unsqueeze(op.Div(w_first, scale), two))  # [B, T, C]
    x_extra = op.Mul(
        op.Cast(op.Gather(rows, at_extra), to=1), op.Unsqueeze(op.Div(w_extra, op.GatherElements(scale, dest_extra, axis=1)), two)
    )
    to_slot = op.Expand(op.Unsqueeze(dest_extra, two), op.Concat(batch, k, op.Slice(shape, two, op.Constant(value_ints=[3])), axis=0))
    return op.CastLike(op.ScatterElements(x_first, to_slot, x_extra, axis=1, reduction="add"), x)
