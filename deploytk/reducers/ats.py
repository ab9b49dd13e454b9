"""``ats``: adaptive token sampling (ATS, Fayyaz et al., ECCV 2022), training-free, as "Which Tokens to Use?" runs it.

At each block of ``merge.options.layers``, after attention, every patch token gets a
significance score (the class token's attention times the norm of the token's value, summed
over heads); the scores' CDF is sampled at K - 1 fixed steps (K = int(keep_rate^(s+1) *
patches) + 1, the study's rule; ``torch.arange``'s step count, so K - 1 or K steps) and the
distinct sampled tokens are kept, in order. ATS keeps a data-dependent number of tokens, at
most one per step; deploytk exports one slot per step (``deploytk.ATSSample``), and the slots a
duplicate sample leaves empty carry size 0, which proportional attention (log 0 = -inf) and the
size-weighted pool ignore exactly: the same logits as dynamic ATS (the study's code masks its
padded tokens out of attention the same way), at the cost of computing the empty slots.
"""

from __future__ import annotations

import torch

from deploytk.adapters.attention import attention_probs
from deploytk.errors import DeploytkError
from deploytk.merging.keep_rate import KeepRateOptions
from deploytk.merging.merged_vit import aggregate_size
from deploytk.merging.reduction import Reduction, check_layers, register_method
from deploytk.merging.schedule import TokenSchedule
from deploytk.ops.ats_sample.reference import ats_steps


@register_method
class ATS(Reduction):
    name = "ats"
    kind = "pruning"
    summary = "ATS (adaptive token sampling), training-free: sample tokens from the CDF of class attention x value norm"
    Options = KeepRateOptions
    uses_r = False
    tune_knob = "keep_rate"
    ops = ("ATSSample", "TokenAggregate", "ProportionalAttention")
    needs_prop_attn = True

    def __init__(self, family, r_per_layer: list[int], options: KeepRateOptions):
        super().__init__(family, r_per_layer, options)
        if not family.has_class_token:
            raise DeploytkError("method ats samples by the class token's attention, but this model has no class token.")
        if family.post_norm:
            raise DeploytkError("method ats supports pre-norm blocks only (this model's blocks are post-norm).")
        self.layers = check_layers(options.layers, self.depth, self.name)
        patches = self.num_tokens - self.protected
        self.slots: list[int | None] = []
        tokens, removed, t = [], [], self.num_tokens
        for i in range(self.depth):
            tokens.append(t)
            steps = ats_steps(int(float(options.keep_rate) ** (self.layers.index(i) + 1) * patches) + 1) if i in self.layers else None
            active = steps is not None and 1 <= steps.numel() < t - self.protected
            if active:
                self.register_buffer(f"steps_{i}", steps, persistent=False)
            self.slots.append(steps.numel() if active else None)
            removed.append(t - self.protected - steps.numel() if active else 0)
            t -= removed[-1]
        self.schedule = TokenSchedule(removed, removed, tokens, self.protected)

    def block(self, model, i, blk, x, size):
        slots = self.slots[i]
        if slots is None:
            return model.standard_block(i, blk, x, size)
        p = self.protected
        h = blk.attn_input(x)
        gate = blk.gate(h)
        q, k, v = blk.qkv(h)
        out = torch.ops.deploytk.proportional_attention(q, k, v, size, float(blk.scale))
        cls_attn = attention_probs(blk.scale, q[:, :, :1], k, size)[:, :, 0, p:]  # [B, H, M] per head
        significance = (cls_attn * v[:, :, p:].float().norm(dim=-1)).sum(dim=1)
        x = blk.attn_residual(x, blk.attn_output(out, gate))
        dest = model.match("ats_sample", significance, size[:, p:], getattr(self, f"steps_{i}"))
        kept = torch.ops.deploytk.token_aggregate(x[:, p:], torch.ones_like(size[:, p:]), dest, slots, False)
        x = torch.cat([x[:, :p], kept], dim=1)
        size = torch.cat([size[:, :p], aggregate_size(size[:, p:], dest, slots)], dim=1)
        return blk.mlp_residual(x), size
