"""``deploytk.ToMeMatch``: ToMe's bipartite soft matching.

Input: metric [B, N, D] (keys averaged over heads). Attributes: r (tokens removed, already
capped), protected (leading tokens that never merge away), sort_unmerged, tokens (the static
N). Output: dest [B, N] int64, the output slot of each token in ToMe's order
(``reference.tome_dest``). The size-weighted merge is ``TokenAggregate``:
x' = aggregate(x, size, dest, N-r, normalize), size' = aggregate(size, 1, dest, N-r).
Matching and merge are separate ops because a TensorRT AOT plugin launches exactly one kernel.
"""

from __future__ import annotations

import torch

from deploytk.ops.checks import check_match_args
from deploytk.ops.flop_rules import alternation_scores_flops
from deploytk.ops.reference_common import protected_split, unit_rows
from deploytk.ops.spec import INT64, OpSpec, SelftestPlan, floats
from deploytk.ops.tome_match.onnx_function import ToMeMatch
from deploytk.ops.tome_match.reference import tome_dest as reference
from deploytk.ops.tome_match.reference import tome_slots


@torch.library.custom_op("deploytk::tome_match", mutates_args=())
def tome_match(metric: torch.Tensor, r: int, protected: int, sort_unmerged: bool) -> torch.Tensor:
    check_match_args("tome_match", metric, {}, r, protected)
    return reference(metric, r, protected, sort_unmerged)


@tome_match.register_fake
def _tome_match_fake(metric, r, protected, sort_unmerged):
    return metric.new_empty(metric.shape[:2], dtype=torch.int64)


def translate(metric, r: int, protected: int, sort_unmerged: bool):
    """torch.onnx translation: one ToMeMatch node; the static token count becomes an attribute."""
    return ToMeMatch(metric, r=r, protected=protected, sort_unmerged=int(sort_unmerged), tokens=int(metric.shape[1]))


def tome_near_ties(metric: torch.Tensor, got: torch.Tensor, r: int, protected: int, sort_unmerged: bool, tol: float = 1e-5) -> int | None:
    """How many images' ``got`` differ from the reference but are ToMe matchings in float64 up to ``tol`` ties.

    A valid matching: B tokens in their slots; exactly r A tokens (unprotected) merge, each into
    a B token scoring within ``tol`` of its row's best; no unmerged A token beats a merged one by
    more than ``tol``; unmerged tokens in index order (``sort_unmerged``) or by descending
    score within ``tol``. Returns None if an image is not valid (a real error).
    """
    want = reference(metric.float(), r, protected, sort_unmerged)
    b, n, _ = metric.shape
    na, nb = (n + 1) // 2, n // 2
    pa, pb = protected_split(protected)
    unm_slot, b_slot = tome_slots(na, nb, r, protected)
    j_of_slot, k_of_slot = {s: j for j, s in enumerate(b_slot)}, {s: k for k, s in enumerate(unm_slot)}
    m = unit_rows(metric.double())
    scores = m[:, ::2] @ m[:, 1::2].transpose(-1, -2)
    scores[:, :pa], scores[:, :, :pb] = -float("inf"), -float("inf")
    best = scores.max(-1).values
    ties = 0
    for i in range(b):
        if torch.equal(got[i], want[i]):
            continue
        da, db = got[i, ::2].tolist(), got[i, 1::2].tolist()
        src = [a for a in range(na) if da[a] in j_of_slot]
        unm = sorted((a for a in range(na) if da[a] in k_of_slot), key=lambda a: k_of_slot[da[a]])
        if db != b_slot or len(src) != r or len(unm) != na - r or [k_of_slot[da[a]] for a in unm] != list(range(na - r)):
            return None
        if any(a < pa or scores[i, a, j_of_slot[da[a]]] < best[i, a] - tol for a in src):
            return None
        if unm and src and max((best[i, a] for a in unm if a >= pa), default=-float("inf")) > min(best[i, a] for a in src) + tol:
            return None
        later_best = best[i, unm].flip(0).cummax(0).values.flip(0)  # descending within tol: each beats every later one
        order_ok = unm == sorted(unm) if sort_unmerged else bool((best[i, unm][:-1] >= later_best[1:] - tol).all())
        if not order_ok:
            return None
        ties += 1
    return ties


def near_tie(metric: torch.Tensor, r: int, protected: int, sort_unmerged: bool, dest: torch.Tensor) -> bool:
    """``OpSpec.near_tie``: is ``dest`` [1, N] a ToMe matching of ``metric`` [1, N, D] up to ties (``tome_near_ties``)?"""
    return tome_near_ties(metric, dest, r, protected, sort_unmerged) is not None


def _selftest_calls(draw: dict) -> list:
    args = [draw["metric"], draw["r"], draw["protected"]]
    return [([*args, sort_unmerged], {**draw["shape"], "sort_unmerged": sort_unmerged}) for sort_unmerged in (True, False)]


def _selftest_ties(reference, args: list, got: torch.Tensor) -> int | None:
    return tome_near_ties(*args[:1], got, *args[1:])


SPEC = OpSpec(
    name="ToMeMatch",
    torch_op=tome_match,
    onnx_function=ToMeMatch,
    translation=translate,
    reference=reference,
    inputs=(floats("B N D"),),
    output=INT64,
    output_shape=lambda shapes, attrs: list(shapes[0][:2]),
    flops=alternation_scores_flops,
    kernel="deploytk.ops.tome_match.kernel",
    selftest=SelftestPlan("tome", _selftest_calls, _selftest_ties),
    matching=True,
    near_tie=near_tie,
)
