"""``atm``: adaptive token merging ("Lossless Token Merging Even Without Fine-Tuning"), in two forms.

Dynamic (PyTorch only, what ``deploytk calibrate`` runs): in layer l (1-based) a token pair
merges when its cosine similarity exceeds theta_l = max(alpha - (exp(beta*(l-1)) - 1),
theta_min); the batch's r is the mean over its images of the number of A tokens whose best
match clears the threshold (floored). From ``split_layer`` on, tokens are split by size
(small half = sources, large half = destinations: ``deploytk.SizeSplitMatch``) instead of by
alternation (``deploytk.ToMeMatch``), so large tokens do not merge with each other. In the last
layer only the class token is kept.

Static (exported): the same layers with a fixed per-layer r calibrated from data, because a
TensorRT/ONNX graph needs static token counts.

alpha/beta/theta_min: the paper sweeps them per model without training (its Table A2, GFLOPs
and top-1 measured with pretrained weights on ImageNet-1k). ``preset: deit_t | deit_s | deit_b``
picks that table's point nearest ``gflops`` (default: ``DEFAULT_GFLOPS``, about two thirds of
the dense FLOPs); without a preset the settings default to DeiT-S's (0.99, 0.04, 0.86 at 3.04 GFLOPs). The paper's other settings are
deploytk's too: keys as the similarity metric, size-distinctive matching from about three
quarters of the depth, proportional attention, only the class token kept in the last block,
and r averaged over the batch (floored to an int; the paper does not say how it rounds).
"""

from __future__ import annotations

import math
from typing import Any, Literal, NamedTuple

import torch
from pydantic import Field, StrictBool, StrictFloat, StrictInt, model_validator

from deploytk.errors import DeploytkError
from deploytk.merging.merged_vit import aggregate_size
from deploytk.merging.reduction import MethodOptions, Reduction, register_method
from deploytk.merging.schedule import TokenSchedule, cap_schedule
from deploytk.ops.reference_common import protected_split, unit_rows
from deploytk.ops.size_split_match.reference import size_split_scores
from deploytk.reducers.tome import tome_merge

Number = StrictFloat | StrictInt


class OperatingPoint(NamedTuple):
    """One row of the ATM paper's Table A2 (no training): its settings and what it reports for them."""

    alpha: float
    beta: float
    theta_min: float
    gflops: float
    top1: float


def _points(*rows: tuple) -> tuple[OperatingPoint, ...]:
    return tuple(OperatingPoint(*row) for row in rows)


