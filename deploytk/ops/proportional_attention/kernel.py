"""Triton kernel of ``ProportionalAttention``: softmax((Q*scale) K^T + log(size)) V, flash-style.

One program per (block of queries, batch*head): keys/values stream through in blocks with an
online softmax (running max and sum in fp32), so the [N, N] logits never reach memory. The
scale is applied to Q before the first matmul, as in the reference and TensorRT's fused
attention. log(size) is the additive key bias; padded keys get -inf.

Parameter order follows TensorRT's AOT plugin convention (inputs, int scalars, outputs); the
scale is a compile-time constant because AOT plugin scalars are integers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deploytk.errors import DeploytkError
from deploytk.ops.kernel_common import KernelPlan, check_device, kernel_dtype, precision, run
from deploytk.ops.proportional_attention import check_attention_args


@triton.jit
def proportional_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    size_ptr,  # q, k, v [B, H, N, D]; size [B, N] fp32
    N,
    H,
    out_ptr,  # [B, H, N, D]
    SCALE: tl.constexpr,
    HEAD_D: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    base = bh * N * HEAD_D
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    m_ok, d_ok = m < N, d < HEAD_D
    q = tl.load(q_ptr + base + m[:, None] * HEAD_D + d[None, :], mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    q = (q.to(tl.float32) * SCALE).to(q.dtype)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < N
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + base + n[:, None] * HEAD_D + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        size = tl.load(size_ptr + b * N + n, mask=n_ok, other=1.0)
        s = s + tl.where(n_ok, tl.log(size), float("-inf"))[None, :]
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + base + n[:, None] * HEAD_D + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + base + m[:, None] * HEAD_D + d[None, :], out.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def config(head_dim: int, fp32: bool) -> dict:
    """Tiles of queries x keys. fp32 ('ieee' products, no tensor cores) takes 32 x 32: at 64 x 64
    ptxas spilled 13 KB per thread (sm_90, head dim 64, 4 warps); 32 x 32 spills nothing and
    needs 45 KB of shared memory. fp16/bf16: 64 x 64, no spills."""
    block = 32 if fp32 else 64
    return {"BLOCK_M": block, "BLOCK_N": block, "BLOCK_D": max(16, triton.next_power_of_2(head_dim))}


def grid(batch, heads: int, tokens: int, cfg: dict) -> tuple:
    """(query tiles, batch * heads, 1). ``batch`` may be a TensorRT ``ShapeExpr`` (plugins): it is only
    multiplied, and the divisions are of ints (``trtp.cdiv`` refuses two ints)."""
    return (triton.cdiv(tokens, cfg["BLOCK_M"]), batch * heads, 1)


def plan(shapes: list, attrs: dict, dtype: str) -> KernelPlan:
    """q, k, v [B, H, N, D], size [B, N, 1]; attribute scale (a compile-time constant: AOT plugin scalars are ints)."""
    batch, heads, tokens, head_dim = shapes[0]
    cfg = config(head_dim, dtype == "fp32")
    constexprs = {"SCALE": float(attrs["scale"]), "HEAD_D": int(head_dim), "PRECISION": precision(dtype), **cfg}
    return KernelPlan(proportional_attention_kernel, constexprs, [tokens, heads], grid(batch, heads, tokens, cfg))


def launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, size: torch.Tensor, scale: float) -> torch.Tensor:
    """The CUDA implementation of ``deploytk::proportional_attention`` (sizes as fp32 [B, N])."""
    check_attention_args(q, k, v, size)
    if v.shape != q.shape:
        raise DeploytkError(f"the attention kernel needs v of q's shape {tuple(q.shape)}; got {tuple(v.shape)}.")
    if not (q.dtype == k.dtype == v.dtype):
        raise DeploytkError(f"q, k, v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}.")
    dtype = kernel_dtype("proportional_attention", q)
    check_device(q, k, v, size)
    b, _, n, _ = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if out.numel():
        shapes = [list(t.shape) for t in (q, k, v, size)]
        run(plan(shapes, {"scale": scale}, dtype), [q, k, v, size.reshape(b, n).to(torch.float32)], [out])
    return out
