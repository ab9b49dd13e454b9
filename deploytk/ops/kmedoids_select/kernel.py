"""Triton kernel of ``KMedoidsSelect``: one program per image, the medoids in registers.

No workspace: the medoids ([BLOCK_K] token indices) live in registers across the
iterations. Each iteration walks the tokens in blocks of BLOCK_I: their cost
w_i * sum_j dist[i, j] (row sums over BLOCK_J column tiles), their nearest medoid (a gather
of dist[i, medoid_k]; the first medoid on ties) and, per cluster, the running member of
smallest cost (an earlier block keeps a tie, so the first index wins; a cluster without
members keeps token 0, as the reference). dest is written once, at the end.

Costs are summed in another order than the reference's, so a medoid can differ only where
two members' costs agree to rounding: what selftest's tie rule accepts, and no more.
"""

from __future__ import annotations

import triton
import triton.language as tl

from deploytk.ops.kernel_common import KernelPlan, launch_matching, matching_grid, rank_descending, row_warps
from deploytk.ops.kmedoids_select import check_kmedoids_args


@triton.jit
def kmedoids_select_kernel(
    dist_ptr,
    weight_ptr,  # inputs: dist [B, M, M], weight [B, M]
    M,
    K,
    ITERATIONS,
    dest_ptr,  # output: dest [B, M] int64
    BLOCK_K: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    img = tl.program_id(0).to(tl.int64)
    dist = dist_ptr + img * M * M
    weight = weight_ptr + img * M
    k = tl.arange(0, BLOCK_K)
    k_ok = k < K

    # the first medoids: the K tokens of largest weight (rank in (weight desc, index asc) order)
    medoid = tl.zeros((BLOCK_K,), dtype=tl.int32)
    for i0 in range(0, M, BLOCK_I):
        ii = i0 + tl.arange(0, BLOCK_I)
        i_ok = ii < M
        w = tl.load(weight + ii, mask=i_ok, other=float("-inf")).to(tl.float32)
        rank = rank_descending(weight, 0, M, w, ii, BLOCK_J)
        hit = (rank[None, :] == k[:, None]) & i_ok[None, :]
        medoid += tl.sum(tl.where(hit, ii[None, :], 0), axis=1)

    for _ in range(ITERATIONS):
        best = tl.full((BLOCK_K,), float("inf"), tl.float32)
        best_idx = tl.zeros((BLOCK_K,), dtype=tl.int32)
        for i0 in range(0, M, BLOCK_I):
            ii = i0 + tl.arange(0, BLOCK_I)
            i_ok = ii < M
            w = tl.load(weight + ii, mask=i_ok, other=0.0).to(tl.float32)
            cost = tl.zeros((BLOCK_I,), dtype=tl.float32)
            for j0 in range(0, M, BLOCK_J):
                jj = j0 + tl.arange(0, BLOCK_J)
                d = tl.load(dist + ii[:, None] * M + jj[None, :], mask=i_ok[:, None] & (jj[None, :] < M), other=0.0).to(tl.float32)
                cost += tl.sum(d * w[:, None], axis=1)
            to_medoid = tl.load(dist + ii[:, None] * M + medoid[None, :], mask=i_ok[:, None] & k_ok[None, :], other=float("inf"))
            to_medoid = to_medoid.to(tl.float32)
            nearest = tl.min(to_medoid, axis=1)
            cluster = tl.min(tl.where(to_medoid == nearest[:, None], k[None, :], BLOCK_K), axis=1)
            member_cost = tl.where((cluster[:, None] == k[None, :]) & i_ok[:, None], cost[:, None], float("inf"))  # [BLOCK_I, BLOCK_K]
            block_best = tl.min(member_cost, axis=0)
            block_idx = tl.min(tl.where(member_cost == block_best[None, :], ii[:, None], 2147483647), axis=0)
            better = block_best < best
            best = tl.where(better, block_best, best)
            best_idx = tl.where(better, block_idx, best_idx)
        medoid = best_idx

    for i0 in range(0, M, BLOCK_I):
        ii = i0 + tl.arange(0, BLOCK_I)
        hit = (medoid[None, :] == ii[:, None]) & k_ok[None, :]
        slot = tl.min(tl.where(hit, k[None, :], BLOCK_K), axis=1)  # a medoid of two clusters: the first
        dest = tl.where(slot < BLOCK_K, slot, K)
        tl.store(dest_ptr + img * M + ii, dest.to(tl.int64), mask=ii < M)


def plan(shapes: list, attrs: dict, dtype: str) -> KernelPlan:
    """dist [B, M, M], weight [B, M]; attributes clusters, iterations."""
    batch, tokens = shapes[1][:2]
    clusters = int(attrs["clusters"])
    block_k = max(16, triton.next_power_of_2(clusters))
    cfg = {"BLOCK_K": block_k, "BLOCK_I": 32, "BLOCK_J": 32}
    ints = [tokens, clusters, int(attrs["iterations"])]
    return KernelPlan(kmedoids_select_kernel, cfg, ints, matching_grid(batch), row_warps(block_k))


def launch(dist, weight, clusters: int, iterations: int):
    """The CUDA implementation of ``deploytk::kmedoids_select``."""
    check_kmedoids_args(dist, weight, clusters, iterations)
    return launch_matching("kmedoids_select", plan, [dist, weight], {"clusters": clusters, "iterations": iterations})
