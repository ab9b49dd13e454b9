"""Triton kernel of ``ToMeMatch``: ToMe's bipartite soft matching -> dest [B, N] (one program per image).

A = even tokens, B = odd tokens. Per image: cosine scores A x B (fp32, ieee products, not TF32),
each A token's best B partner (first index on ties, like ONNX ArgMax), the rank of each A
token in (score desc, index asc) order -- the order of a stable descending argsort and of
ONNX TopK -- by counting, and the closed-form output slots of ``reference.tome_slots``.
No sort, no atomics: the result does not depend on scheduling.

One launch does it all (a TensorRT AOT plugin launches one kernel). Ranking needs every A
token's best score; they are parked as fp32 in the first bytes of the image's own ``dest``
row (N int64 = 2N fp32 slots >= ceil(N/2)), read back after a barrier, and overwritten by the
final slots after a second barrier, so the op needs no workspace.

Parameter order follows TensorRT's AOT plugin convention: input pointers, int scalars,
output pointers, then compile-time constants.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deploytk.ops.checks import check_match_args
from deploytk.ops.kernel_common import KernelPlan, cosine_tile, launch_matching, matching_grid, running_argmax, unit_rows


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
        inv_a = unit_rows(metric_ptr, row0, 2 * ii, i_ok, D, BLOCK_D, BLOCK_I)
        best = tl.full((BLOCK_I,), float("-inf"), tl.float32)
        best_idx = tl.zeros((BLOCK_I,), dtype=tl.int32)
        for j0 in range(0, nb, BLOCK_B):
            jb = j0 + tl.arange(0, BLOCK_B)
            b_ok = jb < nb
            inv_b = unit_rows(metric_ptr, row0, 2 * jb + 1, b_ok, D, BLOCK_D, BLOCK_B)
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

    # 3. output slots (reference.tome_slots)
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


def plan(shapes: list, attrs: dict, dtype: str) -> KernelPlan:
    """metric [B, N, D]; attributes r, protected, sort_unmerged."""
    batch, tokens, channels = shapes[0]
    cfg = {"SORT_UNMERGED": bool(attrs["sort_unmerged"]), **config(tokens, channels)}
    ints = [tokens, channels, int(attrs["r"]), int(attrs["protected"])]
    return KernelPlan(tome_match_kernel, cfg, ints, matching_grid(batch), num_warps(cfg))


def launch(metric: torch.Tensor, r: int, protected: int, sort_unmerged: bool) -> torch.Tensor:
    """The CUDA implementation of ``deploytk::tome_match``."""
    check_match_args("tome_match", metric, {}, r, protected)
    return launch_matching("tome_match", plan, [metric], {"r": r, "protected": protected, "sort_unmerged": sort_unmerged})
