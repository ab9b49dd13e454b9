"""``deploytk::proportional_attention`` / ONNX ``deploytk.ProportionalAttention``.

softmax((Q * scale) K^T + log(size)) V, with log(size) broadcast along the key axis, so a
merged token of size s counts as s tokens (ToMe's proportional attention). The scale is
applied to Q before the first matmul, the form TensorRT's fused attention requires.

Inputs: q, k, v [B, H, N, D], size [B, N, 1]. Attribute: scale. Output: [B, H, N, D].
"""

from __future__ import annotations

import torch
from onnxscript import FLOAT, script

from deploytk.errors import DeploytkError
from deploytk.ops._onnx_common import deploytk_opset, op


def check_attention_args(q, k, v, size) -> None:
    if q.dim() != 4 or k.shape != q.shape or v.shape[:3] != q.shape[:3] or v.dim() != 4:
        raise DeploytkError(
            "proportional_attention expects q, k [B, H, N, D] of equal shape and v [B, H, N, Dv]; got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}."
        )
    if size.dim() != 3 or size.shape[0] != q.shape[0] or size.shape[1] != q.shape[2] or size.shape[2] != 1:
        raise DeploytkError(f"proportional_attention expects size [B, N, 1] = [{q.shape[0]}, {q.shape[2]}, 1]; got {tuple(size.shape)}.")


def attention_reference(q, k, v, size, scale: float) -> torch.Tensor:
    """The matmuls in q's dtype, the logits, log(size) and softmax in fp32."""
    logits = ((q * scale) @ k.transpose(-2, -1)).float() + size.float().log()[:, None, None, :, 0]
    return logits.softmax(dim=-1).to(v.dtype) @ v


@torch.library.custom_op("deploytk::proportional_attention", mutates_args=())
def proportional_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, size: torch.Tensor, scale: float) -> torch.Tensor:
    check_attention_args(q, k, v, size)
    return attention_reference(q, k, v, size, scale)


@proportional_attention.register_fake
def _(q, k, v, size, scale):
    return q.new_empty(*q.shape[:3], v.shape[3])


@script(deploytk_opset, default_opset=op)
def ProportionalAttention(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    size: FLOAT,
    scale: float,
    plugin_namespace: str = "deploytk",
    plugin_version: str = "1",
) -> FLOAT:
    """Attention with an additive log(size) bias on the key axis, in standard ONNX ops.

    The matmuls run in q's type; logits, bias and softmax in fp32 (both casts are no-ops in
    an fp32 graph).
    """
    qs = op.Mul(q, op.CastLike(op.Constant(value_float=scale), q))
    logits = op.Cast(op.MatMul(qs, op.Transpose(k, perm=[0, 1, 3, 2])), to=1)
    bias = op.Reshape(op.Log(op.Cast(size, to=1)), op.Constant(value_ints=[0, 1, 1, -1]))  # [B, 1, 1, N] on the key axis
    return op.MatMul(op.CastLike(op.Softmax(op.Add(logits, bias), axis=-1), v), v)
