"""``topk``: Top-K pruning by class attention: keep the tokens the class token attends to most, drop the rest.

The score of a token is the attention the class token pays it (mean over heads), from the
same block; ``deploytk.TopKSelect`` keeps the protected tokens and the ``keep`` best-scored
others in order, and ``TokenAggregate`` drops the rest.
"""

from __future__ import annotations

import torch

from deploytk.merging.keep_rate import KeepRateReduction
from deploytk.merging.merged_vit import aggregate_size
from deploytk.merging.reduction import register_method


@register_method
class TopK(KeepRateReduction):
    name = "topk"
    kind = "pruning"
    summary = "Top-K: keep the tokens the class token attends to most, drop the rest"
    ops = ("TopKSelect", "TokenAggregate")

    def reduce(self, model, i, x, size, metric, cls_attn):
        keep = self.keep[i]
        if keep is None:
            return x, size
        n_out = self.protected + keep
        dest = model.match("topk_select", cls_attn, keep, self.protected)
        return torch.ops.deploytk.token_aggregate(x, torch.ones_like(size), dest, n_out, False), aggregate_size(size, dest, n_out)
