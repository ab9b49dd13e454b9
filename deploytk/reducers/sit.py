"""``sit``: SiT's token slimming module (Zong et al., 2022) as "Which Tokens to Use?" trains it (learned).

Before a reducing block, an MLP (LayerNorm, Linear C -> C/2, GELU, Linear -> K) gives every
patch K logits; a softmax over the patches (times a learned temperature ``scale``) makes K
weightings, and each output token is its weighting's sum of the raw patches. All standard
ops. Checkpoint keys (the study's ``SelfSlimmedVisionTransformer``):
``cluster_layers.{s}.weight.0`` (LayerNorm), ``.weight.1`` / ``.weight.3`` (Linear) and
``cluster_layers.{s}.scale`` [1, 1, 1].
"""

from __future__ import annotations

import torch
from torch import nn

from deploytk.merging.learned import LearnedMerge
from deploytk.merging.reduction import register_method


class TokenSlimmingLayer(nn.Module):
    """Patches -> K slimmed tokens; parameter names as the official ``TokenSlimmingModule``."""

    def __init__(self, dim: int, tokens_out: int, hidden_ratio: float = 0.5):
        super().__init__()
        hidden = int(dim * hidden_ratio)
        self.weight = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, tokens_out))
        self.scale = nn.Parameter(torch.ones(1, 1, 1))

    def mixing(self, patches: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [B, K, N], the features they mix [B, N, C]): the output tokens are weights @ features."""
        weights = (self.weight(patches) * self.scale).softmax(dim=1)  # [B, N, K], over the patches
        return weights.transpose(1, 2), patches

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        weights, patches = self.mixing(patches)
        return weights @ patches


@register_method
class SiT(LearnedMerge):
    name = "sit"
    summary = "SiT token slimming (Which Tokens to Use?): an MLP weights the patches into K new tokens"

    def make_layer(self, dim, tokens_out):
        return TokenSlimmingLayer(dim, tokens_out)
