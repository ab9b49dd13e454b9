"""Eager reference of ``TokenAggregate``: apply an assignment ``dest`` to the tokens."""

from __future__ import annotations

import torch


def token_aggregate(x: torch.Tensor, weight: torch.Tensor, dest: torch.Tensor, tokens_out: int, normalize: bool) -> torch.Tensor:
    """out[b, j] = sum_{i: dest[b,i]=j} weight[b,i] x[b,i], divided by sum weight[b,i] if ``normalize``.

    x [B, N, C], weight [B, N, 1], dest [B, N] in [0, tokens_out]; slot ``tokens_out`` is
    a drop bucket that is discarded. The sums are taken in fp32 (or wider) (weights are token sizes or
    attention, which fp16 would round) and the result is returned in x's dtype.
    Any ``dest`` in range is summed here; the ONNX body needs the op's contract (the package's
    docstring): at most N - tokens_out kept tokens share a slot with a lower-numbered token.
    """
    b, _, c = x.shape
    idx = dest[..., None]
    wide = torch.promote_types(x.dtype, torch.float32)  # fp32 sums for fp16/bf16; fp64 stays fp64 (gradient checks)
    xf, wf = x.to(wide), weight.to(wide)
    acc = xf.new_zeros(b, tokens_out + 1, c).scatter_add(1, idx.expand(-1, -1, c), xf * wf)
    acc = acc[:, :tokens_out]
    if normalize:
        acc = acc / wf.new_zeros(b, tokens_out + 1, 1).scatter_add(1, idx, wf)[:, :tokens_out]
    return acc.to(x.dtype)
