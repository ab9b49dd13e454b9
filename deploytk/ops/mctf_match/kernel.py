"""Triton kernel of ``MctfMatch``: MCTF's multi-criteria bipartite matching -> dest [B, N].

A = even tokens, B = odd tokens; score(a, b) = W_sim * W_info * W_size as in
``reference.mctf_scores`` (x^(1/tau) as exp2(log2(x) / tau), exactly x for tau = 1; a
criterion with tau = 0 is off), protected A rows and B columns -inf. One program per image, no sort, no atomics:

1. each A token's best B partner (first index on ties);
2. A ranks in (best desc, index asc) order by counting; the first r1 are sources; unmerged
   A slots by rank (no protected tokens) or by prefix sum (protected: original order);
3. bidirectional: each B token's best unmerged A partner, scored by the same A x B tiles
   reduced along the other axis (so the scores are bit-identical to pass 1's); B ranks by
   counting; the first r2 merge into their partner's slot, the rest follow the unmerged A
   tokens. Without it, B tokens keep their order after the unmerged A tokens;
4. sources take their partner's slot; the protected tokens' slots move to the front
   (``reference_common.prefix_first``); dest is written after a barrier.

Scratch lives in the image's own ``dest`` row (N int64 = 2N int32, na = ceil(N/2), nb = N/2):
[0, na) best score, then A slot (-1 for a source); [na, 2na) best B partner; [2na, 2na+nb)
B's best score, then B slot; [2na+nb, 2N) B's partner.
"""

from __future__ import annotations

import triton
import triton.language as tl

from deploytk.ops.checks import check_match_args
from deploytk.ops.kernel_common import (
    KernelPlan,
    cosine_tile,
    launch_matching,
    matching_grid,
    rank_block,
    rank_descending,
    running_argmax,
    unit_rows,
)


@triton.jit
def _power(x, E: tl.constexpr):
    """x ** E for x in [0, 1] (0 ** E = 0); x itself for E = 1 (MCTF's default tau_sim), where
    the fast exp2/log2 of a compiled kernel would add a few ulp the reference does not have."""
    if E == 1.0:
        y = x
    else:
        y = tl.exp2(tl.log2(x) * E)
    return y


@triton.jit
def _reciprocal(x, scale):
    """(1 / x) / scale with IEEE rounding, as the reference computes info and 1/size (a compiled
    plain / is the GPU's approximation)."""
    return tl.div_rn(tl.div_rn(1.0, x), scale)


@triton.jit
def _scores_tile(
    metric_ptr,
    recv_ptr,
    size_ptr,
    row0,
    a,
    a_ok,
    inv_a,
    bb,
    b_ok,
    inv_b,
    D,
    PA,
    PB,
    info_max,
    inv_max,
    E_SIM: tl.constexpr,
    E_INFO: tl.constexpr,
    E_SIZE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
):
    """MCTF scores of A tokens ``a`` (token 2a) x B tokens ``bb`` (token 2bb+1); -inf where blocked or out of range."""
    cos = cosine_tile(metric_ptr, row0, 2 * a, a_ok, inv_a, 2 * bb + 1, b_ok, inv_b, D, BLOCK_D, ROWS, COLS)
    w = tl.full((ROWS, COLS), 1.0, tl.float32)
    if E_SIM > 0:
        w = _power((cos + 1.0) * 0.5, E_SIM)
    if E_INFO > 0:
        info_a = _reciprocal(tl.load(recv_ptr + row0 + 2 * a, mask=a_ok, other=1.0).to(tl.float32), info_max)
        info_b = _reciprocal(tl.load(recv_ptr + row0 + 2 * bb + 1, mask=b_ok, other=1.0).to(tl.float32), info_max)
        w = w * _power(info_a[:, None] * info_b[None, :], E_INFO)
    if E_SIZE > 0:
        small_a = _reciprocal(tl.load(size_ptr + row0 + 2 * a, mask=a_ok, other=1.0).to(tl.float32), inv_max)
        small_b = _reciprocal(tl.load(size_ptr + row0 + 2 * bb + 1, mask=b_ok, other=1.0).to(tl.float32), inv_max)
        w = w * _power(small_a[:, None] * small_b[None, :], E_SIZE)
    allowed = (a_ok & (a >= PA))[:, None] & (b_ok & (bb >= PB))[None, :]
    return tl.where(allowed, w, float("-inf"))


