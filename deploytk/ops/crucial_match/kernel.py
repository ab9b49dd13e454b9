"""Triton kernel of ``CrucialMatch``: kept ("crucial") tokens as in TopKSelect; every other
token joins its most similar crucial token (cosine on the metric, first index on ties).

One program per image, in three phases separated by barriers:
1. kept tokens and their slots (``kernel_common.kept_tokens``, in registers); each crucial
   token's slot (-1 for the rest) is parked as int32 in the first N slots of the image's own
   ``dest`` row (N int64 = 2N int32), so the op needs no workspace;
2. for blocks of rows, the cosine against every crucial column (fp32, ieee products) and
   the slot of the best one (crucial slots grow with the index, so the smallest slot among
   equal maxima is the first index), parked in int32 slots [N, 2N);
3. dest = own slot if kept, else the best crucial token's slot; written once all reads are done.
"""

from __future__ import annotations

import triton
import triton.language as tl

from deploytk.ops.checks import check_select_args
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


@triton.jit
def crucial_match_kernel(
    metric_ptr,
    scores_ptr,  # inputs: metric [B, N, D], scores [B, N]
    N,
    D,
    KEEP,
    PROTECTED,
    dest_ptr,  # output: dest [B, N] int64
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row0 = tl.program_id(0).to(tl.int64) * N
    scratch = (dest_ptr + row0).to(tl.pointer_type(tl.int32))

    # 1. crucial tokens' slots
    i, kept, slot = kept_tokens(scores_ptr + row0, N, KEEP, PROTECTED, BLOCK_N, BLOCK_R)
    tl.store(scratch + i, tl.where(kept & (i >= PROTECTED), slot, -1), mask=i < N)
    tl.debug_barrier()

    # 2. slot of every token's most similar crucial token
    for i0 in range(0, N, BLOCK_I):
        ii = i0 + tl.arange(0, BLOCK_I)
        i_ok = ii < N
        inv_i = unit_rows(metric_ptr, row0, ii, i_ok, D, BLOCK_D, BLOCK_I)
        best = tl.full((BLOCK_I,), float("-inf"), tl.float32)
        best_slot = tl.zeros((BLOCK_I,), dtype=tl.int32)
        for j0 in range(PROTECTED, N, BLOCK_J):
            jj = j0 + tl.arange(0, BLOCK_J)
            j_ok = jj < N
            col_slot = tl.load(scratch + jj, mask=j_ok, other=-1)
            crucial = col_slot >= 0
            inv_j = unit_rows(metric_ptr, row0, jj, crucial, D, BLOCK_D, BLOCK_J)
            s = cosine_tile(metric_ptr, row0, ii, i_ok, inv_i, jj, crucial, inv_j, D, BLOCK_D, BLOCK_I, BLOCK_J)
            s = tl.where(crucial[None, :], s, float("-inf"))
            best, best_slot = running_argmax(s, col_slot, best, best_slot)  # a tile without crucial columns never wins (-inf)
        tl.store(scratch + N + ii, best_slot, mask=i_ok)
    tl.debug_barrier()

    # 3. kept: own slot; the rest: their crucial token's
    target_slot = tl.load(scratch + N + i, mask=i < N, other=0)
    dest = tl.where(kept, slot, target_slot)
    tl.debug_barrier()  # every thread has read the scratch before it is overwritten
    tl.store(dest_ptr + row0 + i, dest.to(tl.int64), mask=i < N)


def plan(shapes: list, attrs: dict, dtype: str) -> KernelPlan:
    """metric [B, N, D], scores [B, N]; attributes keep, protected."""
    batch, tokens, channels = shapes[0]
    cfg = row_tiles(tokens, channels)
    ints = [tokens, channels, int(attrs["keep"]), int(attrs["protected"])]
    return KernelPlan(crucial_match_kernel, cfg, ints, matching_grid(batch), row_warps(cfg["BLOCK_N"]))


def launch(metric, scores, keep: int, protected: int):
    """The CUDA implementation of ``deploytk::crucial_match``."""
    check_select_args("crucial_match", scores, keep, protected, metric)
    return launch_matching("crucial_match", plan, [metric, scores], {"keep": keep, "protected": protected})
