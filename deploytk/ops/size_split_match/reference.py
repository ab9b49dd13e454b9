"""Eager reference of ``SizeSplitMatch``: ATM's size-distinctive matching.

The candidates (tokens after the protected prefix) are sorted by size (stable: ties by
index); the smaller half A is matched into the larger half B, so large tokens do not merge
with each other, and the r best-matched A tokens merge into their most similar B token.
Every other token keeps a slot, in original order (protected tokens first).
"""

from __future__ import annotations

import torch

from deploytk.ops.reference_common import kept_slots, unit_rows


def _size_split(size: torch.Tensor, protected: int):
    """Candidate tokens sorted by size (stable): first half A (small, sources), rest B."""
    cand = size[:, protected:, 0]
    order = cand.argsort(dim=1, stable=True)
    na = (cand.shape[1] + 1) // 2
    return order[:, :na], order[:, na:]


def size_split_scores(metric: torch.Tensor, size: torch.Tensor, protected: int):
    """Cosine scores [B, Na, Nb] between the small-size and large-size halves, and the halves."""
    oa, ob = _size_split(size, protected)
    mc = unit_rows(metric)[:, protected:]
    d = mc.shape[-1]
    a = mc.gather(1, oa[..., None].expand(-1, -1, d))
    b = mc.gather(1, ob[..., None].expand(-1, -1, d))
    return a @ b.transpose(1, 2), oa, ob


def size_split_match(metric: torch.Tensor, size: torch.Tensor, r: int, protected: int) -> torch.Tensor:
    """dest [B, N]: the r best-matched small tokens merge into their most similar large token."""
    scores, oa, ob = size_split_scores(metric, size, protected)
    node_max, node_idx = scores.max(dim=-1)
    src_pos = node_max.argsort(dim=1, descending=True, stable=True)[:, :r]
    src_tok = oa.gather(1, src_pos)
    m = oa.shape[1] + ob.shape[1]
    merged = torch.zeros(oa.shape[0], m, dtype=torch.bool, device=oa.device).scatter_(1, src_tok, True)
    target = torch.zeros_like(merged, dtype=torch.long).scatter_(1, oa, ob.gather(1, node_idx))
    prefix = torch.zeros(oa.shape[0], protected, dtype=torch.bool, device=oa.device)
    merged = torch.cat([prefix, merged], dim=1)
    target = torch.cat([prefix.long(), target + protected], dim=1)
    slots = kept_slots(~merged)
    return torch.where(merged, slots.gather(1, target), slots)
