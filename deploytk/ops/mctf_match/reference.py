"""Eager reference of ``MctfMatch``: MCTF's matching (multi-criteria token fusion, Lee et al. CVPR 2024).

Matching: tokens split by alternation (A = even, B = odd); the score of a pair is
W_sim * W_info * W_size with W_sim = ((cos + 1) / 2)^(1/tau_sim), W_info from the inverse of
the attention each token receives (max-normalised) and W_size from the inverse size
(max-normalised), each pair's product raised to 1/tau. Bidirectional: r//2 A tokens merge
into B, then r - r//2 B tokens (after receiving) merge into the unmerged A tokens, using
the same scores. Output order is the official code's: [unmerged A (sorted when there are
protected tokens), unmerged B by descending score]; with more than one protected token
(distillation, registers) the protected tokens are moved to the front, in order.

``mctf_match`` returns the assignment ``dest`` (see ``ops.reference_common``); the fusion itself is
``token_aggregate`` with attention- and size-based weights, and the one-step-ahead
attention is the same aggregation applied to the attention map's columns and rows.
"""

from __future__ import annotations

import math

import torch

from deploytk.ops.reference_common import interleave, inverse_rank, prefix_first, protected_split, unit_rows


def mctf_scores(metric, received, size, protected: int, tau_sim: float, tau_info: float, tau_size: float):
    """Pair scores [B, Na, Nb]; protected A rows and B columns are -inf."""
    m = unit_rows(metric)
    a, b = m[:, ::2], m[:, 1::2]
    scores = a @ b.transpose(-1, -2)
    scores = ((scores + 1) / 2) ** (1 / tau_sim) if tau_sim else torch.ones_like(scores)
    if tau_info > 0:
        info = 1 / received
        info = info / info.amax(1, keepdim=True)
        scores = scores * (info[:, ::2, None] * info[:, None, 1::2]) ** (1 / tau_info)
    if tau_size > 0:
        inv = 1 / size[..., 0]
        inv = inv / inv.amax(1, keepdim=True)
        scores = scores * (inv[:, ::2, None] * inv[:, None, 1::2]) ** (1 / tau_size)
    pa, pb = protected_split(protected)
    scores[:, :pa, :] = -math.inf
    scores[:, :, :pb] = -math.inf
    return scores


def mctf_match(metric, received, size, r: int, protected: int, tau_sim: float, tau_info: float, tau_size: float, bidirection: bool):
    """Output slot of every token for one MCTF layer (r already capped)."""
    n = metric.shape[1]
    scores = mctf_scores(metric, received, size, protected, tau_sim, tau_info, tau_size)
    r1, r2 = (r // 2, r - r // 2) if bidirection else (r, 0)
    pa, pb = protected_split(protected)
    na, nb = scores.shape[1], scores.shape[2]
    n_unm = na - r1
    node_max, node_idx = scores.max(dim=-1)
    rank_a = inverse_rank(node_max.argsort(dim=-1, descending=True, stable=True))
    is_src = rank_a < r1
    if protected:  # unmerged A tokens keep their original order
        slot_unm = (~is_src).long().cumsum(1) - 1
    else:  # official order: descending score
        slot_unm = rank_a - r1
    if bidirection:
        back = scores.transpose(1, 2).masked_fill(is_src[:, None, :], -math.inf)  # [B, Nb, Na]: B -> unmerged A
        back[:, :pb] = -math.inf  # protected B tokens never merge away
        node_max2, node_idx2 = back.max(dim=-1)
        rank_b = inverse_rank(node_max2.argsort(dim=-1, descending=True, stable=True))
        slot_b = torch.where(rank_b < r2, slot_unm.gather(1, node_idx2), n_unm + rank_b - r2)
    else:
        slot_b = n_unm + torch.arange(nb, device=metric.device).expand(metric.shape[0], -1)
    slot_a = torch.where(is_src, slot_b.gather(1, node_idx), slot_unm)
    return prefix_first(interleave(slot_a, slot_b), protected, n - r)
