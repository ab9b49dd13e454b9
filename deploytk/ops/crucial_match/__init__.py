"""``deploytk.CrucialMatch``: crucial-token merging (the multi-scale paper's token mergence).

CrucialMatch(metric [B, N, D], scores [B, N]; keep, protected, tokens) -> dest [B, N]: the
kept ("crucial") tokens as in TopKSelect; every other token goes to the slot of its most
similar crucial token (cosine on metric).
"""

from __future__ import annotations

import torch

from deploytk.ops.checks import check_select_args
from deploytk.ops.crucial_match.onnx_function import CrucialMatch
from deploytk.ops.crucial_match.reference import crucial_match as reference
from deploytk.ops.flop_rules import sizes
from deploytk.ops.spec import INT64, OpSpec, SelftestPlan, floats
from deploytk.ops.ties import ties_when_perturbed


@torch.library.custom_op("deploytk::crucial_match", mutates_args=())
def crucial_match(metric: torch.Tensor, scores: torch.Tensor, keep: int, protected: int) -> torch.Tensor:
    check_select_args("crucial_match", scores, keep, protected, metric)
    return reference(metric, scores, keep, protected)


@crucial_match.register_fake
def _crucial_match_fake(metric, scores, keep, protected):
    return scores.new_empty(scores.shape, dtype=torch.int64)


def translate(metric, scores, keep: int, protected: int):
    return CrucialMatch(metric, scores, keep=keep, protected=protected, tokens=int(scores.shape[1]))


def crucial_flops(inputs, outputs) -> int:
    """Token-to-token cosine similarity [B, N, D] @ [B, D, N]."""
    b, n, d = sizes(inputs[0])
    return b * n * n * d


def _selftest_calls(draw: dict) -> list:
    return [([draw["metric"], draw["scores"], draw["keep"], draw["protected"]], {**draw["shape"], "keep": draw["keep"]})]


SPEC = OpSpec(
    name="CrucialMatch",
    torch_op=crucial_match,
    onnx_function=CrucialMatch,
    translation=translate,
    reference=reference,
    inputs=(floats("B N D"), floats("B N")),
    output=INT64,
    output_shape=lambda shapes, attrs: list(shapes[0][:2]),
    flops=crucial_flops,
    kernel="deploytk.ops.crucial_match.kernel",
    selftest=SelftestPlan("selection", _selftest_calls, ties_when_perturbed(0)),
    matching=True,
)
