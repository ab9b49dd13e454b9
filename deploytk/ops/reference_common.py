"""Helpers shared by the eager references of the matching ops.

Every token reduction is an assignment: ``dest`` [B, N] (int64) holds the output slot of
each input token, ``tokens_out`` meaning "dropped"; ``TokenAggregate`` applies it. These
helpers build such assignments in plain batched torch.
"""

from __future__ import annotations

import torch


def protected_split(protected: int) -> tuple[int, int]:
    """How many protected tokens fall in set A (even positions) and in set B (odd) of the alternation split."""
    return (protected + 1) // 2, protected // 2


def unit_rows(metric: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit L2 norm (the cosine-similarity metric); a zero-length row stays zero, so its cosine to
    every token is 0 rather than NaN (the tie rule, ``deploytk.ops.ties``)."""
    norm = metric.norm(dim=-1, keepdim=True)
    return metric / torch.where(norm == 0, 1, norm)


def inverse_rank(order: torch.Tensor) -> torch.Tensor:
    """rank[b, order[b, k]] = k: the position of each element in a sort order."""
    rank = torch.empty_like(order)
    ar = torch.arange(order.shape[1], device=order.device).expand_as(order)
    return rank.scatter_(1, order, ar)


def kept_slots(keep_mask: torch.Tensor) -> torch.Tensor:
    """Slot of each kept token when kept tokens keep their original order."""
    return keep_mask.long().cumsum(1) - 1


def prefix_first(dest: torch.Tensor, protected: int, tokens_out: int) -> torch.Tensor:
    """Renumber output slots so the protected tokens' slots come first, in their order.

    The other slots keep their relative order. Identity when ``protected`` <= 1 and the
    class token already sits in slot 0.
    """
    if protected == 0:
        return dest
    b = dest.shape[0]
    prefix_slots = dest[:, :protected]
    is_prefix = torch.zeros(b, tokens_out, dtype=torch.bool, device=dest.device)
    is_prefix.scatter_(1, prefix_slots, True)
    new_pos = protected + (~is_prefix).long().cumsum(1) - 1
    new_pos.scatter_(1, prefix_slots, torch.arange(protected, device=dest.device).expand(b, -1))
    new_pos = torch.cat([new_pos, torch.full((b, 1), tokens_out, device=dest.device)], dim=1)  # drop bucket
    return new_pos.gather(1, dest)


def interleave(even: torch.Tensor, odd: torch.Tensor) -> torch.Tensor:
    """[e0, o0, e1, o1, ...] for the alternation split A = tokens[0::2], B = tokens[1::2]."""
    b, na = even.shape
    out = even.new_empty(b, na + odd.shape[1])
    out[:, ::2] = even
    out[:, 1::2] = odd
    return out


def kept_mask(scores: torch.Tensor, keep: int, protected: int) -> torch.Tensor:
    """The protected tokens and the ``keep`` best-scored others (ties: lower index first, as ONNX TopK)."""
    cand = scores[:, protected:]
    order = cand.argsort(dim=1, descending=True, stable=True)[:, :keep]
    mask = torch.zeros_like(cand, dtype=torch.bool).scatter_(1, order, True)
    prefix = torch.ones(scores.shape[0], protected, dtype=torch.bool, device=scores.device)
    return torch.cat([prefix, mask], dim=1)


def top_indices(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest values per row, largest first (ties: lower index first, as ONNX TopK)."""
    return values.argsort(dim=1, descending=True, stable=True)[:, :k]
