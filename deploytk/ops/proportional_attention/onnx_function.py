"""ONNX function body of ``deploytk.ProportionalAttention`` (standard ops only)."""

from onnxscript import FLOAT, script

from deploytk.ops.onnx_common import deploytk_opset, op


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
