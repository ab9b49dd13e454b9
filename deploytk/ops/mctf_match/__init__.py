"""``deploytk.MctfMatch``: MCTF's multi-criteria bipartite matching.

Inputs: metric [B, N, D] (the block's input tokens), received [B, N] (attention each token
receives, mean over heads and queries), size [B, N, 1]. Attributes: r (capped), protected,
tau_sim, tau_info, tau_size (0 switches a criterion off), bidirection, tokens (the static N).
Output: dest [B, N] int64, the output slot of each token (``reference`` documents the order);
the fusion is ``TokenAggregate``.
"""

from __future__ import annotations

import torch

from deploytk.ops.checks import check_match_args
from deploytk.ops.flop_rules import alternation_scores_flops
from deploytk.ops.mctf_match.onnx_function import MctfMatch
from deploytk.ops.mctf_match.reference import mctf_match as reference
from deploytk.ops.spec import INT64, OpSpec, SelftestPlan, floats
from deploytk.ops.ties import ties_when_perturbed


@torch.library.custom_op("deploytk::mctf_match", mutates_args=())
def mctf_match(
    metric: torch.Tensor,
    received: torch.Tensor,
    size: torch.Tensor,
    r: int,
    protected: int,
    tau_sim: float,
    tau_info: float,
    tau_size: float,
    bidirection: bool,
) -> torch.Tensor:
    check_match_args("mctf_match", metric, {"received": received, "size": size}, r, protected)
    return reference(metric, received, size, r, protected, tau_sim, tau_info, tau_size, bidirection)


@mctf_match.register_fake
def _mctf_match_fake(metric, received, size, r, protected, tau_sim, tau_info, tau_size, bidirection):
    return metric.new_empty(metric.shape[:2], dtype=torch.int64)


def translate(metric, received, size, r: int, protected: int, tau_sim: float, tau_info: float, tau_size: float, bidirection: bool):
    return MctfMatch(
        metric,
        received,
        size,
        r=r,
        protected=protected,
        tau_sim=float(tau_sim),
        tau_info=float(tau_info),
        tau_size=float(tau_size),
        bidirection=int(bidirection),
        tokens=int(metric.shape[1]),
    )


def _selftest_calls(draw: dict) -> list:
    taus = draw["taus"]
    args = [draw["metric"], draw["received"], draw["size"], draw["r"], draw["protected"], *taus]
    shape = {**draw["shape"], "r": draw["r"], "taus": list(taus)}
    return [([*args, bidirection], {**shape, "bidirection": bidirection}) for bidirection in (True, False)]


SPEC = OpSpec(
    name="MctfMatch",
    torch_op=mctf_match,
    onnx_function=MctfMatch,
    translation=translate,
    reference=reference,
    inputs=(floats("B N D"), floats("B N"), floats("B N 1")),
    output=INT64,
    output_shape=lambda shapes, attrs: list(shapes[0][:2]),
    flops=alternation_scores_flops,
    kernel="deploytk.ops.mctf_match.kernel",
    selftest=SelftestPlan("selection", _selftest_calls, ties_when_perturbed(0)),
    matching=True,
)