#: Table A2 of the ATM paper, DeiT without training: (alpha, beta, theta_min, GFLOPs, top-1 %). The GFLOPs and
#: accuracies are the paper's (pretrained weights, ImageNet-1k); with other weights or data they differ.
PRESETS: dict[str, tuple[OperatingPoint, ...]] = {
    "deit_t": _points(
        (0.98, 0.035, 0.93, 1.05, 72.19),
        (0.975, 0.025, 0.91, 0.98, 72.15),
        (0.995, 0.025, 0.895, 0.96, 72.14),
        (0.985, 0.025, 0.885, 0.93, 72.08),
        (1, 0.035, 0.88, 0.90, 72.04),
        (1, 0.03, 0.865, 0.88, 72.01),
        (1, 0.035, 0.86, 0.85, 71.93),
        (0.975, 0.03, 0.86, 0.83, 71.83),
        (0.995, 0.04, 0.855, 0.81, 71.74),
        (0.98, 0.035, 0.84, 0.78, 71.58),
        (0.985, 0.04, 0.83, 0.75, 71.33),
        (0.99, 0.045, 0.825, 0.72, 71.08),
        (0.995, 0.045, 0.815, 0.71, 70.94),
    ),
    "deit_s": _points(
        (0.995, 0.02, 0.91, 3.67, 79.86),
        (0.99, 0.02, 0.895, 3.53, 79.86),
        (0.995, 0.04, 0.895, 3.44, 79.84),
        (0.99, 0.02, 0.875, 3.38, 79.82),
        (0.99, 0.04, 0.88, 3.26, 79.80),
        (0.985, 0.045, 0.88, 3.23, 79.76),
        (1, 0.03, 0.855, 3.13, 79.74),
        (1, 0.04, 0.86, 3.07, 79.71),
        (0.99, 0.04, 0.86, 3.04, 79.65),
        (1, 0.05, 0.855, 2.96, 79.63),
        (0.995, 0.05, 0.845, 2.85, 79.53),
        (0.975, 0.04, 0.835, 2.79, 79.44),
        (0.97, 0.045, 0.83, 2.67, 79.29),
        (0.98, 0.05, 0.825, 2.62, 79.22),
        (0.96, 0.035, 0.81, 2.56, 79.08),
    ),
    "deit_b": _points(
        (0.995, 0.025, 0.92, 14.60, 81.84),
        (0.995, 0.015, 0.89, 14.26, 81.79),
        (1, 0.015, 0.8, 14.10, 81.77),
        (1, 0.025, 0.89, 13.89, 81.76),
        (1, 0.025, 0.865, 13.24, 81.68),
        (0.995, 0.025, 0.86, 12.99, 81.61),
        (0.99, 0.025, 0.845, 12.41, 81.51),
        (0.99, 0.03, 0.84, 11.95, 81.38),
        (0.98, 0.025, 0.8, 11.21, 81.05),
        (0.965, 0.025, 0.835, 11.05, 80.94),
        (0.965, 0.025, 0.82, 10.78, 80.79),
        (0.965, 0.025, 0.8, 10.49, 80.60),
        (0.945, 0.02, 0.81, 10.29, 80.45),
        (0.95, 0.025, 0.805, 9.98, 80.17),
    ),
}
#: the paper's dense GFLOPs per preset model (Table A2's first row of each)
DENSE_GFLOPS = {"deit_t": 1.25, "deit_s": 4.60, "deit_b": 17.57}
#: the embedding width of each preset's DeiT: a preset on another model is refused
PRESET_WIDTH = {"deit_t": 192, "deit_s": 384, "deit_b": 768}
#: the point a preset takes without ``gflops``: about two thirds of the dense FLOPs, losing at most 0.56 top-1
#: points in the paper (DeiT-T 72.14 -> 71.58, DeiT-S 79.81 -> 79.65, DeiT-B 81.79 -> 81.51)
DEFAULT_GFLOPS = {"deit_t": 0.78, "deit_s": 3.04, "deit_b": 12.41}


def preset_point(preset: str, gflops: float | None = None) -> OperatingPoint:
    """The table point nearest ``gflops`` (``DEFAULT_GFLOPS`` when None); a tie goes to the less aggressive point."""
    target = DEFAULT_GFLOPS[preset] if gflops is None else gflops
    return min(PRESETS[preset], key=lambda p: (abs(p.gflops - target), -p.gflops))


_DEFAULT = preset_point("deit_s")


