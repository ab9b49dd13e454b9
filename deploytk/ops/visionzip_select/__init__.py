"""``deploytk.VisionZipSelect``: VisionZip's dominant and contextual tokens (``reference`` says what it computes).

VisionZipSelect(scores [B, N], metric [B, N, D]; dominant, contextual, protected, tokens) -> dest [B, N]: the
protected and ``dominant`` best-scored tokens keep their slots in order; ``contextual`` targets, evenly spaced among
the remaining tokens, take the next slots; every other remaining token goes to its most similar target's slot. The
contextual token itself (its target plus the mean of the tokens that joined it) is ``TokenAggregate`` with weights
the method derives from ``dest``. Dominant and contextual choice are one op: a flip in either moves patches between
output tokens, and the validator diagnoses it at this op.
"""

from __future__ import annotations

import torch

from deploytk.errors import DeploytkError
from deploytk.ops.checks import check_select_args
from deploytk.ops.flop_rules import sizes
from deploytk.ops.spec import INT64, OpSpec, SelftestPlan, floats
from deploytk.ops.ties import ties_when_perturbed
from deploytk.ops.visionzip_select.onnx_function import VisionZipSelect
from deploytk.ops.visionzip_select.reference import visionzip_select as reference


def check_visionzip_args(scores, metric, dominant: int, contextual: int, protected: int) -> None:
    """scores [B, N], metric [B, N, D]; dominant in [1, N - protected - 1]; contextual in [1, the tokens left]."""
    check_select_args("visionzip_select", scores, dominant, protected, metric)
    remaining = scores.shape[1] - protected - dominant
    if not 1 <= contextual <= remaining:
        raise DeploytkError(
            f"visionzip_select: contextual={contextual} is not allowed with {remaining} tokens left after the {protected} protected "
            f"and {dominant} dominant ones; contextual must be in [1, {remaining}]."
        )


@torch.library.custom_op("deploytk::visionzip_select", mutates_args=())
def visionzip_select(scores: torch.Tensor, metric: torch.Tensor, dominant: int, contextual: int, protected: int) -> torch.Tensor:
    check_visionzip_args(scores, metric, dominant, contextual, protected)
    return reference(scores, metric, dominant, contextual, protected)


@visionzip_select.register_fake
def _visionzip_select_fake(scores, metric, dominant, contextual, protected):
    return scores.new_empty(scores.shape, dtype=torch.int64)


def translate(scores, metric, dominant: int, contextual: int, protected: int):
    return VisionZipSelect(scores, metric, dominant=dominant, contextual=contextual, protected=protected, tokens=int(scores.shape[1]))


def visionzip_flops(inputs, outputs) -> int:
    """Token-to-token cosines [B, N, D] @ [B, D, N] (what the body computes; the official code takes the remaining rows
    against the targets only)."""
    b, n, d = sizes(inputs[1])
    return b * n * n * d


def _selftest_calls(draw: dict) -> list:
    """A few targets, and one target or every remaining token a target (by the draw's r: both occur)."""
    n, p, keep = draw["metric"].shape[1], draw["protected"], draw["keep"]
    remaining = n - p - keep
    edge = 1 if draw["r"] % 2 else remaining
    return [
        ([draw["scores"], draw["metric"], keep, contextual, p], {**draw["shape"], "dominant": keep, "contextual": contextual})
        for contextual in sorted({max(1, remaining // 3), edge})
    ]


SPEC = OpSpec(
    name="VisionZipSelect",
    torch_op=visionzip_select,
    onnx_function=VisionZipSelect,
    translation=translate,
    reference=reference,
    inputs=(floats("B N"), floats("B N D")),
    output=INT64,
    output_shape=lambda shapes, attrs: list(shapes[0][:2]),
    flops=visionzip_flops,
    kernel="deploytk.ops.visionzip_select.kernel",
    selftest=SelftestPlan("selection", _selftest_calls, ties_when_perturbed(1)),
    matching=True,
)
