"""Triton kernel of ``TopKSelect``: keep the protected tokens and the ``keep`` best-scored others.

One program per image, every token of the image in registers (N <= ``MAX_TOKENS``). A
candidate's rank in (score desc, index asc) order -- ONNX TopK's and a stable descending
argsort's -- is counted, not sorted, so ties resolve exactly as in the reference; the kept
tokens' slots are a prefix sum. The scores are compared as given (no arithmetic), so the
kernel must agree with the reference bit for bit.

``kept_tokens`` is shared with ``CrucialMatch``. Parameter order follows TensorRT's AOT
plugin convention: input pointers, int scalars, output pointers, then compile-time constants.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: the selection/matching kernels hold an image's tokens in registers; ViTs have <= 1025
MAX_TOKENS = 4096


@triton.jit
def rank_descending(values_ptr, lo, hi, v, idx, BLOCK_R: tl.constexpr):
    """For each (v, idx): how many j in [lo, hi) come first in (value desc, index asc) order."""
    rank = tl.zeros(v.shape, dtype=tl.int32)
    for j0 in range(lo, hi, BLOCK_R):
        j = j0 + tl.arange(0, BLOCK_R)
        j_ok = j < hi
        vj = tl.load(values_ptr + j, mask=j_ok, other=float("-inf")).to(tl.float32)
        ahead = (vj[None, :] > v[:, None]) | ((vj[None, :] == v[:, None]) & (j[None, :] < idx[:, None]))
        rank += tl.sum((ahead & j_ok[None, :]).to(tl.int32), axis=1)
    return rank


@triton.jit
def kept_tokens(scores_ptr, N, KEEP, PROTECTED, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    """(token index, kept mask, kept slot) of one image: protected tokens + the KEEP best candidates, in order."""
    i = tl.arange(0, BLOCK_N)
    cand = (i >= PROTECTED) & (i < N)
    s = tl.load(scores_ptr + i, mask=cand, other=float("-inf")).to(tl.float32)
    rank = rank_descending(scores_ptr, PROTECTED, N, s, i, BLOCK_R)
    kept = (i < PROTECTED) | (cand & (rank < KEEP))
    slot = tl.cumsum(kept.to(tl.int32), axis=0) - 1
    return i, kept, slot


@triton.jit
def topk_select_kernel(
    scores_ptr,  # input: scores [B, N]
    N,
    KEEP,
    PROTECTED,
    dest_ptr,  # output: dest [B, N] int64
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    row0 = tl.program_id(0).to(tl.int64) * N
    i, kept, slot = kept_tokens(scores_ptr + row0, N, KEEP, PROTECTED, BLOCK_N, BLOCK_R)
    dest = tl.where(kept, slot, PROTECTED + KEEP)  # the others: the drop bucket / fused token
    tl.store(dest_ptr + row0 + i, dest.to(tl.int64), mask=i < N)


def rank_block(block_n: int) -> int:
    """Columns per counting step: a [block_n, BLOCK_R] compare tile of <= 16K elements stays in
    registers (8 warps: 64 per thread; at 2048 x 32, ptxas spilled ~3 KB per thread)."""
    return max(2, min(32, 16384 // block_n))


def config(tokens: int) -> dict:
    block_n = max(16, triton.next_power_of_2(tokens))
    return {"BLOCK_N": block_n, "BLOCK_R": rank_block(block_n)}


def num_warps(cfg: dict) -> int:
    return 4 if cfg["BLOCK_N"] <= 256 else 8


__all__ = ["topk_select_kernel", "kept_tokens", "rank_descending", "rank_block", "config", "num_warps", "MAX_TOKENS"]
