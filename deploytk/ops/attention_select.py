"""Selection by CLS attention: ``deploytk.TopKSelect`` and ``deploytk.CrucialMatch``.

TopKSelect(scores [B, N]; keep, protected) -> dest [B, N]: the protected tokens and the
``keep`` best-scored others keep their slots in order; every other token goes to slot
protected + keep (dropped for Top-K, the fused token for EViT; the caller's
``TokenAggregate.tokens_out`` decides which).

CrucialMatch(metric [B, N, D], scores [B, N]; keep, protected) -> dest [B, N]: as above, but
every non-kept token goes to the slot of its most similar kept token (cosine on metric).
"""

from __future__ import annotations

import torch
from onnxscript import FLOAT, INT64, script

from deploytk.errors import DeploytkError
from deploytk.merging.pruning import crucial_match as _crucial_reference
from deploytk.merging.pruning import topk_select as _topk_reference
from deploytk.ops._onnx_common import deploytk_opset, op

_BIG = 2**62


def check_select_args(name: str, scores, keep: int, protected: int, metric=None) -> None:
    if scores.dim() != 2 or (metric is not None and (metric.dim() != 3 or metric.shape[:2] != scores.shape)):
        got = f"scores {tuple(scores.shape)}" + (f", metric {tuple(metric.shape)}" if metric is not None else "")
        raise DeploytkError(f"{name} expects scores [B, N]" + (" and metric [B, N, D]" if metric is not None else "") + f"; got {got}.")
    n = scores.shape[1]
    if protected < 0 or protected >= n:
        raise DeploytkError(f"{name}: protected={protected} must be in [0, {n - 1}] for {n} tokens.")
    if keep < 1 or keep >= n - protected:
        raise DeploytkError(
            f"{name}: keep={keep} is not allowed for {n} tokens with {protected} protected; keep must be in [1, {n - protected - 1}]."
        )


@torch.library.custom_op("deploytk::topk_select", mutates_args=())
def topk_select(scores: torch.Tensor, keep: int, protected: int) -> torch.Tensor:
    check_select_args("topk_select", scores, keep, protected)
    return _topk_reference(scores, keep, protected)


@topk_select.register_fake
def _(scores, keep, protected):
    return scores.new_empty(scores.shape, dtype=torch.int64)


@torch.library.custom_op("deploytk::crucial_match", mutates_args=())
def crucial_match(metric: torch.Tensor, scores: torch.Tensor, keep: int, protected: int) -> torch.Tensor:
    check_select_args("crucial_match", scores, keep, protected, metric)
    return _crucial_reference(metric, scores, keep, protected)


@crucial_match.register_fake
def _(metric, scores, keep, protected):
    return scores.new_empty(scores.shape, dtype=torch.int64)


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
    end = op.Constant(value_ints=[_BIG])
    k1 = op.Reshape(op.Constant(value_int=keep), one)
    p1 = op.Reshape(op.Constant(value_int=protected), one)
    _, order = op.TopK(op.Slice(scores, p1, end, ax1), k1, axis=-1, largest=1, sorted=1)
    cand = op.Expand(op.Constant(value_int=0), op.Shape(op.Slice(scores, p1, end, ax1)))
    picked = op.ScatterElements(cand, order, op.Expand(op.Constant(value_int=1), op.Shape(order)), axis=1)
    kept = op.Pad(picked, op.Concat(zero, p1, zero, zero, axis=0), op.Constant(value_int=1))  # [B, N]
    slots = op.Sub(op.CumSum(kept, op.Constant(value_int=1)), one)
    return op.Where(op.Cast(kept, to=9), slots, op.Add(p1, k1))


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
    end = op.Constant(value_ints=[_BIG])
    k1 = op.Reshape(op.Constant(value_int=keep), one)
    p1 = op.Reshape(op.Constant(value_int=protected), one)
    _, order = op.TopK(op.Slice(scores, p1, end, ax1), k1, axis=-1, largest=1, sorted=1)
    cand = op.Expand(op.Constant(value_int=0), op.Shape(op.Slice(scores, p1, end, ax1)))
    picked = op.ScatterElements(cand, order, op.Expand(op.Constant(value_int=1), op.Shape(order)), axis=1)
    kept_c = op.Pad(picked, op.Concat(zero, p1, zero, zero, axis=0), op.Constant(value_int=0))  # crucial, not protected
    kept = op.Pad(picked, op.Concat(zero, p1, zero, zero, axis=0), op.Constant(value_int=1))
    slots = op.Sub(op.CumSum(kept, op.Constant(value_int=1)), one)
    m = op.Div(metric, op.ReduceL2(metric, last, keepdims=1))
    sim = op.MatMul(m, op.Transpose(m, perm=[0, 2, 1]))
    sim = op.Where(op.Unsqueeze(op.Cast(kept_c, to=9), ax1), sim, op.Constant(value_float=float("-inf")))
    target = op.ArgMax(sim, axis=-1, keepdims=0)
    return op.Where(op.Cast(kept, to=9), slots, op.GatherElements(slots, target, axis=1))


def translate_topk_select(scores, keep: int, protected: int):
    return TopKSelect(scores, keep=keep, protected=protected, tokens=int(scores.shape[1]))


def translate_crucial_match(metric, scores, keep: int, protected: int):
    return CrucialMatch(metric, scores, keep=keep, protected=protected, tokens=int(scores.shape[1]))
