"""Triton kernel of ``PiToMeMatch``: PiToMe's energy-ordered matching -> dest [B, N] (one program per image).

Per image, on the patch tokens (after the protected prefix), in four phases separated by barriers:
1. every token's energy, mean over all tokens of elu(cos - margin) (fp32 cosines with ieee products), parked as
   fp32 in the first T 32-bit slots of the image's own ``dest`` row (N int64 = 2N 32-bit slots);
2. each token's position in (energy desc, index asc) order -- a stable descending argsort's and ONNX TopK's --
   by counting, parked as int32 in slots [N, N + T);
3. for the A tokens of the matched span (even positions), the best B token (odd positions) by cosine, the first
   B position on ties as ``torch.max``; its score replaces the energy in slot [i], and its B position is packed
   into the upper half of the token's position word (positions < 2^16);
4. the rank of every A token by best score (desc, A position asc), then the slots of ``reference.pitome_dest``,
   written once every read of the scratch is done.
No sort, no atomics: the result does not depend on scheduling; the op needs no workspace.
"""

from __future__ import annotations

import triton
import triton.language as tl

from deploytk.ops.checks import check_match_args
from deploytk.ops.kernel_common import KernelPlan, cosine_tile, launch_matching, matching_grid, rank_block, row_warps, unit_rows


@triton.jit
def _fold_first_position(s, position, best, best_pos):
    """Fold a score tile into each row's running (max, column position of the max): the lowest position wins a tie,
    wherever it sits (columns come in token order, not in position order)."""
    tile_max = tl.max(s, axis=1)
    tile_pos = tl.min(tl.where(s == tile_max[:, None], position[None, :], 2147483647), axis=1)
    better = (tile_max > best) | ((tile_max == best) & (tile_pos < best_pos))
    return tl.where(better, tile_max, best), tl.where(better, tile_pos, best_pos)


