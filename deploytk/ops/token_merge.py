"""``deploytk::token_merge`` / ONNX ``deploytk.TokenMerge``: one ToMe layer.

Inputs: x [B, N, C], size [B, N, 1], metric [B, N, D]. Attributes: r (tokens removed,
already capped), protected (leading tokens that never merge away), sort_unmerged.
Outputs: x' [B, N-r, C], size' [B, N-r, 1].

Implementations side by side: the torch eager reference (``merging.tome``), the ONNX
function body below (standard ops only) and, later, the GPU kernel.
"""

from __future__ import annotations

import torch
from onnxscript import FLOAT, script

from deploytk.errors import DeploytkError
from deploytk.merging.tome import merge_tokens
from deploytk.ops._onnx_common import deploytk_opset, op

_BIG = 2**62  # "to the end" for Slice


def check_token_merge_args(x, size, metric, r: int, protected: int) -> None:
    """Reject bad shapes before any compute, with the offending shapes in the message."""
    if x.dim() != 3 or size.dim() != 3 or metric.dim() != 3:
        raise DeploytkError(
            "token_merge expects x [B, N, C], size [B, N, 1] and metric [B, N, D]; got "
            f"x {tuple(x.shape)}, size {tuple(size.shape)}, metric {tuple(metric.shape)}."
        )
    if size.shape[:2] != x.shape[:2] or size.shape[2] != 1 or metric.shape[:2] != x.shape[:2]:
        raise DeploytkError(
            "token_merge inputs disagree on batch/token count: "
            f"x {tuple(x.shape)}, size {tuple(size.shape)}, metric {tuple(metric.shape)}."
        )
    n = x.shape[1]
    cap = (n - protected) // 2
    if protected < 0 or protected > n:
        raise DeploytkError(f"token_merge: protected={protected} must be in [0, {n}] for {n} tokens.")
    if r < 1 or r > cap:
        raise DeploytkError(
            f"token_merge: r={r} is not allowed for {n} tokens with {protected} protected; "
            f"r must be in [1, {cap}] ((tokens - protected) // 2). Cap r before calling the op."
        )


