"""The planning shared by the clustering merges of "Which Tokens to Use?" (K-Medoids, DPC-KNN).

Before each block of ``merge.options.layers`` the patch tokens (not the class, distillation
or register tokens) are clustered into int(patches * keep_rate^(s + 1)) clusters at the s-th
of those blocks (the study's rule: the count compounds and is relative to the first block's
patches) and each cluster becomes one token. A block reduces only if that is fewer tokens
than it gets.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, StrictFloat, StrictInt

from deploytk.errors import DeploytkError
from deploytk.merging.reduction import MethodOptions, Reduction, check_layers
from deploytk.merging.schedule import TokenSchedule


class ClusterOptions(MethodOptions):
    layers: list[StrictInt] = Field(
        [3, 6, 9], description="blocks before which the patches are reduced (0-based; the study's blocks 4, 7 and 10)"
    )
    keep_rate: StrictFloat | StrictInt = Field(
        0.7,
        gt=0,
        le=1,
        description="patch tokens left by the s-th of those blocks (clusters, kept or new tokens): "
        "int(patches * keep_rate^(s+1)), in (0, 1]",
    )


def cluster_counts(patches: int, keep_rate: float, stages: int) -> list[int]:
    """The study's cluster count per reducing block: int(patches * keep_rate^(s + 1))."""
    return [int(patches * keep_rate ** (s + 1)) for s in range(stages)]


class ClusterReduction(Reduction):
    """Plans ``self.clusters[i]`` (None where block i does not reduce) and the schedule."""

    uses_r = False
    tune_knob = "keep_rate"
    Options = ClusterOptions
    #: reduce at every block of ``layers`` even when the count is not below the tokens there
    #: (learned layers run wherever they were trained, as the study's models do at keep_rate 1)
    reduces_at_every_layer: ClassVar[bool] = False

    def __init__(self, family, r_per_layer: list[int], options: ClusterOptions):
        super().__init__(family, r_per_layer, options)
        self.layers = check_layers(options.layers, self.depth, self.name)
        patches = self.num_tokens - self.protected
        counts = dict(zip(self.layers, cluster_counts(patches, float(options.keep_rate), len(self.layers)), strict=True))
        if 0 in counts.values():
            raise DeploytkError(
                f"`merge.options.keep_rate` = {options.keep_rate} leaves int({patches} * keep_rate^s) = 0 clusters at block "
                f"{min(i for i, c in counts.items() if c == 0)}; use a larger keep rate or fewer layers."
            )
        self.clusters: list[int | None] = []
        tokens, removed, t = [], [], self.num_tokens
        for i in range(self.depth):
            tokens.append(t)
            active = i in counts and (counts[i] < t - self.protected or self.reduces_at_every_layer)
            self.clusters.append(counts[i] if active else None)
            removed.append(t - self.protected - counts[i] if active else 0)
            t -= removed[-1]
        self.schedule = TokenSchedule(removed, removed, tokens, self.protected)
