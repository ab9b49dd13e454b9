"""``dpcknn``: DPC-KNN token clustering ("Which Tokens to Use?", Haurum et al., ICCVW 2023; after TCFormer).

As the study's ``DPCKNNVisionTransformer`` with ``--equal_weight`` (the training-free form):
before a reducing block, the patch tokens' pairwise distances (``torch.cdist`` / sqrt(C))
give each token a density from its ``neighbors`` nearest tokens and a peak distance to the
nearest denser token; the tokens of highest density x peak distance are the cluster centres,
every token joins its nearest centre, and each cluster becomes the mean of its tokens.
``deploytk.DPCKNNAssign`` makes the choice and ``TokenAggregate`` averages.
"""

from __future__ import annotations

import torch
from pydantic import Field, StrictInt

from deploytk.merging.clustering import ClusterOptions, ClusterReduction
from deploytk.merging.distances import pairwise_distances
from deploytk.merging.merged_vit import aggregate_size
from deploytk.merging.reduction import register_method


class DPCKNNOptions(ClusterOptions):
    neighbors: StrictInt = Field(
        5, ge=1, le=64, description="nearest neighbours for the local density (the study's --k_neighbors, default 5)"
    )


@register_method
class DPCKNN(ClusterReduction):
    name = "dpcknn"
    kind = "clustering"
    summary = "DPC-KNN (Which Tokens to Use?): density-peak clustering of the patches, each cluster averaged"
    Options = DPCKNNOptions
    ops = ("DPCKNNAssign", "TokenAggregate")

    def block(self, model, i, blk, x, size):
        clusters = self.clusters[i]
        if clusters is not None:
            p = self.protected
            patches = x[:, p:]
            dist = pairwise_distances(patches) / patches.shape[-1] ** 0.5
            dest = model.match("dpcknn_assign", dist, clusters, min(int(self.options.neighbors), patches.shape[1]))
            merged = torch.ops.deploytk.token_aggregate(patches, torch.ones_like(size[:, p:]), dest, clusters, True)
            x = torch.cat([x[:, :p], merged], dim=1)
            size = torch.cat([size[:, :p], aggregate_size(size[:, p:], dest, clusters)], dim=1)
        return model.standard_block(i, blk, x, size)
