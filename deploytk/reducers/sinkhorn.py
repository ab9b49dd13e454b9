"""``sinkhorn``: Sinkhorn clustering (Haurum et al., MSHViT) as "Which Tokens to Use?" trains it (learned).

Before a reducing block, the patch tokens and K learned centres are scaled to unit length;
their cosine similarities [K, N] divided by ``eps`` go through ``iterations`` rounds of
log-space Sinkhorn normalisation towards uniform marginals 1 / (K + N), and each output token
is the transport-weighted sum of the unit-length patches (scaled by K + N, as the study's
code does). All standard ops (``logsumexp`` rounds unrolled). Checkpoint keys (the study's
``SinkhornVisionTransformer``): ``cluster_layers.{s}.v`` [K_s, C]. The official module
renormalises ``v`` in place at each forward; deploytk normalises a copy, the same numbers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import Field, StrictFloat, StrictInt
from torch import nn

from deploytk.merging.clustering import ClusterOptions
from deploytk.merging.learned import LearnedMerge
from deploytk.merging.reduction import register_method


class SinkhornOptions(ClusterOptions):
    eps: StrictFloat | StrictInt = Field(1.0, gt=0, description="entropic regularisation (the study's --sinkhorn_eps, default 1.0)")
    iterations: StrictInt = Field(3, ge=0, le=100, description="Sinkhorn rounds (the study's --cluster_iters, default 3)")


def log_sinkhorn(scores: torch.Tensor, eps: float, iterations: int) -> torch.Tensor:
    """Transport weights [B, K, N] from scores [B, K, N]: uniform marginals 1/(K+N), times K+N."""
    k, n = scores.shape[1], scores.shape[2]
    log_marginal = -math.log(k + n)
    z = scores / eps
    u = z.new_zeros(z.shape[0], k)
    v = z.new_zeros(z.shape[0], n)
    for _ in range(iterations):
        u = log_marginal - torch.logsumexp(z + v.unsqueeze(1), dim=2)
        v = log_marginal - torch.logsumexp(z + u.unsqueeze(2), dim=1)
    return (z + u.unsqueeze(2) + v.unsqueeze(1) - log_marginal).exp()


class SinkhornLayer(nn.Module):
    """K centres -> K tokens; parameter name as the official ``Sinkhorn`` module."""

    def __init__(self, dim: int, tokens_out: int, eps: float, iterations: int):
        super().__init__()
        self.v = nn.Parameter(torch.randn(tokens_out, dim))
        self.eps, self.iterations = eps, iterations

    def mixing(self, patches: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [B, K, N], the features they mix [B, N, C]): the output tokens are weights @ features."""
        unit = F.normalize(patches, p=2, dim=-1)
        centres = F.normalize(self.v, p=2, dim=-1)
        return log_sinkhorn(centres @ unit.transpose(1, 2), self.eps, self.iterations), unit

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        weights, unit = self.mixing(patches)
        return weights @ unit


@register_method
class Sinkhorn(LearnedMerge):
    name = "sinkhorn"
    summary = "Sinkhorn clustering (Which Tokens to Use?): optimal transport of the patches onto K learned centres"
    Options = SinkhornOptions

    def make_layer(self, dim, tokens_out):
        return SinkhornLayer(dim, tokens_out, float(self.options.eps), int(self.options.iterations))
