"""``visionzip``: VisionZip, a fixed set of dominant and contextual tokens for a VLM's vision tower (Yang et al.,
"VisionZip: Longer is Better but Not Necessary in Vision Language Models", CVPR 2025; official code
dvlab-research/VisionZip, now JIA-Lab-research/VisionZip).

At one layer of the tower (LLaVA's feature layer, -2, by default) the tokens are cut to ``dominant + contextual``:
the class token and the patches that receive the most of its attention (summed over heads) are kept as they are;
of the rest, ``contextual`` evenly spaced targets each absorb the tokens most similar to them (cosine on the keys
averaged over heads), as the target plus the mean of those tokens (``deploytk.VisionZipSelect`` makes both choices,
``TokenAggregate`` builds the tokens). The output is the token set a language model takes: ``export.output: tokens``
at ``export.feature_layer`` = ``layer``, with ``keep_prefix_tokens: true`` for the official 64 / 128 / 192 tokens
(the class token is one of the dominant ones). Blocks after ``layer``, if the output runs them, see the reduced set.
"""

from __future__ import annotations

import torch
from pydantic import Field, StrictInt

from deploytk.errors import DeploytkError
from deploytk.merging.merged_vit import aggregate_size
from deploytk.merging.reduction import MethodOptions, Reduction, register_method
from deploytk.merging.schedule import TokenSchedule
from deploytk.ops.visionzip_select.reference import contextual_targets, target_step


class VisionZipOptions(MethodOptions):
    dominant: StrictInt = Field(
        54, ge=1, description="dominant tokens, the class (prefix) tokens included, as the official `dominant`: 54 of LLaVA-1.5's 64"
    )
    contextual: StrictInt = Field(10, ge=1, description="contextual tokens: evenly spaced targets merged with the tokens most like them")
    layer: StrictInt = Field(
        -2, description="the hidden state VisionZip selects from, counted as transformers' hidden_states (-2: LLaVA's penultimate layer)"
    )


@register_method
class VisionZip(Reduction):
    name = "visionzip"
    kind = "pruning + merging"
    summary = "VisionZip: keep the tokens the class token attends to most, merge the rest into a few contextual tokens"
    Options = VisionZipOptions
    ops = ("VisionZipSelect", "TokenAggregate")
    uses_r = False
    schedule_knobs = "`dominant` + `contextual` at `layer`"
    untunable_reason = (
        "its token count is the language model's input size, set by `merge.options.dominant` + `contextual`; "
        "tune the tower's other method, or set the counts the model was built for"
    )

    def __init__(self, family, r_per_layer: list[int], options: VisionZipOptions):
        super().__init__(family, r_per_layer, options)
        depth, p = self.depth, self.protected
        if not family.has_class_token:
            raise DeploytkError(f"method {self.name} keeps the tokens the class token attends to most, and this model has no class token.")
        hidden = options.layer if options.layer >= 0 else depth + 1 + options.layer
        if not 1 <= hidden <= depth:
            raise DeploytkError(
                f"`merge.options.layer` = {options.layer}: VisionZip selects on a block's attention, so the layer must be the output "
                f"of one of this {depth}-block model's blocks: 1..{depth} or -{depth}..-1."
            )
        #: the block at whose end the tokens are selected
        self.at_block = hidden - 1
        #: dominant patches besides the prefix tokens
        self.dominant_patches = options.dominant - p
        patches = self.num_tokens - p
        remaining = patches - self.dominant_patches
        if not 1 <= self.dominant_patches < patches or not options.contextual <= remaining:
            raise DeploytkError(
                f"`merge.options.dominant` = {options.dominant} and `contextual` = {options.contextual} do not fit this model's "
                f"{patches} patches and {p} prefix tokens: dominant must be in [{p + 1}, {p + patches - 1}] (prefix tokens included) "
                f"and contextual in [1, the {remaining} patches dominant leaves]."
            )
        self.contextual = options.contextual
        self.step = target_step(remaining, options.contextual)
        kept = p + self.dominant_patches + options.contextual
        removed = [self.num_tokens - kept if i == self.at_block else 0 for i in range(depth)]
        tokens = [self.num_tokens if i <= self.at_block else kept for i in range(depth)]
        self.schedule = TokenSchedule(removed, removed, tokens, p)

    def block(self, model, i, blk, x, size):
        if i != self.at_block:
            return model.standard_block(i, blk, x, size)
        x, probs, keys = model.block_with_attention_map(blk, x, size)
        received = probs[:, :, 0].sum(dim=1)  # the class token's attention, summed over heads (the official order)
        p, first = self.protected, self.protected + self.dominant_patches
        dest = model.match("visionzip_select", received, keys, self.dominant_patches, self.contextual, p)
        n_out = first + self.contextual
        # a contextual token is its target plus the mean of the tokens that joined it (none joined: the target alone)
        is_target = contextual_targets(dest >= first, self.step, self.contextual) >= 0
        joined = aggregate_size(torch.ones_like(size), dest, n_out).gather(1, dest[..., None]) - 1
        weight = torch.where(((dest >= first) & ~is_target)[..., None], 1.0 / joined.clamp(min=1), torch.ones_like(size))
        return torch.ops.deploytk.token_aggregate(x, weight, dest, n_out, False), aggregate_size(size, dest, n_out)
