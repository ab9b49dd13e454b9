"""The planning and checkpoint layout shared by the learned reducers of "Which Tokens to Use?".

DynamicViT, PatchMerger, SiT and Sinkhorn each insert one small trained module before every
block of ``merge.options.layers`` (the study's blocks 4, 7 and 10) that turns the patch tokens
into int(patches * keep_rate^(s + 1)) tokens at the s-th of them, the clustering methods' rule.
The modules live in a ``ModuleList`` named as in the official model class
(``cluster_layers`` / ``score_predictor``), with the official submodule names, so a checkpoint
saved from that class loads key for key (``deploytk.models`` splits it). They compute in fp32
whatever the export precision: they are small, and DynamicViT's scores make a discrete choice.
"""

from __future__ import annotations

import torch
from torch import nn

from deploytk.merging.clustering import ClusterReduction


class LearnedReduction(ClusterReduction):
    """A ``ClusterReduction`` whose reducing blocks each own a trained layer (``make_layer``)."""

    learned = True
    tune_knob = None  # the token counts are trained into the layers (DynamicViT overrides: its keep rate is free)
    reduces_at_every_layer = True
    checkpoint_prefix = "cluster_layers"

    def __init__(self, family, r_per_layer: list[int], options):
        super().__init__(family, r_per_layer, options)
        self.stage = {i: s for s, i in enumerate(self.layers)}
        counts = [self.clusters[i] for i in self.layers]
        setattr(self, self.checkpoint_prefix, nn.ModuleList(self.make_layer(family.embed_dim, c) for c in counts))

    def make_layer(self, dim: int, tokens_out: int) -> nn.Module:
        """The trained module of one reducing block (official class and parameter names)."""
        raise NotImplementedError

    def layer(self, i: int) -> nn.Module:
        return getattr(self, self.checkpoint_prefix)[self.stage[i]]

    def flop_blocks(self) -> dict[str, int]:
        return {f"{self.checkpoint_prefix}.{s}": i for i, s in self.stage.items()}

    def block(self, model, i, blk, x, size):
        if i in self.stage:
            x, size = self.reduce_patches(model, i, x, size)
        return model.standard_block(i, blk, x, size)

    def reduce_patches(self, model, i: int, x, size):
        """Before block ``i``: the patch tokens -> ``self.clusters[i]`` tokens. Returns (x, size)."""
        raise NotImplementedError


class LearnedMerge(LearnedReduction):
    """A soft merge: the layer maps the patches [B, N, C] to [B, K, C] new tokens.

    Each output token is a learned mixture, not a sum of tokens, so its size is 1 (the study's
    models run plain attention; with every size 1, proportional attention is plain attention).
    """

    kind = "learned merging"
    soft_assignment = True

    def reduce_patches(self, model, i, x, size):
        p = self.protected
        merged = self.layer(i)(x[:, p:].float()).to(x.dtype)
        ones = size.new_ones(size.shape[0], merged.shape[1], 1)
        return torch.cat([x[:, :p], merged], dim=1), torch.cat([size[:, :p], ones], dim=1)
