"""``deploytk.ATSSample``: adaptive token sampling (ATS, Fayyaz et al., ECCV 2022), training-free, static slots.

ATSSample(scores [B, M], size [B, M, 1], steps [S]) -> dest [B, M]: each of the S fixed CDF
steps picks a candidate token; the distinct picked tokens take slots 0.. in token order and
the rest go to slot S (dropped). A duplicate pick leaves an empty slot (no token, size 0),
which proportional attention (log 0 = -inf) and the size-weighted pool then ignore exactly,
so S static slots compute what ATS's data-dependent token count computes.
"""

from __future__ import annotations

import torch

from deploytk.errors import DeploytkError
from deploytk.ops.ats_sample.onnx_function import ATSSample
from deploytk.ops.ats_sample.reference import ats_near_tie, ats_steps
from deploytk.ops.ats_sample.reference import ats_sample as reference
from deploytk.ops.flop_rules import no_flops
from deploytk.ops.spec import INT64, OpSpec, SelftestPlan, floats, fp32
from deploytk.ops.ties import ties_when_perturbed


def check_ats_args(scores, size, steps) -> None:
    if scores.dim() != 2 or tuple(size.shape) != (*scores.shape, 1) or steps.dim() != 1:
        raise DeploytkError(
            "ats_sample expects scores [B, M], size [B, M, 1] and steps [S]; got "
            f"scores {tuple(scores.shape)}, size {tuple(size.shape)}, steps {tuple(steps.shape)}."
        )
    if not 1 <= steps.shape[0] <= scores.shape[1]:
        raise DeploytkError(f"ats_sample: {steps.shape[0]} steps for {scores.shape[1]} tokens; steps must number 1 to {scores.shape[1]}.")


@torch.library.custom_op("deploytk::ats_sample", mutates_args=())
def ats_sample(scores: torch.Tensor, size: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    check_ats_args(scores, size, steps)
    return reference(scores, size, steps)


@ats_sample.register_fake
def _ats_sample_fake(scores, size, steps):
    return scores.new_empty(scores.shape, dtype=torch.int64)


def translate(scores, size, steps):
    return ATSSample(scores, size, steps)


def _selftest_calls(draw: dict) -> list:
    m = draw["scores"].shape[1]
    calls = []
    for count in (2, max(2, m // 2), m):
        steps = ats_steps(count)
        calls.append(([draw["scores"], draw["size"], steps], {**draw["shape"], "steps": steps.numel()}))
    return calls


SPEC = OpSpec(
    name="ATSSample",
    torch_op=ats_sample,
    onnx_function=ATSSample,
    translation=translate,
    reference=reference,
    inputs=(floats("B M"), fp32("B M 1"), fp32("S")),
    output=INT64,
    output_shape=lambda shapes, attrs: list(shapes[0][:2]),
    flops=no_flops,
    kernel="deploytk.ops.ats_sample.kernel",
    selftest=SelftestPlan("sampling", _selftest_calls, ties_when_perturbed(0, ats_near_tie, unbatched=(2,))),
    matching=True,
    drops_tokens=True,
    dest_covers_patches_only=True,
    near_tie=ats_near_tie,
)
