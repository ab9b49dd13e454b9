"""``atm``: adaptive token merging ("Lossless Token Merging Even Without Fine-Tuning"), in two forms.

Dynamic (PyTorch only, what ``deploytk calibrate`` runs): in layer l (1-based) a token pair
merges when its cosine similarity exceeds theta_l = max(alpha - (exp(beta*(l-1)) - 1),
theta_min); the batch's r is the mean over its images of the number of A tokens whose best
match clears the threshold (floored). From ``split_layer`` on, tokens are split by size
(small half = sources, large half = destinations: ``deploytk.SizeSplitMatch``) instead of by
alternation (``deploytk.ToMeMatch``), so large tokens do not merge with each other. In the last
layer only the class token is kept.

Static (exported): the same layers with a fixed per-layer r calibrated from data, because a
TensorRT/ONNX graph needs static token counts. The defaults alpha 0.9, beta 0.04,
theta_min 0.4 are deploytk's.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from pydantic import Field, StrictBool, StrictFloat, StrictInt

from deploytk.errors import DeploytkError
from deploytk.merging.merged_vit import aggregate_size
from deploytk.merging.reduction import MethodOptions, Reduction, register_method
from deploytk.merging.schedule import TokenSchedule, cap_schedule
from deploytk.methods.tome import tome_merge
from deploytk.ops.reference_common import protected_split, unit_rows
from deploytk.ops.size_split_match.reference import size_split_scores

Number = StrictFloat | StrictInt


class ATMOptions(MethodOptions):
    alpha: Number = Field(0.9, ge=-1, le=1, description="initial similarity threshold (layer 1)")
    beta: Number = Field(0.04, ge=0, description="threshold decay rate: theta_l = max(alpha - (exp(beta*(l-1)) - 1), theta_min)")
    theta_min: Number = Field(0.4, ge=-1, le=1, description="threshold floor")
    split_layer: StrictInt | None = Field(None, ge=0, description="first block with size-distinctive matching; default: depth - depth // 4")
    cls_only_last: StrictBool = Field(True, description="keep only the class token in the last block (token-pooled models)")
    calibration: dict[str, Any] | None = Field(None, description="written by `deploytk calibrate`: how merge.r was derived")


def thresholds(depth: int, alpha: float, beta: float, theta_min: float) -> list[float]:
    """theta_l for l = 1..depth."""
    return [max(alpha - (math.exp(beta * (layer - 1)) - 1.0), theta_min) for layer in range(1, depth + 1)]


def count_above(metric: torch.Tensor, size: torch.Tensor, protected: int, threshold: float, size_split: bool) -> torch.Tensor:
    """Per image: A tokens whose best match has similarity > threshold (the pairs ATM would merge)."""
    if size_split:
        scores, _, _ = size_split_scores(metric, size, protected)
    else:
        m = unit_rows(metric)
        scores = m[:, ::2] @ m[:, 1::2].transpose(1, 2)
        pa, pb = protected_split(protected)
        scores[:, :pa] = -math.inf
        scores[:, :, :pb] = -math.inf
    return (scores.amax(dim=-1) > threshold).sum(dim=1)


@register_method
class ATM(Reduction):
    """A static (calibrated) schedule: ToMe layers, then size-distinctive layers, CLS-only last."""

    name = "atm"
    summary = "ATM: layer-wise similarity thresholds and size-distinctive matching; r calibrated with `deploytk calibrate`"
    Options = ATMOptions
    ops = ("ToMeMatch", "SizeSplitMatch", "TokenAggregate")

    def __init__(self, vit, r_per_layer: list[int], options: ATMOptions):
        super().__init__(vit, r_per_layer, options)
        depth = self.depth
        self.split_layer = options.split_layer if options.split_layer is not None else depth - depth // 4
        if self.split_layer > depth:
            raise DeploytkError(f"`merge.options.split_layer` = {self.split_layer} is past the last block ({depth - 1}).")
        self.cls_only = options.cls_only_last and vit.global_pool == "token" and getattr(vit, "dist_token", None) is None
        if options.cls_only_last and not self.cls_only and vit.global_pool != "token":
            architecture = vit.default_cfg.get("architecture", "this model")
            raise DeploytkError(
                f"`merge.options.cls_only_last` needs a class-token-pooled model; {architecture} pools with {vit.global_pool!r}. "
                "Set cls_only_last: false."
            )
        #: the r ATM chooses per layer while ``calibration_pass`` runs (None otherwise)
        self.dynamic_r: list[int] | None = None
        self.thresholds = thresholds(depth, float(options.alpha), float(options.beta), float(options.theta_min))
        sched = cap_schedule(r_per_layer, self.num_tokens, self.protected)
        if self.cls_only:
            eff = sched.effective_r[:-1] + [sched.tokens[-1] - 1]
            sched = TokenSchedule(sched.requested_r[:-1] + [eff[-1]], eff, sched.tokens, sched.protected)
        self.schedule = sched

    def reduce(self, model, i, x, size, metric, cls_attn):
        if self.cls_only and i == self.depth - 1:
            if self.dynamic_r is not None:
                self.dynamic_r.append(0)  # not a merge: the schedule handles the CLS-only block itself
            return x[:, :1], size[:, :1]  # only the class token feeds the head
        size_split = i >= self.split_layer
        if self.dynamic_r is not None:  # calibration: ATM's batch-adaptive r
            above = count_above(metric, size, self.protected, self.thresholds[i], size_split)
            r = min(int(above.float().mean().floor()), (x.shape[1] - self.protected) // 2)
            self.dynamic_r.append(r)
        else:
            r = self.schedule.effective_r[i]
        if r <= 0:
            return x, size
        if not size_split:
            return tome_merge(model, x, size, metric, r)
        n_out = x.shape[1] - r
        dest = model.match("size_split_match", metric, size, r, self.protected)
        return torch.ops.deploytk.token_aggregate(x, size, dest, n_out, True), aggregate_size(size, dest, n_out)

    @torch.no_grad()
    def calibration_pass(self, model, images: torch.Tensor) -> list[int]:
        """Run ATM dynamically on one batch of ``model`` (whose reduction this is); return the r it chose per layer."""
        self.dynamic_r = []
        try:
            model(images)
            return self.dynamic_r
        finally:
            self.dynamic_r = None