@triton.jit
def pitome_match_kernel(
    metric_ptr,  # input: metric [B, N, D]
    N,
    D,
    R,
    PROTECTED,  # tokens, metric channels, tokens merged away, protected prefix
    dest_ptr,  # output: dest [B, N] int64
    MARGIN: tl.constexpr,
    ALPHA: tl.constexpr,
    PROTECT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row0 = tl.program_id(0).to(tl.int64) * N
    T = N - PROTECTED
    if PROTECT:
        span = 2 * R
    else:
        span = T
    n_unm = (span + 1) // 2 - R
    rest = T - span
    score_scratch = (dest_ptr + row0).to(tl.pointer_type(tl.float32))  # [0, T): energy, then best score
    pos_scratch = (dest_ptr + row0).to(tl.pointer_type(tl.int32)) + N  # [N, N + T): position | best B position << 16

    # 1. energy
    for i0 in range(0, T, BLOCK_I):
        ii = i0 + tl.arange(0, BLOCK_I)
        i_ok = ii < T
        inv_i = unit_rows(metric_ptr, row0, PROTECTED + ii, i_ok, D, BLOCK_D, BLOCK_I)
        total = tl.zeros((BLOCK_I,), dtype=tl.float32)
        for j0 in range(0, T, BLOCK_J):
            jj = j0 + tl.arange(0, BLOCK_J)
            j_ok = jj < T
            inv_j = unit_rows(metric_ptr, row0, PROTECTED + jj, j_ok, D, BLOCK_D, BLOCK_J)
            s = cosine_tile(metric_ptr, row0, PROTECTED + ii, i_ok, inv_i, PROTECTED + jj, j_ok, inv_j, D, BLOCK_D, BLOCK_I, BLOCK_J)
            x = s - MARGIN
            e = tl.where(x > 0, x, ALPHA * (tl.exp(x) - 1.0))
            total += tl.sum(tl.where(j_ok[None, :], e, 0.0), axis=1)
        tl.store(score_scratch + ii, total / T, mask=i_ok)
    tl.debug_barrier()

    # 2. position in the energy order
    t = tl.arange(0, BLOCK_N)
    t_ok = t < T
    energy = tl.load(score_scratch + t, mask=t_ok, other=float("-inf"))
    position = tl.zeros((BLOCK_N,), dtype=tl.int32)
    for j0 in range(0, T, BLOCK_R):
        j = j0 + tl.arange(0, BLOCK_R)
        j_ok = j < T
        ej = tl.load(score_scratch + j, mask=j_ok, other=float("-inf"))
        ahead = (ej[None, :] > energy[:, None]) | ((ej[None, :] == energy[:, None]) & (j[None, :] < t[:, None]))
        position += tl.sum((ahead & j_ok[None, :]).to(tl.int32), axis=1)
    tl.store(pos_scratch + t, position, mask=t_ok)
    tl.debug_barrier()

    # 3. each A token's best B token
    for i0 in range(0, T, BLOCK_I):
        ii = i0 + tl.arange(0, BLOCK_I)
        pos_i = tl.load(pos_scratch + ii, mask=ii < T, other=0) & 0xFFFF
        is_a = (ii < T) & (pos_i % 2 == 0) & (pos_i < span)
        inv_i = unit_rows(metric_ptr, row0, PROTECTED + ii, is_a, D, BLOCK_D, BLOCK_I)
        best = tl.full((BLOCK_I,), float("-inf"), tl.float32)
        best_pos = tl.full((BLOCK_I,), 2147483647, tl.int32)
        for j0 in range(0, T, BLOCK_J):
            jj = j0 + tl.arange(0, BLOCK_J)
            pos_j = tl.load(pos_scratch + jj, mask=jj < T, other=0) & 0xFFFF
            is_b = (jj < T) & (pos_j % 2 == 1) & (pos_j < span)
            inv_j = unit_rows(metric_ptr, row0, PROTECTED + jj, is_b, D, BLOCK_D, BLOCK_J)
            s = cosine_tile(metric_ptr, row0, PROTECTED + ii, is_a, inv_i, PROTECTED + jj, is_b, inv_j, D, BLOCK_D, BLOCK_I, BLOCK_J)
            s = tl.where(is_b[None, :], s, float("-inf"))
            best, best_pos = _fold_first_position(s, tl.where(is_b, pos_j // 2, 2147483647), best, best_pos)
        tl.store(score_scratch + ii, best, mask=is_a)
        tl.store(pos_scratch + ii, pos_i | (best_pos << 16), mask=is_a)  # the position bits are unchanged
    tl.debug_barrier()

    # 4. rank of the A tokens by best score, and every token's slot
    word = tl.load(pos_scratch + t, mask=t_ok, other=0)
    pos = word & 0xFFFF
    best_b = word >> 16
    is_a = t_ok & (pos % 2 == 0) & (pos < span)
    node_max = tl.load(score_scratch + t, mask=is_a, other=float("-inf"))
    rank = tl.zeros((BLOCK_N,), dtype=tl.int32)
    for j0 in range(0, T, BLOCK_R):
        j = j0 + tl.arange(0, BLOCK_R)
        pos_j = tl.load(pos_scratch + j, mask=j < T, other=0) & 0xFFFF
        a_j = (j < T) & (pos_j % 2 == 0) & (pos_j < span)
        mj = tl.load(score_scratch + j, mask=a_j, other=float("-inf"))
        ahead = (mj[None, :] > node_max[:, None]) | ((mj[None, :] == node_max[:, None]) & (pos_j[None, :] < pos[:, None]))
        rank += tl.sum((ahead & a_j[None, :]).to(tl.int32), axis=1)
    b_base = PROTECTED + n_unm + rest
    a_slot = tl.where(rank < R, b_base + best_b, PROTECTED + rank - R)
    slot = tl.where(pos >= span, PROTECTED + n_unm + pos - span, tl.where(pos % 2 == 0, a_slot, b_base + pos // 2))
    tl.debug_barrier()  # every thread has read the scratch before it is overwritten
    tl.store(dest_ptr + row0 + PROTECTED + t, slot.to(tl.int64), mask=t_ok)
    for p0 in range(0, PROTECTED, BLOCK_R):
        p = p0 + tl.arange(0, BLOCK_R)
        tl.store(dest_ptr + row0 + p, p.to(tl.int64), mask=p < PROTECTED)


def plan(shapes: list, attrs: dict, dtype: str) -> KernelPlan:
    """metric [B, N, D]; attributes r, protected, margin and alpha (compile-time constants: AOT plugin scalars are
    ints), protect."""
    batch, tokens, channels = shapes[0]
    block_n = max(16, triton.next_power_of_2(tokens))
    cfg = {
        "MARGIN": float(attrs["margin"]),
        "ALPHA": float(attrs["alpha"]),
        "PROTECT": bool(attrs["protect"]),
        "BLOCK_N": block_n,
        "BLOCK_R": rank_block(block_n),
        "BLOCK_I": 64,
        "BLOCK_J": 32,
        "BLOCK_D": 32 if channels >= 32 else 16,
    }
    ints = [tokens, channels, int(attrs["r"]), int(attrs["protected"])]
    return KernelPlan(pitome_match_kernel, cfg, ints, matching_grid(batch), row_warps(block_n))


def launch(metric, r: int, protected: int, margin: float, alpha: float, protect: bool):
    """The CUDA implementation of ``deploytk::pitome_match``."""
    check_match_args("pitome_match", metric, {}, r, protected)
    attrs = {"r": r, "protected": protected, "margin": margin, "alpha": alpha, "protect": protect}
    return launch_matching("pitome_match", plan, [metric], attrs)
