"""Reduction by CLS attention: Top-K pruning, EViT fusion, crucial-token merging.

The score of a token is the attention the class token pays it (mean over heads), from the
same block. Protected tokens (class, distillation, registers) always stay, in front; the
``keep`` best-scored other tokens stay in their original order. The rest are

- dropped (``topk``: Top-K by CLS attention),
- fused into one extra last token, sum_i a_i x_i with the raw CLS attention a_i (``evit``,
  as EViT does),
- merged into their most similar kept ("crucial") token, cosine on the metric, weighted by
  CLS attention (``crucial``, the multi-scale paper's token mergence).

Ties in the score keep the lower token index first (ONNX TopK's rule).
"""

from __future__ import annotations

import math

import torch

from deploytk.merging.assign import kept_slots


def keep_count(tokens: int, protected: int, keep_rate: float) -> int:
    """EViT's rule: ceil(keep_rate * candidates), candidates = tokens - protected."""
    return math.ceil(keep_rate * (tokens - protected))


def _kept_mask(scores: torch.Tensor, keep: int, protected: int) -> torch.Tensor:
    cand = scores[:, protected:]
    order = cand.argsort(dim=1, descending=True, stable=True)[:, :keep]
    mask = torch.zeros_like(cand, dtype=torch.bool).scatter_(1, order, True)
    prefix = torch.ones(scores.shape[0], protected, dtype=torch.bool, device=scores.device)
    return torch.cat([prefix, mask], dim=1)


def topk_select(scores: torch.Tensor, keep: int, protected: int) -> torch.Tensor:
    """dest [B, N]: kept tokens -> their slot; the others -> slot protected + keep.

    That slot is the drop bucket when nothing is fused (tokens_out = protected + keep) and
    the fused token when the rest is fused (tokens_out = protected + keep + 1).
    """
    kept = _kept_mask(scores, keep, protected)
    return torch.where(kept, kept_slots(kept), protected + keep)


def crucial_match(metric: torch.Tensor, scores: torch.Tensor, keep: int, protected: int) -> torch.Tensor:
    """dest [B, N]: crucial tokens keep a slot; every other token joins its most similar crucial token."""
    kept = _kept_mask(scores, keep, protected)
    slots = kept_slots(kept)
    m = metric / metric.norm(dim=-1, keepdim=True)
    sim = (m @ m.transpose(1, 2)).masked_fill(~kept[:, None, :], -math.inf)
    sim[:, :, :protected] = -math.inf  # protected tokens absorb nothing
    target = sim.argmax(dim=-1)
    return torch.where(kept, slots, slots.gather(1, target))
