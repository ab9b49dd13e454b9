"""``evit``: EViT (Liang et al., ICLR 2022), inference form: keep the top tokens by class attention and
fuse the rest into one extra token, sum_i a_i x_i with the raw class attention a_i (as EViT does).
"""

from __future__ import annotations

import torch

from deploytk.merging.keep_rate import KeepRateReduction
from deploytk.merging.merged_vit import aggregate_size
from deploytk.merging.reduction import register_method


@register_method
class EViT(KeepRateReduction):
    name = "evit"
    kind = "pruning + fusion"
    summary = "EViT: keep the top tokens by class attention, fuse the rest into one token"
    ops = ("TopKSelect", "TokenAggregate")
    extra_tokens = 1  # the fused token

    def reduce(self, model, i, x, size, metric, cls_attn):
        keep = self.keep[i]
        if keep is None:
            return x, size
        p = self.protected
        n_out = p + keep + 1
        dest = model.match("topk_select", cls_attn, keep, p)
        weight = torch.where((dest == p + keep)[..., None], cls_attn[..., None], torch.ones_like(size))
        return torch.ops.deploytk.token_aggregate(x, weight, dest, n_out, False), aggregate_size(size, dest, n_out)
