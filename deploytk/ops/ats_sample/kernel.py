"""Triton kernel of ``ATSSample``: one program per image, every candidate token in registers.

The CDF is a prefix sum (tl.cumsum: another summation order than the reference's, so a pick
can differ only where a step is equidistant from two CDF values to rounding: selftest's tie
rule). Steps are taken BLOCK_S at a time against all tokens ([BLOCK_S, BLOCK_M] <= 16K
compares); a token is picked if any step's nearest CDF value is its own (first token on
ties); picked tokens' slots are a prefix sum.
"""

from __future__ import annotations

import triton
import triton.language as tl

from deploytk.ops.ats_sample import check_ats_args
from deploytk.ops.kernel_common import KernelPlan, launch_matching, matching_grid, row_warps


@triton.jit
def ats_sample_kernel(
    scores_ptr,
    size_ptr,
    steps_ptr,  # inputs: scores [B, M], size [B, M, 1], steps [S]
    M,
    S,
    dest_ptr,  # output: dest [B, M] int64
    BLOCK_M: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    row0 = tl.program_id(0).to(tl.int64) * M
    i = tl.arange(0, BLOCK_M)
    ok = i < M
    s = tl.load(scores_ptr + row0 + i, mask=ok, other=0.0).to(tl.float32)
    cdf = tl.cumsum(s / (tl.sum(s, axis=0) + 1e-6), axis=0)
    size = tl.load(size_ptr + row0 + i, mask=ok, other=1.0)
    cdf = tl.where(size > 0, cdf, cdf + 0.1)
    picked = tl.zeros((BLOCK_M,), dtype=tl.int32)
    for s0 in range(0, S, BLOCK_S):
        k = s0 + tl.arange(0, BLOCK_S)
        step = tl.load(steps_ptr + k, mask=k < S, other=0.0)
        gap = tl.where(ok[None, :], tl.abs(step[:, None] - cdf[None, :]), float("inf"))
        nearest = tl.min(gap, axis=1)
        first = tl.min(tl.where(gap == nearest[:, None], i[None, :], 2147483647), axis=1)
        hit = (first[:, None] == i[None, :]) & (k < S)[:, None]
        picked = tl.maximum(picked, tl.max(hit.to(tl.int32), axis=0))
    slot = tl.cumsum(picked, axis=0) - 1
    tl.store(dest_ptr + row0 + i, tl.where(picked > 0, slot, S).to(tl.int64), mask=ok)


def plan(shapes: list, attrs: dict, dtype: str) -> KernelPlan:
    """scores [B, M], size [B, M, 1], steps [S]; no attributes."""
    batch, tokens = shapes[0][:2]
    block_m = max(16, triton.next_power_of_2(tokens))
    cfg = {"BLOCK_M": block_m, "BLOCK_S": max(1, min(32, 16384 // block_m))}
    return KernelPlan(ats_sample_kernel, cfg, [tokens, int(shapes[2][0])], matching_grid(batch), row_warps(block_m))


def launch(scores, size, steps):
    """The CUDA implementation of ``deploytk::ats_sample``."""
    check_ats_args(scores, size, steps)
    return launch_matching("ats_sample", plan, [scores, size, steps], {})
