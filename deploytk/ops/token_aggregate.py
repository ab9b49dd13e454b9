"""``deploytk::token_aggregate`` / ONNX ``deploytk.TokenAggregate``: apply an assignment.

out[b, j] = sum_{i: dest[b,i] = j} w[b,i] x[b,i]  (divided by sum w when ``normalize``).
Inputs: x [B, N, C], weight [B, N, 1], dest [B, N] int64 in [0, tokens_out] (tokens_out =
dropped). Attributes: tokens_out, normalize. Output [B, tokens_out, C]. The one merge op
shared by every method (ToMe, MCTF, ATM, EViT, Top-K, crucial-token merging).
"""

from __future__ import annotations

import torch
from onnxscript import FLOAT, INT64, script

from deploytk.errors import DeploytkError
from deploytk.merging.assign import token_aggregate as _reference
from deploytk.ops._onnx_common import deploytk_opset, op


def check_aggregate_args(x, weight, dest, tokens_out: int) -> None:
    if x.dim() != 3 or weight.dim() != 3 or dest.dim() != 2:
        raise DeploytkError(
            "token_aggregate expects x [B, N, C], weight [B, N, 1] and dest [B, N]; got "
            f"x {tuple(x.shape)}, weight {tuple(weight.shape)}, dest {tuple(dest.shape)}."
        )
    if weight.shape[:2] != x.shape[:2] or weight.shape[2] != 1 or dest.shape != x.shape[:2]:
        raise DeploytkError(
            "token_aggregate inputs disagree on batch/token count: "
            f"x {tuple(x.shape)}, weight {tuple(weight.shape)}, dest {tuple(dest.shape)}."
        )
    if dest.dtype != torch.int64:
        raise DeploytkError(f"token_aggregate: dest must be int64, got {dest.dtype}.")
    if not 1 <= tokens_out <= x.shape[1]:
        raise DeploytkError(f"token_aggregate: tokens_out={tokens_out} must be in [1, {x.shape[1]}].")


@torch.library.custom_op("deploytk::token_aggregate", mutates_args=())
def token_aggregate(x: torch.Tensor, weight: torch.Tensor, dest: torch.Tensor, tokens_out: int, normalize: bool) -> torch.Tensor:
    check_aggregate_args(x, weight, dest, tokens_out)
    if dest.numel() and (int(dest.min()) < 0 or int(dest.max()) > tokens_out):
        raise DeploytkError(f"token_aggregate: dest values must be in [0, {tokens_out}].")
    return _reference(x, weight, dest, tokens_out, normalize)


@token_aggregate.register_fake
def _(x, weight, dest, tokens_out, normalize):
    return x.new_empty(x.shape[0], tokens_out, x.shape[2])


@script(deploytk_opset, default_opset=op)
def TokenAggregate(
    x: FLOAT,
    weight: FLOAT,
    dest: INT64,
    tokens_out: int,
    normalize: int,
    plugin_namespace: str = "deploytk",
    plugin_version: str = "1",
) -> FLOAT:
    """A one-hot MatMul sums the [w*x, w] rows into tokens_out + 1 slots (the last is dropped).

    Not ScatterND(reduction="add"): ONNX Runtime's multi-threaded CPU kernel races on duplicate
    indices and returns wrong sums now and then (microsoft/onnxruntime#18048, #23396; measured
    here on 1.31.1).
    """
    one = op.Constant(value_ints=[1])
    zero = op.Constant(value_ints=[0])
    ax1 = op.Constant(value_ints=[1])
    ax2 = op.Constant(value_ints=[2])
    t_out = op.Reshape(op.Constant(value_int=tokens_out), one)
    wf = op.Cast(weight, to=1)  # sums in fp32 whatever x's type; the result is cast back to it
    xw = op.Concat(op.Mul(op.Cast(x, to=1), wf), wf, axis=-1)  # [B, N, C+1]
    c = op.Shape(x, start=2, end=3)
    assign = op.OneHot(dest, op.Add(t_out, one), op.Constant(value_floats=[0.0, 1.0]), axis=1)  # [B, T+1, N]
    acc = op.Slice(op.MatMul(assign, xw), zero, t_out, ax1)
    num = op.Slice(acc, zero, c, ax2)
    den = op.Slice(acc, c, op.Add(c, one), ax2)
    flag = op.Cast(op.Constant(value_int=normalize), to=9)
    return op.CastLike(op.Div(num, op.Where(flag, den, op.Constant(value_float=1.0))), x)


def translate_token_aggregate(x, weight, dest, tokens_out: int, normalize: bool):
    return TokenAggregate(x, weight, dest, tokens_out=tokens_out, normalize=int(normalize))
