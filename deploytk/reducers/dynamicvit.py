"""``dynamicvit``: DynamicViT (Rao et al., NeurIPS 2021) in its inference form, as "Which Tokens to Use?" trains it (learned).

Before a reducing block, a small predictor scores every patch from its own features and the
mean of all patches (LayerNorm, Linear, GELU; half the channels local, half the global mean;
three Linear/GELU layers to 2 log-probabilities); the int(patches * keep_rate^(s + 1))
patches with the highest keep log-probability stay and the rest are dropped, as the official
model does at evaluation. ``deploytk.TopKSelect`` makes the choice (ties: the lower index;
the kept tokens stay in token order where the official code sorts them by score, which no
attention block can tell apart) and ``TokenAggregate`` drops. Checkpoint keys (the study's
``DynamicVisionTransformer``): ``score_predictor.{s}.in_conv.0|1`` (LayerNorm, Linear) and
``score_predictor.{s}.out_conv.0|2|4`` (Linear). The class, distillation and register tokens
are never scored; the official code scores everything after the class token.
"""

from __future__ import annotations

import torch
from torch import nn

from deploytk.merging.learned import LearnedReduction
from deploytk.merging.merged_vit import aggregate_size
from deploytk.merging.reduction import register_method


class ScorePredictor(nn.Module):
    """Per-patch keep/drop log-probabilities [B, N, 2]; names as the official ``PredictorLG``."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.in_conv = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU())
        self.out_conv = nn.Sequential(
            nn.Linear(dim, dim // 2),
            nn.GELU(),
            nn.Linear(dim // 2, dim // 4),
            nn.GELU(),
            nn.Linear(dim // 4, 2),
            nn.LogSoftmax(dim=-1),
        )
        self.eps = eps

    def forward(self, patches: torch.Tensor, policy: torch.Tensor | None = None) -> torch.Tensor:
        """``policy`` [B, N, 1]: training's soft keep mask (the global mean over kept patches); at
        inference the dropped patches are gone, so the mean is over all of them."""
        h = self.in_conv(patches)
        half = h.shape[-1] // 2
        if policy is None:
            pooled = h[..., half:].mean(dim=1, keepdim=True)
        else:
            pooled = (h[..., half:] * policy).sum(dim=1, keepdim=True) / policy.sum(dim=1, keepdim=True)
        local, pooled = h[..., :half], pooled + self.eps
        return self.out_conv(torch.cat([local, pooled.expand(-1, h.shape[1], -1)], dim=-1))


@register_method
class DynamicViT(LearnedReduction):
    tune_knob = "keep_rate"  # the predictor scores tokens; how many are kept is free at inference
    name = "dynamicvit"
    kind = "pruning"
    summary = "DynamicViT (Which Tokens to Use?): a learned predictor scores the patches, the best-scored stay"
    ops = ("TopKSelect", "TokenAggregate")
    checkpoint_prefix = "score_predictor"

    def make_layer(self, dim, tokens_out):
        return ScorePredictor(dim)

    def reduce_patches(self, model, i, x, size):
        p, keep = self.protected, self.clusters[i]
        keep_score = self.layer(i)(x[:, p:].float())[..., 0]
        scores = torch.cat([keep_score.new_zeros(keep_score.shape[0], p), keep_score], dim=1)  # protected: kept anyway
        dest = model.match("topk_select", scores, keep, p)
        n_out = p + keep
        return torch.ops.deploytk.token_aggregate(x, torch.ones_like(size), dest, n_out, False), aggregate_size(size, dest, n_out)
