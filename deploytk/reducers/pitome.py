"""``pitome``: PiToMe, energy-protected token merging (Tran et al., "Accelerating Transformers with Spectrum-Preserving
Token Merging", NeurIPS 2024; official code hchautran/PiToMe).

ToMe's successor for ViT backbones. In each merging block, after attention (ToMe's place), every token's *energy*
(mean over tokens of elu(cosine - margin) on the keys averaged over heads) says how redundant it is; tokens are
matched in descending-energy order. The first half of the blocks match that whole order bipartitely; later blocks
merge only the 2r highest-energy tokens and protect the rest, the isolated, informative ones (``deploytk.PiToMeMatch``).
The merge is ToMe's size-weighted average (``TokenAggregate``), sizes add up.

The schedule is the official one (``algo/pitome/patch/deit.py``, which patches any timm ViT): every block keeps
``keep_rate`` of its non-protected tokens, merging floor(T - T * keep_rate); block i's margin is
margin - margin_decay * i / depth. The official blocks use plain attention, not proportional attention: the ready-made
configs set ``merge.prop_attn: false``. Prefix tokens (class, distillation, registers) are protected, where the
official code protects the class token.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field, StrictFloat, StrictInt

from deploytk.merging.merged_vit import aggregate_size
from deploytk.merging.reduction import MethodOptions, Reduction, check_layers, register_method
from deploytk.merging.schedule import TokenSchedule


class PiToMeOptions(MethodOptions):
    keep_rate: StrictFloat | StrictInt = Field(
        0.9, gt=0, le=1, description="fraction of its non-protected tokens each merging block keeps (the official `ratio`, 0.9-0.975)"
    )
    layers: list[StrictInt] | None = Field(None, description="blocks that merge (0-based); default every block, as the official code")
    margin: StrictFloat | StrictInt = Field(0.75, description="energy margin of block 0 (the official DeiT/timm value)")
    margin_decay: StrictFloat | StrictInt = Field(0.75, description="block i's margin is margin - margin_decay * i / depth")
    alpha: StrictFloat | StrictInt = Field(1.0, gt=0, description="ELU alpha of the energy (the official default)")
    bipartite_blocks: StrictInt | None = Field(
        None,
        ge=0,
        description="the first this many blocks match every token in energy order (the official `pitome_bsm`); later "
        "blocks merge only the 2r highest-energy tokens (`pitome`); default ceil(depth / 2), as the official code",
    )


def merged_count(tokens: int, keep_rate: float) -> int:
    """Tokens a block merges away: the official ``math.floor(T - T * ratio)`` over its T non-protected tokens."""
    return math.floor(tokens - tokens * keep_rate)


@register_method
class PiToMe(Reduction):
    name = "pitome"
    kind = "merging"
    summary = "PiToMe: ToMe's matching in energy order, informative (low-energy) tokens protected in later blocks"
    Options = PiToMeOptions
    ops = ("PiToMeMatch", "TokenAggregate")
    uses_r = False
    schedule_knobs = "`keep_rate` in every block of `layers`"
    tune_knob = "keep_rate"

    def __init__(self, family, r_per_layer: list[int], options: PiToMeOptions):
        super().__init__(family, r_per_layer, options)
        depth = self.depth
        layers = set(check_layers(options.layers, depth, self.name) if options.layers is not None else range(depth))
        self.bipartite_blocks = math.ceil(depth * 0.5) if options.bipartite_blocks is None else options.bipartite_blocks
        self.margins = [float(options.margin) - float(options.margin_decay) * (i / depth) for i in range(depth)]
        tokens, merged, t = [], [], self.num_tokens
        for i in range(depth):
            tokens.append(t)
            candidates = t - self.protected
            r = min(merged_count(candidates, float(options.keep_rate)), candidates // 2) if i in layers else 0
            merged.append(max(r, 0))
            t -= merged[-1]
        self.schedule = TokenSchedule(merged, merged, tokens, self.protected)

    def reduce(self, model, i, x, size, metric, cls_attn):
        r = self.schedule.effective_r[i]
        if r == 0:
            return x, size
        protect = i >= self.bipartite_blocks
        dest = model.match("pitome_match", metric, r, self.protected, self.margins[i], float(self.options.alpha), protect)
        n_out = x.shape[1] - r
        return torch.ops.deploytk.token_aggregate(x, size, dest, n_out, True), aggregate_size(size, dest, n_out)
