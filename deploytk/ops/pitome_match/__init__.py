"""``deploytk.PiToMeMatch``: PiToMe's energy-ordered matching (``reference`` says what it computes and why).

PiToMeMatch(metric [B, N, D]; r, protected, margin, alpha, protect, tokens) -> dest [B, N]: every token's output
slot. The tokens are ordered by their energy (how many close neighbours they have); ``protect`` 0 matches the whole
order bipartitely as ToMe does, 1 merges only the 2r highest-energy tokens and protects the rest. The size-weighted
merge is ``TokenAggregate``, as for ToMe. Energy order and matching are one op: both are discrete choices on the
same cosines, and the validator diagnoses a flip in either at the op that made it.
"""

from __future__ import annotations

import torch

from deploytk.ops.checks import check_match_args
from deploytk.ops.flop_rules import sizes
from deploytk.ops.pitome_match.onnx_function import PiToMeMatch
from deploytk.ops.pitome_match.reference import pitome_dest as reference
from deploytk.ops.pitome_match.reference import pitome_near_tie
from deploytk.ops.spec import INT64, OpSpec, SelftestPlan, floats
from deploytk.ops.ties import ties_when_perturbed


@torch.library.custom_op("deploytk::pitome_match", mutates_args=())
def pitome_match(metric: torch.Tensor, r: int, protected: int, margin: float, alpha: float, protect: bool) -> torch.Tensor:
    check_match_args("pitome_match", metric, {}, r, protected)
    return reference(metric, r, protected, margin, alpha, protect)


@pitome_match.register_fake
def _pitome_match_fake(metric, r, protected, margin, alpha, protect):
    return metric.new_empty(metric.shape[:2], dtype=torch.int64)


def translate(metric, r: int, protected: int, margin: float, alpha: float, protect: bool):
    return PiToMeMatch(
        metric, r=r, protected=protected, margin=float(margin), alpha=float(alpha), protect=int(protect), tokens=int(metric.shape[1])
    )


def pitome_flops(inputs, outputs) -> int:
    """The cosines behind the energy, [B, N, D] @ [B, D, N] (the prefix rows included); the A x B scores are gathered from them."""
    b, n, d = sizes(inputs[0])
    return b * n * n * d


def _selftest_calls(draw: dict) -> list:
    """One call per draw (the kernel is the slowest in Triton's interpreter): an early block (high margin, every token
    matched) or, for an even protected count (fixed shapes have both), a late one (low margin, the rest protected)."""
    protect = draw["protected"] % 2 == 0
    margin = 0.25 if protect else 0.75
    return [([draw["metric"], draw["r"], draw["protected"], margin, 1.0, protect], {**draw["shape"], "margin": margin, "protect": protect})]


SPEC = OpSpec(
    name="PiToMeMatch",
    torch_op=pitome_match,
    onnx_function=PiToMeMatch,
    translation=translate,
    reference=reference,
    inputs=(floats("B N D"),),
    output=INT64,
    output_shape=lambda shapes, attrs: list(shapes[0][:2]),
    flops=pitome_flops,
    kernel="deploytk.ops.pitome_match.kernel",
    selftest=SelftestPlan("tome", _selftest_calls, ties_when_perturbed(0, pitome_near_tie)),
    matching=True,
    near_tie=pitome_near_tie,
)
