"""Triton kernel of ``DPCKNNAssign``: one program per image, in four phases separated by barriers.

The image's ``dest`` row (M int64 = 2M 32-bit slots) is the workspace, as in CrucialMatch:
1. each token's density from its NEIGHBORS smallest distances (a running set per row,
   [BLOCK_I, BLOCK_NB] in registers, fed each column tile's smallest values) into slots
   [0, M); the image's largest distance stays in registers;
2. each token's peak distance (nearest denser token) times its density -> slots [M, 2M);
3. each token's centre slot (its rank by score, -1 beyond the K best) -> slots [0, M);
4. each token's nearest centre (dist[centre, token]; the first centre on ties; a centre
   joins itself) -> slots [M, 2M), then dest, once every thread has read the workspace.

exp and the sums differ from the reference's by rounding, so a choice can differ only at a
near-tie: what selftest's tie rule accepts, and no more.
"""

from __future__ import annotations

import triton
import triton.language as tl

from deploytk.ops.dpcknn_assign import check_dpcknn_args
from deploytk.ops.kernel_common import KernelPlan, launch_matching, matching_grid, rank_descending, row_warps


@triton.jit
def dpcknn_assign_kernel(
    dist_ptr,  # input: dist [B, M, M]
    M,
    K,
    dest_ptr,  # output: dest [B, M] int64
    NEIGHBORS: tl.constexpr,
    BLOCK_NB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    img = tl.program_id(0).to(tl.int64)
    dist = dist_ptr + img * M * M
    floats = (dest_ptr + img * M).to(tl.pointer_type(tl.float32))
    ints = (dest_ptr + img * M).to(tl.pointer_type(tl.int32))
    nb = tl.arange(0, BLOCK_NB)

    # 1. densities, and the largest distance
    row_max = tl.full((BLOCK_I,), float("-inf"), tl.float32)
    for i0 in range(0, M, BLOCK_I):
        ii = i0 + tl.arange(0, BLOCK_I)
        i_ok = ii < M
        # the NEIGHBORS smallest so far; padding columns are -inf so they are never replaced
        near = tl.where(nb[None, :] < NEIGHBORS, float("inf"), float("-inf")) + tl.zeros((BLOCK_I, BLOCK_NB), tl.float32)
        for j0 in range(0, M, BLOCK_J):
            jj = j0 + tl.arange(0, BLOCK_J)
            ok = i_ok[:, None] & (jj[None, :] < M)
            d = tl.load(dist + ii[:, None] * M + jj[None, :], mask=ok, other=float("inf")).to(tl.float32)
            row_max = tl.maximum(row_max, tl.max(tl.where(ok, d, float("-inf")), axis=1))
            for _ in tl.static_range(NEIGHBORS):
                v = tl.min(d, axis=1)
                at = tl.min(tl.where(d == v[:, None], jj[None, :], 2147483647), axis=1)
                d = tl.where(jj[None, :] == at[:, None], float("inf"), d)
                worst = tl.max(near, axis=1)
                worst_at = tl.min(tl.where(near == worst[:, None], nb[None, :], BLOCK_NB), axis=1)
                near = tl.where((nb[None, :] == worst_at[:, None]) & (v < worst)[:, None], v[:, None], near)
        sq = tl.where(nb[None, :] < NEIGHBORS, near * near, 0.0)
        density = tl.exp(-(tl.sum(sq, axis=1) / NEIGHBORS))
        tl.store(floats + ii, density, mask=i_ok)
    dist_max = tl.max(row_max, axis=0)
    tl.debug_barrier()

    # 2. score = distance to the nearest denser token x density
    for i0 in range(0, M, BLOCK_I):
        ii = i0 + tl.arange(0, BLOCK_I)
        i_ok = ii < M
        di = tl.load(floats + ii, mask=i_ok, other=0.0)
        peak = tl.zeros((BLOCK_I,), tl.float32) + dist_max
        for j0 in range(0, M, BLOCK_J):
            jj = j0 + tl.arange(0, BLOCK_J)
            j_ok = jj < M
            dj = tl.load(floats + jj, mask=j_ok, other=float("-inf"))
            d = tl.load(dist + ii[:, None] * M + jj[None, :], mask=i_ok[:, None] & j_ok[None, :], other=0.0).to(tl.float32)
            denser = (dj[None, :] > di[:, None]) & j_ok[None, :]
            peak = tl.minimum(peak, tl.min(tl.where(denser, d, dist_max), axis=1))
        tl.store(floats + M + ii, peak * di, mask=i_ok)
    tl.debug_barrier()

    # 3. centres: the K best scores (ties: lower index), slot = rank
    for i0 in range(0, M, BLOCK_I):
        ii = i0 + tl.arange(0, BLOCK_I)
        i_ok = ii < M
        s = tl.load(floats + M + ii, mask=i_ok, other=float("-inf"))
        rank = rank_descending(floats + M, 0, M, s, ii, BLOCK_J)
        tl.store(ints + ii, tl.where(rank < K, rank, -1), mask=i_ok)
    tl.debug_barrier()

    # 4. nearest centre: dist[centre, token], the smallest slot on ties; a centre joins itself
    for i0 in range(0, M, BLOCK_I):
        ii = i0 + tl.arange(0, BLOCK_I)
        i_ok = ii < M
        best = tl.full((BLOCK_I,), float("inf"), tl.float32)
        best_slot = tl.full((BLOCK_I,), 2147483647, tl.int32)
        for j0 in range(0, M, BLOCK_J):
            jj = j0 + tl.arange(0, BLOCK_J)
            slot = tl.load(ints + jj, mask=jj < M, other=-1)
            centre = slot >= 0
            d = tl.load(dist + jj[None, :] * M + ii[:, None], mask=i_ok[:, None] & centre[None, :], other=float("inf")).to(tl.float32)
            d = tl.where(centre[None, :], d, float("inf"))
            tile_best = tl.min(d, axis=1)
            tile_slot = tl.min(tl.where((d == tile_best[:, None]) & centre[None, :], slot[None, :], 2147483647), axis=1)
            better = (tile_best < best) | ((tile_best == best) & (tile_slot < best_slot))
            best = tl.where(better, tile_best, best)
            best_slot = tl.where(better, tile_slot, best_slot)
        own = tl.load(ints + ii, mask=i_ok, other=-1)
        tl.store(ints + M + ii, tl.where(own >= 0, own, best_slot), mask=i_ok)
    tl.debug_barrier()

    i = tl.arange(0, BLOCK_M)
    assign = tl.load(ints + M + i, mask=i < M, other=0)
    tl.debug_barrier()  # every thread has read the workspace before it is overwritten
    tl.store(dest_ptr + img * M + i, assign.to(tl.int64), mask=i < M)


def plan(shapes: list, attrs: dict, dtype: str) -> KernelPlan:
    """dist [B, M, M]; attributes clusters, neighbors."""
    batch, tokens = shapes[0][:2]
    neighbors = int(attrs["neighbors"])
    block_m = max(16, triton.next_power_of_2(tokens))
    cfg = {"NEIGHBORS": neighbors, "BLOCK_NB": max(2, triton.next_power_of_2(neighbors)), "BLOCK_M": block_m, "BLOCK_I": 32, "BLOCK_J": 32}
    return KernelPlan(dpcknn_assign_kernel, cfg, [tokens, int(attrs["clusters"])], matching_grid(batch), row_warps(block_m))


def launch(dist, clusters: int, neighbors: int):
    """The CUDA implementation of ``deploytk::dpcknn_assign``."""
    check_dpcknn_args(dist, clusters, neighbors)
    return launch_matching("dpcknn_assign", plan, [dist], {"clusters": clusters, "neighbors": neighbors})
