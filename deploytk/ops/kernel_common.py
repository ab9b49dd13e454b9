"""What the Triton kernels of the deploytk ops share: launch plans, checks, and ``@triton.jit`` helpers.

Each op's ``kernel.py`` has a ``plan(shapes, attrs, dtype)`` (compile-time constants, int
arguments, grid and warps for given input shapes and node attributes) and a torch launcher
``launch`` (argument checks, then one launch of that plan). The same plan is what the TensorRT
plugins compile ahead of time (``deploytk_plugins.aot``), so the two paths cannot drift.

Kernel parameters follow TensorRT's AOT plugin convention: input pointers, int scalars,
output pointers, then compile-time constants. Under ``TRITON_INTERPRET=1`` the launchers run
on CPU tensors in Triton's interpreter.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from deploytk.errors import DeploytkError

#: dtypes the kernels are built for (the same list the TensorRT plugins advertise)
KERNEL_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
#: the matching kernels hold an image's tokens in registers; ViTs have <= 1025
MAX_TOKENS = 4096


@dataclass(frozen=True)
class KernelPlan:
    """One launch: the kernel, its compile-time constants, int arguments (kernel order), grid and warps.

    The grid's batch entry may be symbolic (a TensorRT ``ShapeExpr``): plans only multiply it.
    """

    kernel: object
    constexprs: dict
    ints: list
    grid: tuple
    num_warps: int = 4


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def check_device(*tensors) -> None:
    if not interpreting() and not all(t.is_cuda for t in tensors):
        raise DeploytkError("the Triton kernels need CUDA tensors (or TRITON_INTERPRET=1 to run them on CPU in Triton's interpreter).")


def kernel_dtype(name: str, x: torch.Tensor) -> str:
    """fp32 | fp16 | bf16 for a dtype the kernels are built for; a clear error otherwise."""
    if x.dtype not in KERNEL_DTYPES:
        raise DeploytkError(f"{name}: dtype {x.dtype} is not supported by the kernel; use float32, float16 or bfloat16.")
    return KERNEL_DTYPES[x.dtype]


def precision(dtype: str) -> str:
    """fp32 inputs: exact fp32 products ('ieee'), not TF32, so fp32 results match the reference."""
    return "ieee" if dtype == "fp32" else "tf32"


def run(plan: KernelPlan, inputs: list, outputs: list) -> None:
    """Launch ``plan`` on contiguous inputs (the launchers check shapes, dtypes and devices first)."""
    plan.kernel[plan.grid](*[t.contiguous() for t in inputs], *plan.ints, *outputs, num_warps=plan.num_warps, **plan.constexprs)


# ---- the matching kernels: one program per image, dest [B, N] -------------------------------


def matching_grid(batch) -> tuple:
    """One program per image, for every matching kernel; ``batch`` may be symbolic (TensorRT plugins)."""
    return (batch, 1, 1)


def launch_matching(name: str, plan_for, inputs: list, attrs: dict) -> torch.Tensor:
    """What every matching launcher ends with: dtype, token-count and device checks, then one launch -> dest [B, N]."""
    dtypes = [kernel_dtype(name, t) for t in inputs]
    b, n = inputs[0].shape[:2]
    if n > MAX_TOKENS:
        raise DeploytkError(f"{name}: the kernel holds an image's tokens in registers and supports up to {MAX_TOKENS} tokens; got {n}.")
    check_device(*inputs)
    dest = torch.empty(b, n, dtype=torch.int64, device=inputs[0].device)
    if dest.numel():
        run(plan_for([list(t.shape) for t in inputs], {**attrs, "tokens": n}, dtypes[0]), inputs, [dest])
    return dest


def rank_block(block_n: int) -> int:
    """Columns per counting step: a [block_n, BLOCK_R] compare tile of <= 16K elements stays in
    registers (8 warps: 64 per thread; at 2048 x 32, ptxas spilled ~3 KB per thread)."""
    return max(2, min(32, 16384 // block_n))


def row_tiles(tokens: int, channels: int) -> dict:
    """Every token of an image in registers (ranking in BLOCK_R column steps) and 32 x 32 cosine tiles (tl.dot needs >= 16)."""
    block_n = max(16, triton.next_power_of_2(tokens))
    return {"BLOCK_N": block_n, "BLOCK_R": rank_block(block_n), "BLOCK_I": 32, "BLOCK_J": 32, "BLOCK_D": 32 if channels >= 32 else 16}


def row_warps(block_n: int) -> int:
    return 4 if block_n <= 256 else 8


# ---- @triton.jit helpers --------------------------------------------------------------------


@triton.jit
def unit_rows(metric_ptr, row0, tok, ok, D, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    """1 / ||metric[tok]|| for a block of token rows (fp32); 1 for a zero-length row, which so stays zero: its cosine
    to every token is 0, not 0 * inf = NaN (the tie rule, ``deploytk.ops.ties``)."""
    sq = tl.zeros((ROWS,), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        v = tl.load(metric_ptr + (row0 + tok[:, None]) * D + d[None, :], mask=ok[:, None] & (d[None, :] < D), other=0.0).to(tl.float32)
        sq += tl.sum(v * v, axis=1)
    # padding and zero rows: 1, not inf (padding scores are masked). IEEE-rounded sqrt and division (a compiled
    # plain sqrt and / are the GPU's approximations); the sums' order still differs from the
    # reference's, so cosines can differ by an ulp or so and only near-ties can flip -- what
    # selftest's tie checks accept, and no more.
    return tl.div_rn(1.0, tl.sqrt_rn(tl.where(ok & (sq > 0.0), sq, 1.0)))


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
