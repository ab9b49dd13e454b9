"""Eager reference of ``ToMeMatch``: ToMe's bipartite soft matching (and its merge, for the tests).

This is the eager reference behind ``deploytk::tome_match`` (+ ``token_aggregate``). It follows the public
ToMe algorithm (facebookresearch/ToMe ``merge.py``) and generalises its protected tokens
from {class, distillation} to the first ``protected`` tokens (class + distillation +
register tokens): a protected token in the alternation's set A may not be a source (its
score row is -inf) and one in set B may not be a destination (its column is -inf).
"""

from __future__ import annotations

import math

import torch

from deploytk.ops.reference_common import protected_split, unit_rows


def bipartite_matching(
    metric: torch.Tensor, r: int, protected: int, sort_unmerged: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Match r tokens of A = tokens[0::2] into B = tokens[1::2].

    Returns (unm_idx [B, Na-r], src_idx [B, r], dst_idx [B, r]) as int64 indices into A,
    A and B. Unmerged A-tokens come in descending-score order like ToMe, or in original
    order when ``sort_unmerged`` (ToMe sorts whenever there is a class token).
    """
    pa, pb = protected_split(protected)
    metric = unit_rows(metric)
    a, b = metric[:, ::2], metric[:, 1::2]
    scores = a @ b.transpose(-1, -2)
    if pa:
        scores[:, :pa, :] = -math.inf
    if pb:
        scores[:, :, :pb] = -math.inf
    node_max, node_idx = scores.max(dim=-1)
    edge_idx = node_max.argsort(dim=-1, descending=True, stable=True)
    unm_idx = edge_idx[:, r:]
    src_idx = edge_idx[:, :r]
    dst_idx = node_idx.gather(dim=-1, index=src_idx)
    if sort_unmerged:
        unm_idx = unm_idx.sort(dim=-1).values
    return unm_idx, src_idx, dst_idx


def apply_merge(
    x: torch.Tensor,
    unm_idx: torch.Tensor,
    src_idx: torch.Tensor,
    dst_idx: torch.Tensor,
    protected: int,
) -> torch.Tensor:
    """Sum-merge x's A-sources into their B-destinations; output [prefix, rest of A, rest of B].

    The protected prefix keeps its original interleaved order (class, dist/registers...).
    """
    pa, pb = protected_split(protected)
    xa, xb = x[:, ::2], x[:, 1::2]
    batch, _, channels = xa.shape
    unm = xa.gather(1, unm_idx[..., None].expand(batch, unm_idx.shape[1], channels))
    src = xa.gather(1, src_idx[..., None].expand(batch, src_idx.shape[1], channels))
    dst = xb.scatter_add(1, dst_idx[..., None].expand(batch, dst_idx.shape[1], channels), src)
    parts = []
    for i in range(protected):  # class, then alternately B and A prefix tokens
        parts.append(unm[:, i // 2 : i // 2 + 1] if i % 2 == 0 else dst[:, i // 2 : i // 2 + 1])
    parts += [unm[:, pa:], dst[:, pb:]]
    return torch.cat(parts, dim=1)


def merge_tokens(
    x: torch.Tensor,
    size: torch.Tensor,
    metric: torch.Tensor,
    r: int,
    protected: int,
    sort_unmerged: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One ToMe layer: match on ``metric`` and size-weighted-average x; sizes add up."""
    with torch.no_grad():
        unm_idx, src_idx, dst_idx = bipartite_matching(metric, r, protected, sort_unmerged)
    merged = apply_merge(torch.cat([x * size, size], dim=-1), unm_idx, src_idx, dst_idx, protected)
    new_size = merged[..., -1:]
    return merged[..., :-1] / new_size, new_size


def tome_slots(na: int, nb: int, r: int, protected: int) -> tuple[list[int], list[int]]:
    """Output slot of the k-th unmerged A token and of each B token in ``apply_merge``'s order.

    Order: the protected prefix interleaved (A0, B0, A1, ...), the other unmerged A tokens,
    the other B tokens. Closed form, so kernels and ONNX bodies compute it without a sort.
    """
    pa, pb = protected_split(protected)
    n_unm = na - r
    unm = [2 * k if k < pa else protected + k - pa for k in range(n_unm)]
    dst = [2 * j + 1 if j < pb else protected + n_unm - pa + j - pb for j in range(nb)]
    return unm, dst


def tome_dest(metric: torch.Tensor, r: int, protected: int, sort_unmerged: bool) -> torch.Tensor:
    """ToMe's matching as an assignment: dest [B, N], the output slot of every token.

    ``token_aggregate(x, size, dest, N - r, normalize=True)`` then equals ``merge_tokens``'s
    x (and the unnormalised aggregate of ``size`` its sizes): the split a GPU plugin needs.
    """
    batch, n, _ = metric.shape
    na, nb = (n + 1) // 2, n // 2
    unm_idx, src_idx, dst_idx = bipartite_matching(metric, r, protected, sort_unmerged)
    unm_slot, b_slot = (torch.tensor(s, dtype=torch.long, device=metric.device) for s in tome_slots(na, nb, r, protected))
    dest_a = torch.empty(batch, na, dtype=torch.long, device=metric.device)
    dest_a.scatter_(1, unm_idx, unm_slot.expand(batch, -1))
    dest_a.scatter_(1, src_idx, b_slot[dst_idx])
    dest = torch.empty(batch, n, dtype=torch.long, device=metric.device)
    dest[:, ::2], dest[:, 1::2] = dest_a, b_slot.expand(batch, -1)
    return dest