@triton.jit
def mctf_match_kernel(
    metric_ptr,
    recv_ptr,
    size_ptr,  # inputs: metric [B, N, D], received [B, N], size [B, N, 1]
    N,
    D,
    R,
    PROTECTED,
    dest_ptr,  # output: dest [B, N] int64
    E_SIM: tl.constexpr,
    E_INFO: tl.constexpr,
    E_SIZE: tl.constexpr,
    BIDIRECTION: tl.constexpr,
    BLOCK_A: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    row0 = tl.program_id(0).to(tl.int64) * N
    na = (N + 1) // 2
    nb = N // 2
    pa = (PROTECTED + 1) // 2
    pb = PROTECTED // 2
    if BIDIRECTION:
        r1 = R // 2
    else:
        r1 = R
    r2 = R - r1
    n_unm = na - r1
    words = (dest_ptr + row0).to(tl.pointer_type(tl.int32))
    floats = (dest_ptr + row0).to(tl.pointer_type(tl.float32))

    # max-normalisers of 1/received and 1/size over the image
    info_max = float("-inf")
    inv_max = float("-inf")
    for t0 in range(0, N, BLOCK_J):
        t = t0 + tl.arange(0, BLOCK_J)
        t_ok = t < N
        info_max = tl.maximum(
            info_max,
            tl.max(
                tl.where(t_ok, _reciprocal(tl.load(recv_ptr + row0 + t, mask=t_ok, other=1.0).to(tl.float32), 1.0), float("-inf")), axis=0
            ),
        )
        inv_max = tl.maximum(
            inv_max,
            tl.max(
                tl.where(t_ok, _reciprocal(tl.load(size_ptr + row0 + t, mask=t_ok, other=1.0).to(tl.float32), 1.0), float("-inf")), axis=0
            ),
        )

    # 1. best B partner of every A token
    for i0 in range(0, na, BLOCK_I):
        a = i0 + tl.arange(0, BLOCK_I)
        a_ok = a < na
        inv_a = unit_rows(metric_ptr, row0, 2 * a, a_ok, D, BLOCK_D, BLOCK_I)
        best = tl.full((BLOCK_I,), float("-inf"), tl.float32)
        best_idx = tl.zeros((BLOCK_I,), dtype=tl.int32)
        for j0 in range(0, nb, BLOCK_B):
            bb = j0 + tl.arange(0, BLOCK_B)
            b_ok = bb < nb
            inv_b = unit_rows(metric_ptr, row0, 2 * bb + 1, b_ok, D, BLOCK_D, BLOCK_B)
            s = _scores_tile(
                metric_ptr,
                recv_ptr,
                size_ptr,
                row0,
                a,
                a_ok,
                inv_a,
                bb,
                b_ok,
                inv_b,
                D,
                pa,
                pb,
                info_max,
                inv_max,
                E_SIM,
                E_INFO,
                E_SIZE,
                BLOCK_D,
                BLOCK_I,
                BLOCK_B,
            )
            best, best_idx = running_argmax(s, bb, best, best_idx)
        tl.store(floats + a, best, mask=a_ok)
        tl.store(words + na + a, best_idx, mask=a_ok)
    tl.debug_barrier()

    # 2. sources and unmerged A slots
    ia = tl.arange(0, BLOCK_A)
    a_ok = ia < na
    node_max = tl.load(floats + ia, mask=a_ok, other=float("-inf"))
    node_idx = tl.load(words + na + ia, mask=a_ok, other=0)
    rank_a = rank_descending(floats, 0, na, node_max, ia, BLOCK_R)
    is_src = rank_a < r1
    in_order = tl.cumsum((a_ok & ~is_src).to(tl.int32), axis=0) - 1
    slot_unm = tl.where(PROTECTED > 0, in_order, rank_a - r1)  # protected tokens: original order; else by score
    tl.debug_barrier()
    tl.store(words + ia, tl.where(is_src, -1, slot_unm), mask=a_ok)
    tl.debug_barrier()

    # 3. B slots
    jb = tl.arange(0, BLOCK_A)
    b_ok = jb < nb
    if BIDIRECTION:
        for j0 in range(0, nb, BLOCK_B):
            bb = j0 + tl.arange(0, BLOCK_B)
            bb_ok = bb < nb
            inv_b = unit_rows(metric_ptr, row0, 2 * bb + 1, bb_ok, D, BLOCK_D, BLOCK_B)
            best = tl.full((BLOCK_B,), float("-inf"), tl.float32)
            best_idx = tl.zeros((BLOCK_B,), dtype=tl.int32)
            for i0 in range(0, na, BLOCK_I):
                a = i0 + tl.arange(0, BLOCK_I)
                aa_ok = a < na
                inv_a = unit_rows(metric_ptr, row0, 2 * a, aa_ok, D, BLOCK_D, BLOCK_I)
                s = _scores_tile(
                    metric_ptr,
                    recv_ptr,
                    size_ptr,
                    row0,
                    a,
                    aa_ok,
                    inv_a,
                    bb,
                    bb_ok,
                    inv_b,
                    D,
                    pa,
                    pb,
                    info_max,
                    inv_max,
                    E_SIM,
                    E_INFO,
                    E_SIZE,
                    BLOCK_D,
                    BLOCK_I,
                    BLOCK_B,
                )
                source = tl.load(words + a, mask=aa_ok, other=-1) < 0
                s = tl.where(source[:, None], float("-inf"), s)  # B merges into unmerged A tokens only
                best, best_idx = running_argmax(tl.trans(s), a, best, best_idx)  # along A: the same tiles, transposed
            tl.store(floats + 2 * na + bb, best, mask=bb_ok)
            tl.store(words + 2 * na + nb + bb, best_idx, mask=bb_ok)
        tl.debug_barrier()
        node_max_b = tl.load(floats + 2 * na + jb, mask=b_ok, other=float("-inf"))
        partner = tl.load(words + 2 * na + nb + jb, mask=b_ok, other=0)
        rank_b = rank_descending(floats + 2 * na, 0, nb, node_max_b, jb, BLOCK_R)
        partner_slot = tl.load(words + partner, mask=b_ok & (rank_b < r2), other=0)
        slot_b = tl.where(rank_b < r2, partner_slot, n_unm + rank_b - r2)
        tl.debug_barrier()
    else:
        slot_b = n_unm + jb
    tl.store(words + 2 * na + jb, slot_b, mask=b_ok)
    tl.debug_barrier()

    # 4. sources take their partner's slot; protected slots first
    slot_a = tl.where(is_src, tl.load(words + 2 * na + node_idx, mask=a_ok & is_src, other=0), slot_unm)
    first_a = tl.full((BLOCK_A,), -1, tl.int32)
    first_b = tl.full((BLOCK_A,), -1, tl.int32)
    less_a = tl.zeros((BLOCK_A,), dtype=tl.int32)
    less_b = tl.zeros((BLOCK_A,), dtype=tl.int32)
    for q in range(0, PROTECTED):  # protected tokens are never merged: their slots are distinct
        slot_q = tl.load(words + (q % 2) * 2 * na + q // 2)
        first_a = tl.where(slot_a == slot_q, q, first_a)
        first_b = tl.where(slot_b == slot_q, q, first_b)
        less_a += (slot_q < slot_a).to(tl.int32)
        less_b += (slot_q < slot_b).to(tl.int32)
    dest_a = tl.where(first_a >= 0, first_a, PROTECTED + slot_a - less_a)
    dest_b = tl.where(first_b >= 0, first_b, PROTECTED + slot_b - less_b)
    tl.debug_barrier()  # every thread has read the scratch before it is overwritten
    tl.store(dest_ptr + row0 + 2 * ia, dest_a.to(tl.int64), mask=a_ok)
    tl.store(dest_ptr + row0 + 2 * jb + 1, dest_b.to(tl.int64), mask=b_ok)


def exponent(tau: float) -> float:
    """1/tau, or 0 (the criterion is off) for tau <= 0, as the ONNX body decides."""
    return 1.0 / tau if tau > 0 else 0.0


def config(tokens: int, channels: int) -> dict:
    block_a = max(16, triton.next_power_of_2((tokens + 1) // 2))
    return {
        "BLOCK_A": block_a,
        "BLOCK_I": 32,
        "BLOCK_B": 32,
        "BLOCK_D": 32 if channels >= 32 else 16,
        "BLOCK_J": 32,
        "BLOCK_R": rank_block(block_a),
    }


def constants(tokens: int, channels: int, tau_sim: float, tau_info: float, tau_size: float, bidirection: bool) -> dict:
    """Every compile-time constant of one kernel variant (the torch launcher and the AOT plugin alike)."""
    return {
        "E_SIM": exponent(tau_sim),
        "E_INFO": exponent(tau_info),
        "E_SIZE": exponent(tau_size),
        "BIDIRECTION": bool(bidirection),
        **config(tokens, channels),
    }


def num_warps(cfg: dict) -> int:
    return 4 if cfg["BLOCK_A"] <= 128 else 8


def plan(shapes: list, attrs: dict, dtype: str) -> KernelPlan:
    """metric [B, N, D], received [B, N], size [B, N, 1]; attributes r, protected, the taus (compile-time
    exponents, as the attention scale: AOT plugin scalars are ints) and bidirection."""
    batch, tokens, channels = shapes[0]
    taus = (float(attrs[k]) for k in ("tau_sim", "tau_info", "tau_size"))
    cfg = constants(tokens, channels, *taus, bool(attrs["bidirection"]))
    ints = [tokens, channels, int(attrs["r"]), int(attrs["protected"])]
    return KernelPlan(mctf_match_kernel, cfg, ints, matching_grid(batch), num_warps(cfg))


def launch(metric, received, size, r: int, protected: int, tau_sim: float, tau_info: float, tau_size: float, bidirection: bool):
    """The CUDA implementation of ``deploytk::mctf_match``."""
    check_match_args("mctf_match", metric, {"received": received, "size": size}, r, protected)
    attrs = {"r": r, "protected": protected, "tau_sim": tau_sim, "tau_info": tau_info, "tau_size": tau_size, "bidirection": bidirection}
    return launch_matching("mctf_match", plan, [metric, received, size], attrs)
