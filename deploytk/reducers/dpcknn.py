"""``dpcknn``: DPC-KNN token clustering ("Which Tokens to Use?", Haurum et al., ICCVW 2023; after TCFormer).

As the study's ``DPCKNNVisionTransformer``: before a reducing block, the patch tokens'
pairwise distances (``torch.cdist`` / sqrt(C)) give each token a density from its
``neighbors`` nearest tokens and a peak distance to the nearest denser token; the tokens of
highest density x peak distance are the cluster centres, every token joins its nearest
centre, and each cluster becomes the weighted mean of its tokens. ``deploytk.DPCKNNAssign``
makes the choice and ``TokenAggregate`` averages. With ``equal_weight`` (the study's
``--equal_weight``, training-free) every token weighs 1; without it, as the study trains it by
default, a learned ``Linear(C, 1)`` per reducing block scores each token and the weight is
exp(score): checkpoint keys ``cluster_layers.{s}.score.weight|bias``.
"""

from __future__ import annotations

import torch
from pydantic import Field, StrictBool, StrictInt
from torch import nn

from deploytk.merging.clustering import ClusterOptions, ClusterReduction
from deploytk.merging.distances import pairwise_distances
from deploytk.merging.merged_vit import aggregate_size
from deploytk.merging.reduction import register_method


class DPCKNNOptions(ClusterOptions):
    neighbors: StrictInt = Field(
        5, ge=1, le=64, description="nearest neighbours for the local density (the study's --k_neighbors, default 5)"
    )
    equal_weight: StrictBool = Field(
        True,
        description="every token weighs 1 (training-free); false: learned weights exp(score), from the checkpoint's cluster_layers.*",
    )


class TokenScore(nn.Module):
    """One reducing block's token weight exp(score(x)); parameter names as the official ``CTM`` module."""

    def __init__(self, dim: int):
        super().__init__()
        self.score = nn.Linear(dim, 1)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return self.score(patches).exp()


@register_method
class DPCKNN(ClusterReduction):
    name = "dpcknn"
    kind = "clustering"
    summary = "DPC-KNN (Which Tokens to Use?): density-peak clustering of the patches, each cluster averaged"
    Options = DPCKNNOptions
    ops = ("DPCKNNAssign", "TokenAggregate")
    checkpoint_prefix = "cluster_layers"
    learned_when = "equal_weight: false"

    def __init__(self, family, r_per_layer: list[int], options: DPCKNNOptions):
        super().__init__(family, r_per_layer, options)
        self.stage = {i: s for s, i in enumerate(self.layers)}
        if not options.equal_weight:
            self.cluster_layers = nn.ModuleList(TokenScore(family.embed_dim) for _ in self.layers)

    def flop_blocks(self) -> dict[str, int]:
        return {} if self.options.equal_weight else {f"cluster_layers.{s}": i for i, s in self.stage.items()}

    @staticmethod
    def _learned_mean(patches, weight, dest, clusters: int):
        """Each cluster's weighted mean, weights w / (sum of the cluster's w + 1e-6) as the official
        ``merge_tokens``: the 1e-6 matters where a cluster's learned weights exp(score) are all small."""
        total = torch.ops.deploytk.token_aggregate(weight, torch.ones_like(weight), dest, clusters, False)
        normed = weight / (torch.gather(total, 1, dest.unsqueeze(-1)) + 1e-6)
        return torch.ops.deploytk.token_aggregate(patches, normed, dest, clusters, False)

    def block(self, model, i, blk, x, size):
        clusters = self.clusters[i]
        if clusters is not None:
            p = self.protected
            patches = x[:, p:]
            dist = pairwise_distances(patches) / patches.shape[-1] ** 0.5
            dest = model.match("dpcknn_assign", dist, clusters, min(int(self.options.neighbors), patches.shape[1]))
            if self.options.equal_weight:
                merged = torch.ops.deploytk.token_aggregate(patches, torch.ones_like(size[:, p:]), dest, clusters, True)
            else:
                merged = self._learned_mean(patches, self.cluster_layers[self.stage[i]](patches.float()), dest, clusters)
            x = torch.cat([x[:, :p], merged], dim=1)
            size = torch.cat([size[:, :p], aggregate_size(size[:, p:], dest, clusters)], dim=1)
        return model.standard_block(i, blk, x, size)
