"""Triton kernel of ``SizeSplitMatch`` (ATM): the smaller-size half of the candidates matched
into the larger half, the ``r`` best-matched small tokens merge, everything else keeps its order.

One program per image, four phases separated by barriers, with no sort:
1. each candidate's rank in (size asc, index asc) order -- a stable argsort's -- by counting;
   rank < ceil(M/2) puts it in the small half A (M = N - protected);
2. for blocks of A rows, the cosine (fp32, ieee products) against every B column and the
   best one, ties to the lower size rank (ONNX ArgMax over the rank-ordered half);
3. the r sources: A tokens in (best score desc, size rank asc) order, counted; the r-th
   is the pivot, so "is k a source" is a comparison that any thread can make from memory;
4. dest: kept tokens by prefix sum, a source takes its target's slot (target index minus the
   sources before it).
Scratch lives in the image's own ``dest`` row (N int64 = 2N int32): int32 slot t holds
rank | target << 16 (N < 32768), slot N + t the best score as fp32.
"""

from __future__ import annotations

import triton
import triton.language as tl

from deploytk.ops.checks import check_match_args
from deploytk.ops.kernel_common import KernelPlan, cosine_tile, launch_matching, matching_grid, row_tiles, row_warps, unit_rows


@triton.jit
def _small_half(packed, best_score, j, N, na):
    """Tokens j from the scratch: (in the small half A, size rank, best score)."""
    j_ok = j < N
    rank_j = tl.load(packed + j, mask=j_ok, other=0) & 0xFFFF
    score_j = tl.load(best_score + j, mask=j_ok, other=float("-inf"))
    return j_ok & (rank_j < na), rank_j, score_j


