"""Triton kernel of ``TopKSelect``: keep the protected tokens and the ``keep`` best-scored others.

One program per image, every token of the image in registers (N <= ``MAX_TOKENS``). A
candidate's rank in (score desc, index asc) order -- ONNX TopK's and a stable descending
argsort's -- is counted, not sorted, so ties resolve exactly as in the reference; the kept
tokens' slots are a prefix sum. The scores are compared as given (no arithmetic), so the
kernel must agree with the reference bit for bit.

``kernel_common.kept_tokens`` is shared with ``CrucialMatch``. Parameter order follows TensorRT's AOT
plugin convention: input pointers, int scalars, output pointers, then compile-time constants.
"""

from __future__ import annotations

import triton
import triton.language as tl

from deploytk.ops.checks import check_select_args
from deploytk.ops.kernel_common import KernelPlan, kept_tokens, launch_matching, matching_grid, rank_block, row_warps


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


def plan(shapes: list, attrs: dict, dtype: str) -> KernelPlan:
    """scores [B, N]; attributes keep, protected."""
    batch, tokens = shapes[0]
    block_n = max(16, triton.next_power_of_2(tokens))
    cfg = {"BLOCK_N": block_n, "BLOCK_R": rank_block(block_n)}
    return KernelPlan(
        topk_select_kernel, cfg, [tokens, int(attrs["keep"]), int(attrs["protected"])], matching_grid(batch), row_warps(block_n)
    )


def launch(scores, keep: int, protected: int):
    """The CUDA implementation of ``deploytk::topk_select``."""
    check_select_args("topk_select", scores, keep, protected)
    return launch_matching("topk_select", plan, [scores], {"keep": keep, "protected": protected})
