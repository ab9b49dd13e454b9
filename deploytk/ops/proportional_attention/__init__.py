"""``deploytk.ProportionalAttention``: softmax((Q * scale) K^T + log(size)) V.

log(size) is broadcast along the key axis, so a merged token of size s counts as s tokens
(ToMe's proportional attention). The scale is applied to Q before the first matmul, the
form TensorRT's fused attention requires. Inputs: q, k, v [B, H, N, D], size [B, N, 1]
(fp32). Attribute: scale. Output: [B, H, N, D].
"""

from __future__ import annotations

import torch

from deploytk.errors import DeploytkError
from deploytk.ops.flop_rules import sizes
from deploytk.ops.proportional_attention.onnx_function import ProportionalAttention
from deploytk.ops.proportional_attention.reference import proportional_attention as reference
from deploytk.ops.spec import FLOAT, OpSpec, SelftestPlan, floats, fp32


def check_attention_args(q, k, v, size) -> None:
    if q.dim() != 4 or k.shape != q.shape or v.shape[:3] != q.shape[:3] or v.dim() != 4:
        raise DeploytkError(
            "proportional_attention expects q, k [B, H, N, D] of equal shape and v [B, H, N, Dv]; got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}."
        )
    if size.dim() != 3 or size.shape[0] != q.shape[0] or size.shape[1] != q.shape[2] or size.shape[2] != 1:
        raise DeploytkError(f"proportional_attention expects size [B, N, 1] = [{q.shape[0]}, {q.shape[2]}, 1]; got {tuple(size.shape)}.")


@torch.library.custom_op("deploytk::proportional_attention", mutates_args=())
def proportional_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, size: torch.Tensor, scale: float) -> torch.Tensor:
    check_attention_args(q, k, v, size)
    return reference(q, k, v, size, scale)


@proportional_attention.register_fake
def _proportional_attention_fake(q, k, v, size, scale):
    return q.new_empty(*q.shape[:3], v.shape[3])


def attention_flops(inputs, outputs) -> int:
    """q, k: [B, H, N, D]; v: [B, H, N, Dv] -> Q K^T (B*H*N*N*D) + A V (B*H*N*N*Dv), as fvcore counts the unfused matmuls."""
    b, h, n, d = sizes(inputs[0])
    dv = sizes(inputs[2])[-1]
    return b * h * n * n * (d + dv)


def _selftest_calls(draw: dict) -> list:
    return [([draw["q"], draw["k"], draw["v"], draw["size"], draw["scale"]], draw["shape"])]


SPEC = OpSpec(
    name="ProportionalAttention",
    torch_op=proportional_attention,
    onnx_function=ProportionalAttention,
    translation=ProportionalAttention,
    reference=reference,
    inputs=(floats("B H N D"), floats("B H N D"), floats("B H N D"), fp32("B N 1")),
    output=FLOAT,
    output_shape=lambda shapes, attrs: list(shapes[0]),
    flops=attention_flops,
    kernel="deploytk.ops.proportional_attention.kernel",
    selftest=SelftestPlan("attention", _selftest_calls),
)
