"""Triton kernel of ``VisionZipSelect``: dominant tokens as in TopKSelect, evenly spaced contextual targets among the
remaining tokens, every other remaining token joining its most similar target (cosine, first target on ties).

One program per image, in three phases separated by barriers:
1. dominant tokens and their slots (``kernel_common.kept_tokens``, in registers); each remaining token's rank among
   the remaining ones (a prefix sum) gives the targets; each token's target number (-1 for the rest) is parked as
   int32 in the first N slots of the image's own ``dest`` row (N int64 = 2N int32), so the op needs no workspace;
2. for blocks of rows, the cosine against every target column (fp32, ieee products) and the number of the best
   target (targets are numbered in index order, so the smallest number among equal maxima is the first index),
   parked in int32 slots [N, 2N);
3. dest = own slot if dominant, else protected + dominant + its target number; written once all reads are done.
"""

from __future__ import annotations

import triton
import triton.language as tl

from deploytk.ops.kernel_common import (
    KernelPlan,
    cosine_tile,
    kept_tokens,
    launch_matching,
    matching_grid,
    row_tiles,
    row_warps,
    running_argmax,
    unit_rows,
)
from deploytk.ops.visionzip_select import check_visionzip_args
from deploytk.ops.visionzip_select.reference import target_step


@triton.jit
def visionzip_select_kernel(
    scores_ptr,
    metric_ptr,  # inputs: scores [B, N], metric [B, N, D]
    N,
    D,
    DOMINANT,
    CONTEXTUAL,
    PROTECTED,
    STEP,
    dest_ptr,  # output: dest [B, N] int64
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row0 = tl.program_id(0).to(tl.int64) * N
    scratch = (dest_ptr + row0).to(tl.pointer_type(tl.int32))

    # 1. dominant tokens, and the targets among the remaining ones
    i, kept, slot = kept_tokens(scores_ptr + row0, N, DOMINANT, PROTECTED, BLOCK_N, BLOCK_R)
    remaining = (i < N) & ~kept
    rank = tl.cumsum(remaining.to(tl.int32), axis=0) - 1
    is_target = remaining & (rank % STEP == 0) & (rank < STEP * CONTEXTUAL)
    target = tl.where(is_target, rank // STEP, -1)
    tl.store(scratch + i, target, mask=i < N)
    tl.debug_barrier()

    # 2. every token's most similar target
    for i0 in range(0, N, BLOCK_I):
        ii = i0 + tl.arange(0, BLOCK_I)
        i_ok = ii < N
        inv_i = unit_rows(metric_ptr, row0, ii, i_ok, D, BLOCK_D, BLOCK_I)
        best = tl.full((BLOCK_I,), float("-inf"), tl.float32)
        best_target = tl.zeros((BLOCK_I,), dtype=tl.int32)
        for j0 in range(0, N, BLOCK_J):
            jj = j0 + tl.arange(0, BLOCK_J)
            col_target = tl.load(scratch + jj, mask=jj < N, other=-1)
            col_ok = col_target >= 0
            inv_j = unit_rows(metric_ptr, row0, jj, col_ok, D, BLOCK_D, BLOCK_J)
            s = cosine_tile(metric_ptr, row0, ii, i_ok, inv_i, jj, col_ok, inv_j, D, BLOCK_D, BLOCK_I, BLOCK_J)
            s = tl.where(col_ok[None, :], s, float("-inf"))
            best, best_target = running_argmax(s, col_target, best, best_target)  # a tile without targets never wins (-inf)
        tl.store(scratch + N + ii, best_target, mask=i_ok)
    tl.debug_barrier()

    # 3. dominant: own slot; a target: its number; the rest: their target's
    joined = tl.load(scratch + N + i, mask=i < N, other=0)
    dest = tl.where(kept, slot, PROTECTED + DOMINANT + tl.where(is_target, target, joined))
    tl.debug_barrier()  # every thread has read the scratch before it is overwritten
    tl.store(dest_ptr + row0 + i, dest.to(tl.int64), mask=i < N)


def plan(shapes: list, attrs: dict, dtype: str) -> KernelPlan:
    """scores [B, N], metric [B, N, D]; attributes dominant, contextual, protected."""
    batch, tokens = shapes[0]
    channels = shapes[1][2]
    dominant, contextual, protected = int(attrs["dominant"]), int(attrs["contextual"]), int(attrs["protected"])
    cfg = row_tiles(tokens, channels)
    ints = [tokens, channels, dominant, contextual, protected, target_step(tokens - protected - dominant, contextual)]
    return KernelPlan(visionzip_select_kernel, cfg, ints, matching_grid(batch), row_warps(cfg["BLOCK_N"]))


def launch(scores, metric, dominant: int, contextual: int, protected: int):
    """The CUDA implementation of ``deploytk::visionzip_select``."""
    check_visionzip_args(scores, metric, dominant, contextual, protected)
    attrs = {"dominant": dominant, "contextual": contextual, "protected": protected}
    return launch_matching("visionzip_select", plan, [scores, metric], attrs)