class ATMOptions(MethodOptions):
    alpha: Number = Field(_DEFAULT.alpha, ge=-1, le=1, description="initial similarity threshold (layer 1)")
    beta: Number = Field(_DEFAULT.beta, ge=0, description="threshold decay rate: theta_l = max(alpha - (exp(beta*(l-1)) - 1), theta_min)")
    theta_min: Number = Field(_DEFAULT.theta_min, ge=-1, le=1, description="threshold floor")
    preset: Literal["deit_t", "deit_s", "deit_b"] | None = Field(
        None, description="the ATM paper's Table A2 settings for this DeiT (no training); sets alpha, beta, theta_min"
    )
    gflops: Number | None = Field(
        None, gt=0, description="with `preset`: the table point whose paper-reported GFLOPs is nearest (default 0.78 / 3.04 / 12.41)"
    )
    split_layer: StrictInt | None = Field(None, ge=0, description="first block with size-distinctive matching; default: depth - depth // 4")
    cls_only_last: StrictBool = Field(True, description="keep only the class token in the last block (token-pooled models)")
    calibration: dict[str, Any] | None = Field(None, description="written by `deploytk calibrate`: how merge.r was derived")

    @model_validator(mode="after")
    def _apply_preset(self):
        if self.preset is None:
            if self.gflops is not None:
                raise ValueError("`gflops` picks a point of a `preset`; set `preset: deit_t | deit_s | deit_b` too")
            return self
        point = preset_point(self.preset, self.gflops)
        for name in ("alpha", "beta", "theta_min"):
            if name in self.model_fields_set and getattr(self, name) != getattr(point, name):
                raise ValueError(
                    f"`{name}` = {getattr(self, name)} contradicts preset {self.preset} "
                    f"({point.alpha}, {point.beta}, {point.theta_min} at {point.gflops} GFLOPs); drop one of them"
                )
            setattr(self, name, getattr(point, name))
        return self


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
    truncates = True  # with cls_only_last: the last block keeps the class token alone
    kind = "merging"
    summary = "ATM: layer-wise similarity thresholds and size-distinctive matching; r calibrated with `deploytk calibrate`"
    Options = ATMOptions
    ops = ("ToMeMatch", "SizeSplitMatch", "TokenAggregate")
    tune_knob = "quantile"  # r is calibrated: tune searches the Table A2 points of a preset, else quantiles of one calibration
    calibrated = True
    calibration_statistic = (
        "per layer: the {q:g}-quantile (floored) over calibration batches of ATM's batch-adaptive r, where a batch's r is the "
        "floor of the mean over its images of the number of pairs whose cosine similarity exceeds theta_l"
    )

    def calibration_settings(self) -> dict:
        return {"thresholds": [round(t, 6) for t in self.thresholds], "split_layer": self.split_layer}

    @classmethod
    def tuning_points(cls, options: ATMOptions) -> list[tuple[str, dict, dict]]:
        """With ``preset``: every point of the paper's Table A2 for that DeiT."""
        if not options.preset:
            return []
        return [
            (
                f"{options.preset} {p.gflops:g}G point",
                {"preset": options.preset, "paper_gflops": p.gflops, "alpha": p.alpha, "beta": p.beta, "theta_min": p.theta_min},
                {"gflops": p.gflops, "calibration": None},
            )
            for p in PRESETS[options.preset]
        ]

    def __init__(self, family, r_per_layer: list[int], options: ATMOptions):
        super().__init__(family, r_per_layer, options)
        depth = self.depth
        self.split_layer = options.split_layer if options.split_layer is not None else depth - depth // 4
        if self.split_layer > depth:
            raise DeploytkError(f"`merge.options.split_layer` = {self.split_layer} is past the last block ({depth - 1}).")
        self.cls_only = options.cls_only_last and family.pool == "token" and not family.has_dist_token
        if options.cls_only_last and not self.cls_only and family.pool != "token":
            raise DeploytkError(
                f"`merge.options.cls_only_last` needs a class-token-pooled model; {family.architecture} pools with {family.pool!r}. "
                "Set cls_only_last: false."
            )
        if options.preset is not None and family.embed_dim != PRESET_WIDTH[options.preset]:
            fits = [name for name, width in PRESET_WIDTH.items() if width == family.embed_dim]
            instead = f"use preset {fits[0]}" if fits else "set alpha, beta and theta_min instead"
            raise DeploytkError(
                f"`merge.options.preset` = {options.preset} holds the ATM paper's settings for a DeiT of width "
                f"{PRESET_WIDTH[options.preset]}; {family.architecture} has width {family.embed_dim}: {instead}."
            )
        #: the r ATM chooses per layer while ``calibration_pass`` runs (None otherwise)
        self.dynamic_r: list[int] | None = None
        self.thresholds = thresholds(depth, float(options.alpha), float(options.beta), float(options.theta_min))
        sched = cap_schedule(r_per_layer, self.num_tokens, self.protected)
        if self.cls_only:
            eff = sched.effective_r[:-1] + [sched.tokens[-1] - 1]
            sched = TokenSchedule(sched.requested_r[:-1] + [eff[-1]], eff, sched.tokens, sched.protected)
        self.schedule = sched

    def no_patches_left_hint(self):
        if self.cls_only:
            return "Set `merge.options.cls_only_last: false`: ATM's last block keeps only the class token, for class-token pooling."
        return None

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
