"""``heuristic``: the fixed l1 / l2 / l-inf pruning pattern of "Which Tokens to Use?" (Haurum et al., ICCVW 2023).

From each reduction block on, only the patches within an L1, L2 or L-inf radius of the image
centre are kept; the radius of stage s is the one whose patch count is closest to
int(num_patches * keep_rate^(s + 1)) (ties: the smaller radius), as the study's official code
(``models/heuristic.py``, keep-rate mode) chooses it. The pattern depends on the position only,
not on the image. The official code masks the other tokens out of attention from that block on;
no kept token and no class token then reads them, which equals removing them before the
block's attention, as done here with ``TopKSelect`` on a constant score (minus the distance). A video's patches
are one grid per tubelet group: each group keeps the same centre patches.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, StrictFloat, StrictInt

from deploytk.errors import DeploytkError
from deploytk.merging.merged_vit import aggregate_size
from deploytk.merging.reduction import MethodOptions, Reduction, check_layers, register_method
from deploytk.merging.schedule import TokenSchedule


class HeuristicOptions(MethodOptions):
    pattern: Literal["l1", "l2", "linf"] = Field("l1", description="distance from the image centre: l1, l2 or linf (the study's ell_p)")
    layers: list[StrictInt] = Field([3, 6, 9], description="blocks that prune, before their attention (0-based; the study's 4, 7, 10)")
    keep_rate: StrictFloat | StrictInt = Field(
        0.7, gt=0, le=1, description="stage s keeps about num_patches * keep_rate^(s+1) patches, in (0, 1]"
    )


def radial_distance(grid: int, pattern: str) -> torch.Tensor:
    """Each patch's distance from the centre of a grid x grid patch image (row-major), on the study's coordinates."""
    xs = torch.linspace(-grid // 2, grid // 2, steps=grid)
    x, y = torch.meshgrid(xs, xs, indexing="ij")
    if pattern == "l1":
        z = x.abs() + y.abs()
    elif pattern == "l2":
        z = torch.sqrt(x * x + y * y)
    else:
        z = torch.maximum(x.abs(), y.abs())
    return z.reshape(-1)


def stage_radii(distance: torch.Tensor, keep_rate: float, stages: int) -> list[float]:
    """The radius of each stage: the one whose count of patches within it is closest to int(num_patches * keep_rate^(s+1))."""
    radii = torch.unique(distance)  # ascending
    counts = [int((distance <= r).sum()) for r in radii]
    chosen = []
    for s in range(stages):
        target = int(distance.numel() * keep_rate ** (s + 1))
        best = min(range(len(counts)), key=lambda i: (abs(target - counts[i]), i))  # ties: the smaller radius
        chosen.append(float(radii[best]))
    return chosen


@register_method
class Heuristic(Reduction):
    name = "heuristic"
    kind = "pruning"
    summary = "l1/l2/l-inf heuristic (Which Tokens to Use?): keep the patches nearest the image centre, a fixed radial pattern"
    Options = HeuristicOptions
    uses_r = False
    tune_knob = "keep_rate"
    ops = ("TopKSelect", "TokenAggregate")

    def __init__(self, family, r_per_layer: list[int], options: HeuristicOptions):
        super().__init__(family, r_per_layer, options)
        rows, cols = family.grid_size
        if rows != cols:
            raise DeploytkError(
                f"method heuristic needs a square patch grid (its radial pattern is the study's); this model has {rows}x{cols}."
            )
        self.layers = check_layers(options.layers, self.depth, self.name)
        # a clip's patches are one grid per tubelet group (time first): the same pattern in each of them
        distance = radial_distance(rows, options.pattern).repeat(family.time_groups)
        radii = dict(zip(self.layers, stage_radii(distance, float(options.keep_rate), len(self.layers)), strict=True))
        patches = torch.arange(distance.numel())  # the original patch index of every remaining patch token
        self.keep: list[int | None] = []
        tokens, removed, t = [], [], self.num_tokens
        for i in range(self.depth):
            tokens.append(t)
            kept = distance[patches] <= radii[i] if i in radii else None
            if kept is None or bool(kept.all()):
                self.keep.append(None)
                removed.append(0)
                continue
            # constant scores of the tokens entering block i: the protected prefix (always kept), then minus each patch's distance
            scores = torch.cat([torch.zeros(self.protected), -distance[patches]])[None]
            self.register_buffer(f"scores_{i}", scores, persistent=False)
            self.keep.append(int(kept.sum()))
            patches = patches[kept]
            removed.append(t - self.protected - len(patches))
            t = self.protected + len(patches)
        self.schedule = TokenSchedule(removed, removed, tokens, self.protected)

    def block(self, model, i, blk, x, size):
        keep = self.keep[i]
        if keep is not None:  # prune before the block's attention, as the study's mask takes effect there
            scores = getattr(self, f"scores_{i}").expand(x.shape[0], -1)
            dest = model.match("topk_select", scores, keep, self.protected)
            n_out = self.protected + keep
            x = torch.ops.deploytk.token_aggregate(x, torch.ones_like(size), dest, n_out, False)
            size = aggregate_size(size, dest, n_out)
        return model.standard_block(i, blk, x, size)
