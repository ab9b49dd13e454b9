"""The planning shared by the keep-rate methods (Top-K, EViT, crucial-token merging, ...).

At each block of ``merge.options.layers`` they keep ``keep_rate`` of the non-protected tokens
(EViT's rule: ceil(keep_rate * candidates)) and reduce the rest; ``merge.r`` is not used.
A block reduces only when that leaves something to reduce.
"""

from __future__ import annotations

import math
from typing import ClassVar

from pydantic import Field, StrictFloat, StrictInt

from deploytk.errors import DeploytkError
from deploytk.merging.reduction import MethodOptions, Reduction, check_layers
from deploytk.merging.schedule import TokenSchedule


class KeepRateOptions(MethodOptions):
    layers: list[StrictInt] = Field([3, 6, 9], description="blocks that reduce (0-based)")
    keep_rate: StrictFloat | StrictInt = Field(
        0.7, gt=0, le=1, description="fraction of non-protected tokens kept at each of those blocks, in (0, 1]"
    )


def keep_count(tokens: int, protected: int, keep_rate: float) -> int:
    """EViT's rule: ceil(keep_rate * candidates), candidates = tokens - protected."""
    return math.ceil(keep_rate * (tokens - protected))


class KeepRateReduction(Reduction):
    """Plans ``self.keep[i]`` (None where block i does not reduce) and the schedule from the keep rate."""

    uses_r = False
    tune_knob = "keep_rate"
    Options = KeepRateOptions
    #: tokens a reducing block adds besides the kept ones (EViT: the fused token)
    extra_tokens: ClassVar[int] = 0
    #: the method ranks tokens by the class token's attention (so the model needs a class token)
    ranks_by_class_attention: ClassVar[bool] = True

    def __init__(self, family, r_per_layer: list[int], options: KeepRateOptions):
        super().__init__(family, r_per_layer, options)
        if self.ranks_by_class_attention and not family.has_class_token:
            raise DeploytkError(f"method {self.name} ranks tokens by the class token's attention, but this model has no class token.")
        self.layers = check_layers(options.layers, self.depth, self.name)
        self.keep: list[int | None] = []
        tokens, removed, t = [], [], self.num_tokens
        for i in range(self.depth):
            tokens.append(t)
            keep = keep_count(t, self.protected, float(options.keep_rate))
            active = i in self.layers and 1 <= keep < t - self.protected - self.extra_tokens
            self.keep.append(keep if active else None)
            out = self.protected + keep + self.extra_tokens if active else t
            removed.append(t - out)
            t = out
        self.schedule = TokenSchedule(removed, removed, tokens, self.protected)

    def wants_cls_attention(self, i: int) -> bool:
        return self.ranks_by_class_attention and self.keep[i] is not None
