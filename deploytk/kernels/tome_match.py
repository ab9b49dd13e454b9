"""Triton kernel of ``ToMeMatch``: ToMe's bipartite soft matching -> dest [B, N] (one program per image).

A = even tokens, B = odd tokens. Per image: cosine scores A x B (fp32, ieee products, not TF32),
each A token's best B partner (first index on ties, like ONNX ArgMax), the rank of each A
token in (score desc, index asc) order -- the order of a stable descending argsort and of
ONNX TopK -- by counting, and the closed-form output slots of ``merging.tome.tome_slots``.
No sort, no atomics: the result does not depend on scheduling.

One launch does it all (a TensorRT AOT plugin launches one kernel). Ranking needs every A
token's best score; they are parked as fp32 in the first bytes of the image's own ``dest``
row (N int64 = 2N fp32 slots >= ceil(N/2)), read back after a barrier, and overwritten by the
final slots after a second barrier, so the op needs no workspace.

Parameter order follows TensorRT's AOT plugin convention: input pointers, int scalars,
output pointers, then compile-time constants.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _unit_rows(metric_ptr, row0, tok, ok, D, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    """1 / ||metric[tok]|| for a block of token rows (fp32)."""
    sq = tl.zeros((ROWS,), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        v = tl.load(metric_ptr + (row0 + tok[:, None]) * D + d[None, :], mask=ok[:, None] & (d[None, :] < D), other=0.0).to(tl.float32)
        sq += tl.sum(v * v, axis=1)
    # padding rows: 1, not inf (their scores are masked). IEEE-rounded sqrt and division (a compiled
    # plain sqrt and / are the GPU's approximations); the sums' order still differs from the
    # reference's, so cosines can differ by an ulp or so and only near-ties can flip -- what
    # selftest's tie checks accept, and no more.
    return tl.div_rn(1.0, tl.sqrt_rn(tl.where(ok, sq, 1.0)))


@triton.jit
def cosine_tile(
    metric_ptr, row0, rows, rows_ok, inv_rows, cols, cols_ok, inv_cols, D, BLOCK_D: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr
):
    """[ROWS, COLS] cosines of token rows x token columns (fp32, ieee products); 0 where masked."""
    s = tl.zeros((ROWS, COLS), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        d_ok = d[None, :] < D
        vr = tl.load(metric_ptr + (row0 + rows[:, None]) * D + d[None, :], mask=rows_ok[:, None] & d_ok, other=0.0).to(tl.float32)
        vc = tl.load(metric_ptr + (row0 + cols[:, None]) * D + d[None, :], mask=cols_ok[:, None] & d_ok, other=0.0).to(tl.float32)
        s += tl.dot(vr * inv_rows[:, None], tl.trans(vc * inv_cols[:, None]), input_precision="ieee")
    return s


@triton.jit
def running_argmax(s, cols, best, best_idx):
    """Fold a [rows, cols] score tile into each row's running (max, index of the max): the first
    column on ties within the tile, and an earlier tile keeps a tie (ONNX ArgMax / torch.max)."""
    chunk_max = tl.max(s, axis=1)
    chunk_idx = tl.min(tl.where(s == chunk_max[:, None], cols[None, :], 2147483647), axis=1)
    better = chunk_max > best
    return tl.where(better, chunk_max, best), tl.where(better, chunk_idx, best_idx)


@triton.jit
def tome_match_kernel(
    metric_ptr,  # input: metric [B, N, D]
    N,
    D,
    R,
    PROTECTED,  # tokens, metric channels, tokens merged away, protected prefix
    dest_ptr,  # output: dest [B, N] int64
    SORT_UNMERGED: tl.constexpr,
    BLOCK_A: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    row0 = b * N
    na = (N + 1) // 2
    nb = N // 2
    pa = (PROTECTED + 1) // 2
    pb = PROTECTED // 2
    n_unm = na - R

    # 1. best B partner of every A token, BLOCK_I rows at a time, parked in this image's dest row
    scratch = (dest_ptr + row0).to(tl.pointer_type(tl.float32))  # [0, na): best score
    scratch_idx = (dest_ptr + row0).to(tl.pointer_type(tl.int32)) + na  # [na, 2na): its B index
    for i0 in range(0, na, BLOCK_I):
        ii = i0 + tl.arange(0, BLOCK_I)
        i_ok = ii < na
        inv_a = _unit_rows(metric_ptr, row0, 2 * ii, i_ok, D, BLOCK_D, BLOCK_I)
        best = tl.full((BLOCK_I,), float("-inf"), tl.float32)
        best_idx = tl.zeros((BLOCK_I,), dtype=tl.int32)
        for j0 in range(0, nb, BLOCK_B):
            jb = j0 + tl.arange(0, BLOCK_B)
            b_ok = jb < nb
            inv_b = _unit_rows(metric_ptr, row0, 2 * jb + 1, b_ok, D, BLOCK_D, BLOCK_B)
            s = cosine_tile(metric_ptr, row0, 2 * ii, i_ok, inv_a, 2 * jb + 1, b_ok, inv_b, D, BLOCK_D, BLOCK_I, BLOCK_B)
            allowed = (ii[:, None] >= pa) & b_ok[None, :] & (jb[None, :] >= pb)  # protected A rows / B columns: -inf
            s = tl.where(allowed, s, float("-inf"))
            best, best_idx = running_argmax(s, jb, best, best_idx)
        tl.store(scratch + ii, best, mask=i_ok)
        tl.store(scratch_idx + ii, best_idx, mask=i_ok)
    tl.debug_barrier()

    # 2. rank of every A token by counting (all A tokens of the image in registers)
    ia = tl.arange(0, BLOCK_A)
    a_ok = ia < na
    node_max = tl.load(scratch + ia, mask=a_ok, other=float("-inf"))
    node_idx = tl.load(scratch_idx + ia, mask=a_ok, other=0)
    rank = tl.zeros((BLOCK_A,), dtype=tl.int32)
    for j0 in range(0, na, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        j_ok = j < na
        mj = tl.load(scratch + j, mask=j_ok, other=float("-inf"))
        ahead = (mj[None, :] > node_max[:, None]) | ((mj[None, :] == node_max[:, None]) & (j[None, :] < ia[:, None]))
        rank += tl.sum((ahead & j_ok[None, :]).to(tl.int32), axis=1)
    is_src = rank < R

    if SORT_UNMERGED:
        # slot among unmerged A tokens = index - sources before it; a source is ranked <= the pivot (rank R-1)
        pivot = (rank == R - 1) & a_ok
        p_max = tl.max(tl.where(pivot, node_max, float("-inf")), axis=0)
        p_idx = tl.max(tl.where(pivot, ia, -1), axis=0)
        src_before = tl.zeros((BLOCK_A,), dtype=tl.int32)
        for j0 in range(0, na, BLOCK_J):
            j = j0 + tl.arange(0, BLOCK_J)
            j_ok = j < na
            mj = tl.load(scratch + j, mask=j_ok, other=float("-inf"))
            src_j = j_ok & ((mj > p_max) | ((mj == p_max) & (j <= p_idx)))
            src_before += tl.sum((src_j[None, :] & (j[None, :] < ia[:, None])).to(tl.int32), axis=1)
        k = ia - src_before
    else:
        k = rank - R  # ToMe's order: unmerged tokens by descending score
    tl.debug_barrier()  # every thread has read the scratch before it is overwritten

    # 3. output slots (merging.tome.tome_slots)
    unm_slot = tl.where(k < pa, 2 * k, PROTECTED + k - pa)
    dst_slot = tl.where(node_idx < pb, 2 * node_idx + 1, PROTECTED + n_unm - pa + node_idx - pb)
    tl.store(dest_ptr + row0 + 2 * ia, tl.where(is_src, dst_slot, unm_slot).to(tl.int64), mask=a_ok)
    for j0 in range(0, nb, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        slot = tl.where(j < pb, 2 * j + 1, PROTECTED + n_unm - pa + j - pb)
        tl.store(dest_ptr + row0 + 2 * j + 1, slot.to(tl.int64), mask=j < nb)


def config(tokens: int, channels: int) -> dict:
    """Compile-time tile sizes: scores in 64 x 32 tiles; ranking holds all A tokens (<= 512 for N <= 1024)."""
    block_a = max(16, triton.next_power_of_2((tokens + 1) // 2))
    return {
        "BLOCK_A": block_a,
        "BLOCK_I": min(block_a, 64),
        "BLOCK_B": 32,
        "BLOCK_D": 32 if channels >= 32 else 16,
        "BLOCK_J": 32,
    }


def num_warps(cfg: dict) -> int:
    return 4 if cfg["BLOCK_A"] <= 128 else 8


def grid(batch) -> tuple:
    """One program per image, for every matching kernel; ``batch`` may be symbolic (TensorRT plugins)."""
    return (batch, 1, 1)


__all__ = ["tome_match_kernel", "cosine_tile", "running_argmax", "config", "num_warps", "grid"]
