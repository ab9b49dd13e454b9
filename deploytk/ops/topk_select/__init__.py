"""``deploytk.TopKSelect``: keep the protected tokens and the ``keep`` best-scored others.

TopKSelect(scores [B, N]; keep, protected, tokens) -> dest [B, N]: the protected tokens and
the ``keep`` best-scored others keep their slots in order; every other token goes to slot
protected + keep (dropped for Top-K, the fused token for EViT; the caller's
``TokenAggregate.tokens_out`` decides which).
"""

from __future__ import annotations

import torch

from deploytk.ops.checks import check_select_args
from deploytk.ops.flop_rules import no_flops
from deploytk.ops.spec import INT64, OpSpec, SelftestPlan, floats
from deploytk.ops.ties import ties_when_perturbed
from deploytk.ops.topk_select.onnx_function import TopKSelect
from deploytk.ops.topk_select.reference import topk_select as reference


@torch.library.custom_op("deploytk::topk_select", mutates_args=())
def topk_select(scores: torch.Tensor, keep: int, protected: int) -> torch.Tensor:
    check_select_args("topk_select", scores, keep, protected)
    return reference(scores, keep, protected)


@topk_select.register_fake
def _topk_select_fake(scores, keep, protected):
    return scores.new_empty(scores.shape, dtype=torch.int64)


def translate(scores, keep: int, protected: int):
    return TopKSelect(scores, keep=keep, protected=protected, tokens=int(scores.shape[1]))


def _selftest_calls(draw: dict) -> list:
    return [([draw["scores"], draw["keep"], draw["protected"]], {**draw["shape"], "keep": draw["keep"]})]


SPEC = OpSpec(
    name="TopKSelect",
    torch_op=topk_select,
    onnx_function=TopKSelect,
    translation=translate,
    reference=reference,
    inputs=(floats("B N"),),
    output=INT64,
    output_shape=lambda shapes, attrs: list(shapes[0][:2]),
    flops=no_flops,
    kernel="deploytk.ops.topk_select.kernel",
    selftest=SelftestPlan("selection", _selftest_calls, ties_when_perturbed(None)),  # no arithmetic: exact
    matching=True,
    drops_tokens=True,
    rest_slot=lambda args: int(args[1]) + int(args[2]),  # topk_select(scores, keep, protected): the slot after the kept
)