@torch.library.custom_op("deploytk::token_merge", mutates_args=())
def token_merge(
    x: torch.Tensor, size: torch.Tensor, metric: torch.Tensor, r: int, protected: int, sort_unmerged: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    check_token_merge_args(x, size, metric, r, protected)
    return merge_tokens(x, size, metric, r, protected, sort_unmerged)


@token_merge.register_fake
def _(x, size, metric, r, protected, sort_unmerged):
    b, n, c = x.shape
    return x.new_empty(b, n - r, c), size.new_empty(b, n - r, 1)


@script(deploytk_opset, default_opset=op)
def TokenMerge(
    x: FLOAT,
    size: FLOAT,
    metric: FLOAT,
    r: int,
    protected: int,
    sort_unmerged: int,
    tokens: int,
    plugin_namespace: str = "deploytk",
    plugin_version: str = "1",
) -> tuple[FLOAT, FLOAT]:
    """ToMe bipartite soft matching + size-weighted merge in standard ONNX ops.

    Everything but the batch size comes from attributes (``tokens`` is the static N of
    this layer), so a runtime folds all index arithmetic into constants; at run time only
    the matching, two batched gathers and a one-hot matmul (the scatter-add) remain.
    """
    zero = op.Constant(value_ints=[0])
    one = op.Constant(value_ints=[1])
    two = op.Constant(value_ints=[2])
    end = op.Constant(value_ints=[_BIG])
    ax1 = op.Constant(value_ints=[1])
    last = op.Constant(value_ints=[-1])
    r1 = op.Reshape(op.Constant(value_int=r), one)
    p1 = op.Reshape(op.Constant(value_int=protected), one)
    n1 = op.Reshape(op.Constant(value_int=tokens), one)
    pa = op.Div(op.Add(p1, one), two)  # protected tokens in A (even positions)
    pb = op.Div(p1, two)  # protected tokens in B (odd positions)
    na = op.Div(op.Add(n1, one), two)
    nb = op.Div(n1, two)
    s0 = op.Constant(value_int=0)
    s1 = op.Constant(value_int=1)

    # Protected A rows may not be sources, protected B columns not destinations: -inf bias.
    neg_inf = op.Constant(value_float=float("-inf"))
    zero_f = op.Constant(value_float=0.0)
    row_block = op.Unsqueeze(op.Less(op.Range(s0, op.Squeeze(na), s1), pa), ax1)  # [Na, 1]
    col_block = op.Less(op.Range(s0, op.Squeeze(nb), s1), pb)  # [Nb]
    protect_bias = op.Where(op.Or(row_block, col_block), neg_inf, zero_f)  # [Na, Nb]

    # Cosine-normalised metric, split by alternation: A = even tokens, B = odd tokens.
    m = op.Div(metric, op.ReduceL2(metric, last, keepdims=1))
    scores = op.MatMul(op.Slice(m, zero, end, ax1, two), op.Transpose(op.Slice(m, one, end, ax1, two), perm=[0, 2, 1]))
    scores = op.Add(scores, protect_bias)
    node_max = op.ReduceMax(scores, last, keepdims=0)
    node_idx = op.ArgMax(scores, axis=-1, keepdims=0)
    _, edge_idx = op.TopK(node_max, na, axis=-1, largest=1, sorted=1)
    src_idx = op.Slice(edge_idx, zero, r1, ax1)  # [B, r]: the r best-matched A tokens
    unm_idx = op.Slice(edge_idx, r1, end, ax1)  # [B, Na-r]
    unm_sorted_f, _ = op.TopK(op.Cast(unm_idx, to=1), op.Sub(na, r1), axis=-1, largest=0, sorted=1)
    do_sort = op.Cast(op.Constant(value_int=sort_unmerged), to=9)
    unm_idx = op.Where(do_sort, op.Cast(unm_sorted_f, to=7), unm_idx)
    dst_idx = op.GatherElements(node_idx, src_idx, axis=1)  # [B, r]: their B partners

    # Merge rows of [x*size, size]; sizes add up.
    xs = op.Concat(op.Mul(x, size), size, axis=-1)
    xa = op.Slice(xs, zero, end, ax1, two)
    xb = op.Slice(xs, one, end, ax1, two)
    unm = op.GatherND(xa, op.Unsqueeze(unm_idx, last), batch_dims=1)  # [B, Na-r, C+1]
    src = op.GatherND(xa, op.Unsqueeze(src_idx, last), batch_dims=1)  # [B, r, C+1]
    onehot_values = op.Constant(value_floats=[0.0, 1.0])
    assign = op.OneHot(dst_idx, nb, onehot_values, axis=1)  # [B, Nb, r]
    dst = op.Add(xb, op.MatMul(assign, src))  # scatter-add of sources into destinations

    # Protected prefix back in its original interleaved order (A0, B0, A1, B1, ...):
    # one gather with a constant permutation (the identity when protected <= 1).
    n_unm = op.Sub(na, r1)
    i = op.Range(s0, op.Squeeze(op.Sub(n1, r1)), s1)
    half = op.Div(i, op.Squeeze(two))
    in_prefix = op.Less(i, op.Squeeze(p1))
    prefix_slot = op.Where(op.Equal(op.Mod(i, op.Squeeze(two)), s0), half, op.Add(half, op.Squeeze(n_unm)))
    # after the prefix: the rest of A (shifted by the pb prefix slots taken from B), then B as is
    rest_slot = op.Where(op.Less(i, op.Squeeze(op.Add(pb, n_unm))), op.Sub(i, op.Squeeze(pb)), i)
    merged = op.Gather(op.Concat(unm, dst, axis=1), op.Where(in_prefix, prefix_slot, rest_slot), axis=1)

    c = op.Sub(op.Shape(xs, start=2, end=3), one)
    new_size = op.Slice(merged, c, end, two)
    new_x = op.Div(op.Slice(merged, zero, c, two), new_size)
    return new_x, new_size


def translate_token_merge(x, size, metric, r: int, protected: int, sort_unmerged: bool):
    """torch.onnx translation: one TokenMerge node; the static token count becomes an attribute."""
    return TokenMerge(
        x, size, metric, r=r, protected=protected, sort_unmerged=int(sort_unmerged), tokens=int(x.shape[1])
    )
