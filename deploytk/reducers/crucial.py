"""``crucial``: crucial-token merging ("Multi-Scale And Token Mergence", token mergence): keep the top
tokens by class attention (the crucial ones) and merge every other token into its most similar
crucial token (cosine on the attention keys), weighted by class attention. Our reading of the paper.
"""

from __future__ import annotations

import torch

from deploytk.merging.keep_rate import KeepRateReduction
from deploytk.merging.merged_vit import aggregate_size
from deploytk.merging.reduction import register_method


@register_method
class Crucial(KeepRateReduction):
    name = "crucial"
    kind = "merging"
    summary = "Crucial-token merge: each non-crucial token joins its most similar crucial (top class-attention) token"
    ops = ("CrucialMatch", "TokenAggregate")

    def reduce(self, model, i, x, size, metric, cls_attn):
        keep = self.keep[i]
        if keep is None:
            return x, size
        n_out = self.protected + keep
        dest = model.match("crucial_match", metric, cls_attn, keep, self.protected)
        return torch.ops.deploytk.token_aggregate(x, cls_attn[..., None], dest, n_out, True), aggregate_size(size, dest, n_out)