@triton.jit
def size_split_match_kernel(
    metric_ptr,
    size_ptr,  # inputs: metric [B, N, D], size [B, N, 1]
    N,
    D,
    R,
    PROTECTED,
    dest_ptr,  # output: dest [B, N] int64
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row0 = tl.program_id(0).to(tl.int64) * N
    packed = (dest_ptr + row0).to(tl.pointer_type(tl.int32))  # [0, N): rank | target << 16
    best_score = (dest_ptr + row0).to(tl.pointer_type(tl.float32)) + N  # [N, 2N)
    na = (N - PROTECTED + 1) // 2

    # 1. size rank of every candidate
    i = tl.arange(0, BLOCK_N)
    cand = (i >= PROTECTED) & (i < N)
    size = tl.load(size_ptr + row0 + i, mask=cand, other=0.0).to(tl.float32)
    rank = tl.zeros((BLOCK_N,), dtype=tl.int32)
    for j0 in range(PROTECTED, N, BLOCK_R):
        j = j0 + tl.arange(0, BLOCK_R)
        j_ok = j < N
        sj = tl.load(size_ptr + row0 + j, mask=j_ok, other=0.0).to(tl.float32)
        before = (sj[None, :] < size[:, None]) | ((sj[None, :] == size[:, None]) & (j[None, :] < i[:, None]))
        rank += tl.sum((before & j_ok[None, :]).to(tl.int32), axis=1)
    tl.store(packed + i, rank, mask=cand)
    tl.debug_barrier()

    # 2. best large-half partner of every small-half token (the low 16 bits stay the rank throughout)
    for i0 in range(PROTECTED, N, BLOCK_I):
        ii = i0 + tl.arange(0, BLOCK_I)
        i_ok = ii < N
        rank_i = tl.load(packed + ii, mask=i_ok, other=0) & 0xFFFF
        is_a = i_ok & (rank_i < na)
        inv_i = unit_rows(metric_ptr, row0, ii, is_a, D, BLOCK_D, BLOCK_I)
        best = tl.full((BLOCK_I,), float("-inf"), tl.float32)
        best_rank = tl.full((BLOCK_I,), 2147483647, tl.int32)
        best_tok = tl.zeros((BLOCK_I,), dtype=tl.int32)
        for j0 in range(PROTECTED, N, BLOCK_J):
            jj = j0 + tl.arange(0, BLOCK_J)
            j_ok = jj < N
            rank_j = tl.load(packed + jj, mask=j_ok, other=0) & 0xFFFF
            is_b = j_ok & (rank_j >= na)
            inv_j = unit_rows(metric_ptr, row0, jj, is_b, D, BLOCK_D, BLOCK_J)
            s = cosine_tile(metric_ptr, row0, ii, is_a, inv_i, jj, is_b, inv_j, D, BLOCK_D, BLOCK_I, BLOCK_J)
            s = tl.where(is_b[None, :], s, float("-inf"))
            chunk_max = tl.max(s, axis=1)
            top = (s == chunk_max[:, None]) & is_b[None, :]
            chunk_rank = tl.min(tl.where(top, rank_j[None, :], 2147483647), axis=1)
            chunk_tok = tl.min(tl.where(top & (rank_j[None, :] == chunk_rank[:, None]), jj[None, :], 2147483647), axis=1)
            better = (chunk_max > best) | ((chunk_max == best) & (chunk_rank < best_rank))
            best_tok = tl.where(better, chunk_tok, best_tok)
            best_rank = tl.where(better, chunk_rank, best_rank)
            best = tl.where(better, chunk_max, best)
        tl.store(best_score + ii, best, mask=i_ok)
        tl.store(packed + ii, rank_i | (best_tok << 16), mask=i_ok)
    tl.debug_barrier()

    # 3. the r sources: rank among A by (best score desc, size rank asc)
    v = tl.load(packed + i, mask=cand, other=0)
    rank = v & 0xFFFF
    target = v >> 16
    score = tl.load(best_score + i, mask=cand, other=float("-inf"))
    is_a = cand & (rank < na)
    src_rank = tl.zeros((BLOCK_N,), dtype=tl.int32)
    for j0 in range(PROTECTED, N, BLOCK_R):
        j = j0 + tl.arange(0, BLOCK_R)
        in_a, rank_j, score_j = _small_half(packed, best_score, j, N, na)
        ahead = (score_j[None, :] > score[:, None]) | ((score_j[None, :] == score[:, None]) & (rank_j[None, :] < rank[:, None]))
        src_rank += tl.sum((ahead & in_a[None, :]).to(tl.int32), axis=1)
    is_src = is_a & (src_rank < R)
    pivot = is_a & (src_rank == R - 1)
    p_score = tl.max(tl.where(pivot, score, float("-inf")), axis=0)
    p_rank = tl.max(tl.where(pivot, rank, -1), axis=0)

    # 4. slots: kept tokens in order; a source takes its target's slot
    slot = tl.cumsum((~is_src & (i < N)).to(tl.int32), axis=0) - 1
    src_before = tl.zeros((BLOCK_N,), dtype=tl.int32)
    for j0 in range(PROTECTED, N, BLOCK_R):
        j = j0 + tl.arange(0, BLOCK_R)
        in_a, rank_j, score_j = _small_half(packed, best_score, j, N, na)
        src_j = in_a & ((score_j > p_score) | ((score_j == p_score) & (rank_j <= p_rank)))
        src_before += tl.sum((src_j[None, :] & (j[None, :] < target[:, None])).to(tl.int32), axis=1)
    dest = tl.where(is_src, target - src_before, slot)
    tl.debug_barrier()  # every thread has read the scratch before it is overwritten
    tl.store(dest_ptr + row0 + i, dest.to(tl.int64), mask=i < N)


def plan(shapes: list, attrs: dict, dtype: str) -> KernelPlan:
    """metric [B, N, D], size [B, N, 1]; attributes r, protected."""
    batch, tokens, channels = shapes[0]
    cfg = row_tiles(tokens, channels)
    ints = [tokens, channels, int(attrs["r"]), int(attrs["protected"])]
    return KernelPlan(size_split_match_kernel, cfg, ints, matching_grid(batch), row_warps(cfg["BLOCK_N"]))


def launch(metric, size, r: int, protected: int):
    """The CUDA implementation of ``deploytk::size_split_match``."""
    check_match_args("size_split_match", metric, {"size": size}, r, protected)
    return launch_matching("size_split_match", plan, [metric, size], {"r": r, "protected": protected})
