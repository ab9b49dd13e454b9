"""``patchmerger``: PatchMerger (Renggli et al., 2022) as "Which Tokens to Use?" trains it (learned).

Before a reducing block, K learned queries attend over the LayerNorm-ed patch tokens (a
softmax over the patches per query, unscaled as the study's default) and each output token
is its query's weighted average of the normalised patches. All standard ops: nothing
discrete, nothing to plug in. Checkpoint keys (the study's ``PatchMergerVisionTransformer``):
``cluster_layers.{s}.norm.weight|bias`` and ``cluster_layers.{s}.queries`` [K_s, C].
"""

from __future__ import annotations

import torch
from torch import nn

from deploytk.merging.learned import LearnedMerge
from deploytk.merging.reduction import register_method


class PatchMergerLayer(nn.Module):
    """K queries -> K tokens; parameter names as the official ``PatchMerger`` module."""

    def __init__(self, dim: int, tokens_out: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)  # torch's default eps 1e-5, as the official module
        self.queries = nn.Parameter(torch.randn(tokens_out, dim) / dim**0.5)

    def mixing(self, patches: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [B, K, N], the features they mix [B, N, C]): the output tokens are weights @ features."""
        normed = self.norm(patches)
        return (self.queries @ normed.transpose(-1, -2)).softmax(dim=-1), normed

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        weights, normed = self.mixing(patches)
        return weights @ normed


@register_method
class PatchMerger(LearnedMerge):
    name = "patchmerger"
    summary = "PatchMerger (Which Tokens to Use?): learned queries attend over the patches, one new token each"

    def make_layer(self, dim, tokens_out):
        return PatchMergerLayer(dim, tokens_out)
