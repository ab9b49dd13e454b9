"""Token reductions as an assignment: every input token gets the output slot it goes to.

All methods beyond ToMe are split into a *matching* step that computes ``dest`` [B, N]
(int64, the output slot of each input token; ``tokens_out`` means "dropped") and one shared
*aggregation* step that applies it: out[j] = sum_{dest[i]=j} w_i x_i (/ sum w_i). That is
the split a GPU plugin needs (one kernel each) and it keeps every method's ONNX small.

Helpers here are the eager references shared by the matching ops.
"""

from __future__ import annotations

import torch


def token_aggregate(x: torch.Tensor, weight: torch.Tensor, dest: torch.Tensor, tokens_out: int, normalize: bool) -> torch.Tensor:
    """out[b, j] = sum_{i: dest[b,i]=j} weight[b,i] x[b,i], divided by sum weight[b,i] if ``normalize``.

    x [B, N, C], weight [B, N, 1], dest [B, N] in [0, tokens_out]; slot ``tokens_out`` is
    a drop bucket that is discarded. The sums are taken in fp32 (weights are token sizes or
    attention, which fp16 would round) and the result is returned in x's dtype.
    """
    b, _, c = x.shape
    idx = dest[..., None]
    xf, wf = x.float(), weight.float()
    acc = xf.new_zeros(b, tokens_out + 1, c).scatter_add(1, idx.expand(-1, -1, c), xf * wf)
    acc = acc[:, :tokens_out]
    if normalize:
        acc = acc / wf.new_zeros(b, tokens_out + 1, 1).scatter_add(1, idx, wf)[:, :tokens_out]
    return acc.to(x.dtype)


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
