"""``tome``: ToMe's bipartite soft matching, merged between attention and MLP (Bolya et al., ICLR 2023).

The metric is the attention keys averaged over heads, from the same block; the r
best-matched tokens of the alternation split merge into their partners as a size-weighted
average, and sizes add up. r is capped per block at (tokens - protected) // 2.
"""

from __future__ import annotations

import torch

from deploytk.merging.merged_vit import aggregate_size
from deploytk.merging.reduction import MethodOptions, Reduction, register_method
from deploytk.merging.schedule import cap_schedule


class ToMeOptions(MethodOptions):
    """ToMe has no options beyond merge.r / merge.prop_attn."""


def tome_merge(model, x, size, metric, r: int):
    """One ToMe merge: match on the metric, then size-weighted average of x; sizes add up.

    Unmerged tokens keep their original order whenever there are protected tokens (as ToMe
    does with a class token).
    """
    dest = model.match("tome_match", metric, r, model.protected, model.protected > 0)
    n_out = x.shape[1] - r
    return torch.ops.deploytk.token_aggregate(x, size, dest, n_out, True), aggregate_size(size, dest, n_out)


@register_method
class ToMe(Reduction):
    tune_knob = "r"
    name = "tome"
    kind = "merging"
    summary = "ToMe: bipartite soft matching on attention keys, size-weighted merge after attention"
    Options = ToMeOptions
    ops = ("ToMeMatch", "TokenAggregate")

    def __init__(self, family, r_per_layer: list[int], options: ToMeOptions):
        super().__init__(family, r_per_layer, options)
        self.schedule = cap_schedule(r_per_layer, self.num_tokens, self.protected)

    def reduce(self, model, i, x, size, metric, cls_attn):
        r = self.schedule.effective_r[i]
        return tome_merge(model, x, size, metric, r) if r > 0 else (x, size)
