"""``kmedoids``: K-Medoids token clustering ("Which Tokens to Use?", Haurum et al., ICCVW 2023).

As the study's ``KMedoidsVisionTransformer`` (its default, token-weighted form): before a
reducing block, the patch tokens are clustered by Euclidean distance (``torch.cdist``'s
arithmetic) with the attention each token received in the previous block (summed over heads
and queries) as its weight, ``iterations`` rounds; the medoids themselves, in cluster order,
are the new tokens (no averaging, no size tracking). ``deploytk.KMedoidsSelect`` makes the
choice and ``TokenAggregate`` gathers the medoids.
"""

from __future__ import annotations

import torch
from pydantic import Field, StrictInt

from deploytk.errors import DeploytkError
from deploytk.merging.clustering import ClusterOptions, ClusterReduction
from deploytk.merging.distances import pairwise_distances
from deploytk.merging.merged_vit import aggregate_size
from deploytk.merging.reduction import register_method


class KMedoidsOptions(ClusterOptions):
    iterations: StrictInt = Field(3, ge=0, description="assignment/update rounds (the study's --cluster_iters, default 3)")


@register_method
class KMedoids(ClusterReduction):
    name = "kmedoids"
    kind = "clustering"
    summary = "K-Medoids (Which Tokens to Use?): cluster the patches, weighted by received attention; keep the medoids"
    Options = KMedoidsOptions
    ops = ("KMedoidsSelect", "TokenAggregate")

    def __init__(self, family, r_per_layer: list[int], options: KMedoidsOptions):
        super().__init__(family, r_per_layer, options)
        if self.clusters and self.clusters[0] is not None:
            raise DeploytkError(
                "method kmedoids weights the tokens by the previous block's attention, so it cannot cluster before block 0; "
                "remove 0 from `merge.options.layers`."
            )

    def block(self, model, i, blk, x, size):
        # clustering "before block i + 1" is done at the end of block i, where its attention map is at hand
        clusters = self.clusters[i + 1] if i + 1 < self.depth else None
        if clusters is None:
            return model.standard_block(i, blk, x, size)
        x, probs, _ = model.block_with_attention_map(blk, x, size)
        received = probs.sum(dim=1).sum(dim=1)  # per token: over heads, then queries (the study's order)
        return self._cluster(model, x, size, received, clusters)

    def tokens_after(self, blocks):
        """The schedule books a clustering at the block it comes before; it runs at the end of the block before that."""
        return self.schedule.tokens_out_of(blocks + 1) if 0 < blocks < self.depth else super().tokens_after(blocks)

    def _cluster(self, model, x, size, received, clusters: int):
        p = self.protected
        patches = x[:, p:]
        dest = model.match("kmedoids_select", pairwise_distances(patches), received[:, p:], clusters, int(self.options.iterations))
        medoids = torch.ops.deploytk.token_aggregate(patches, torch.ones_like(size[:, p:]), dest, clusters, False)
        return torch.cat([x[:, :p], medoids], dim=1), torch.cat([size[:, :p], aggregate_size(size[:, p:], dest, clusters)], dim=1)
