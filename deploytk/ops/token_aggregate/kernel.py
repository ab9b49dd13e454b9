"""Triton kernel of ``TokenAggregate``: out[b, t] = sum_{i: dest[b,i]=t} w[b,i] x[b,i] (/ sum w).

Deterministic: each program owns a [BLOCK_T, BLOCK_C] tile of the output and sums over all
tokens with a one-hot matrix product (no atomics, so results do not depend on scheduling; the
same reason the ONNX body avoids ScatterND). The weights enter the assignment matrix in the
input dtype (integer sizes are exact up to 2048 in fp16, 256 in bf16) and the products are
accumulated in fp32, so a large size times a large activation cannot overflow fp16.

Parameter order follows TensorRT's AOT plugin convention: input pointers, then int scalars,
then output pointers; compile-time constants last.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deploytk.ops.kernel_common import KernelPlan, check_device, kernel_dtype, precision, run
from deploytk.ops.token_aggregate import check_aggregate_args


@triton.jit
def token_aggregate_kernel(
    x_ptr,
    w_ptr,
    dest_ptr,  # inputs: x [B, N, C], weight [B, N] fp32, dest [B, N] int64
    N,
    C,
    T,  # tokens in, channels, tokens out
    out_ptr,  # output [B, T, C]
    NORMALIZE: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    b = tl.program_id(2).to(tl.int64)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < C
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    den = tl.zeros((BLOCK_T,), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < N
        d = tl.load(dest_ptr + b * N + n, mask=n_ok, other=-1)
        w = tl.load(w_ptr + b * N + n, mask=n_ok, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + (b * N + n[:, None]) * C + c[None, :], mask=n_ok[:, None] & c_ok[None, :], other=0.0)
        hit_w = tl.where(d[None, :] == t[:, None], w[None, :], 0.0)  # [BLOCK_T, BLOCK_N]: the weighted assignment
        # the weights ride in the assignment matrix, so w*x is formed in the dot's fp32 accumulator
        # (a low-precision x*w could overflow fp16 for large sizes)
        hit_w = hit_w.to(x.dtype)
        acc += tl.dot(hit_w, x, input_precision=PRECISION)
        den += tl.sum(hit_w.to(tl.float32), axis=1)  # the same (rounded) weights: a mean stays a mean
    if NORMALIZE:
        acc = acc / tl.where(den > 0, den, 1.0)[:, None]
    t_ok = t < T
    tl.store(out_ptr + (b * T + t[:, None]) * C + c[None, :], acc.to(out_ptr.dtype.element_ty), mask=t_ok[:, None] & c_ok[None, :])


def config(channels: int) -> dict:
    """Tile sizes (compile-time constants): 32 output tokens x 64 tokens in x 64 channels."""
    return {"BLOCK_T": 32, "BLOCK_N": 64, "BLOCK_C": 64 if channels >= 64 else max(16, triton.next_power_of_2(channels))}


def grid(batch, tokens_out: int, channels: int, cfg: dict) -> tuple:
    """(token tiles, channel tiles, batch). ``batch`` may be a TensorRT ``ShapeExpr`` (plugins): it is
    passed through, and the divisions are of ints (``trtp.cdiv`` refuses two ints)."""
    return (triton.cdiv(tokens_out, cfg["BLOCK_T"]), triton.cdiv(channels, cfg["BLOCK_C"]), batch)


def plan(shapes: list, attrs: dict, dtype: str) -> KernelPlan:
    """x [B, N, C], weight [B, N, 1], dest [B, N]; attributes tokens_out, normalize."""
    (batch, tokens, channels), tokens_out = shapes[0], int(attrs["tokens_out"])
    cfg = config(channels)
    constexprs = {"NORMALIZE": bool(attrs["normalize"]), "PRECISION": precision(dtype), **cfg}
    return KernelPlan(token_aggregate_kernel, constexprs, [tokens, channels, tokens_out], grid(batch, tokens_out, channels, cfg))


def launch(x: torch.Tensor, weight: torch.Tensor, dest: torch.Tensor, tokens_out: int, normalize: bool) -> torch.Tensor:
    """The CUDA implementation of ``deploytk::token_aggregate`` (weights as fp32 [B, N])."""
    check_aggregate_args(x, weight, dest, tokens_out)
    dtype = kernel_dtype("token_aggregate", x)
    check_device(x, weight, dest)
    b, n, c = x.shape
    out = torch.empty(b, tokens_out, c, dtype=x.dtype, device=x.device)
    if out.numel():
        w = weight.reshape(b, n).to(torch.float32)
        run(
            plan([list(x.shape), list(weight.shape), list(dest.shape)], {"tokens_out": tokens_out, "normalize": normalize}, dtype),
            [x, w, dest],
            [out],
        )
    return out
