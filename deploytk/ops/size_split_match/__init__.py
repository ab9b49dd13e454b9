"""``deploytk.SizeSplitMatch``: ATM's size-distinctive matching.

Inputs: metric [B, N, D], size [B, N, 1]. Attributes: r, protected, tokens (the static N).
Output dest [B, N]: candidates sorted by size (ties by index), the smaller half matched into
the larger half, the r best-matched small tokens merge; the rest keep their original order.
Applied with ``TokenAggregate`` (size-weighted).
"""

from __future__ import annotations

import torch

from deploytk.ops.checks import check_match_args
from deploytk.ops.flop_rules import sizes
from deploytk.ops.size_split_match.onnx_function import SizeSplitMatch
from deploytk.ops.size_split_match.reference import size_split_match as reference
from deploytk.ops.spec import INT64, OpSpec, SelftestPlan, floats
from deploytk.ops.ties import ties_when_perturbed


@torch.library.custom_op("deploytk::size_split_match", mutates_args=())
def size_split_match(metric: torch.Tensor, size: torch.Tensor, r: int, protected: int) -> torch.Tensor:
    check_match_args("size_split_match", metric, {"size": size}, r, protected)
    return reference(metric, size, r, protected)


@size_split_match.register_fake
def _size_split_match_fake(metric, size, r, protected):
    return metric.new_empty(metric.shape[:2], dtype=torch.int64)


def translate(metric, size, r: int, protected: int):
    return SizeSplitMatch(metric, size, r=r, protected=protected, tokens=int(metric.shape[1]))


def size_split_flops(inputs, outputs) -> int:
    """The scores small half @ large half^T (the protected prefix excluded; protected is the 4th argument)."""
    b, n, d = sizes(inputs[0])
    m = n - int(inputs[3].toIValue())
    return b * ((m + 1) // 2) * (m // 2) * d


def _selftest_calls(draw: dict) -> list:
    return [([draw["metric"], draw["size"], draw["r"], draw["protected"]], {**draw["shape"], "r": draw["r"]})]


SPEC = OpSpec(
    name="SizeSplitMatch",
    torch_op=size_split_match,
    onnx_function=SizeSplitMatch,
    translation=translate,
    reference=reference,
    inputs=(floats("B N D"), floats("B N 1")),
    output=INT64,
    output_shape=lambda shapes, attrs: list(shapes[0][:2]),
    flops=size_split_flops,
    kernel="deploytk.ops.size_split_match.kernel",
    selftest=SelftestPlan("selection", _selftest_calls, ties_when_perturbed(0)),
    matching=True,
)
