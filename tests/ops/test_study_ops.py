"""KMedoidsSelect, DPCKNNAssign and ATSSample: ONNX bodies vs torch, hand-worked cases, bad input."""

import numpy as np
import pytest
import torch
from onnx import TensorProto
from test_reduction_ops import run_node

from deploytk.errors import DeploytkError
from deploytk.merging.distances import pairwise_distances
from deploytk.ops.ats_sample.reference import ats_steps

ops = torch.ops.deploytk


def line_distances(points: list[float]) -> torch.Tensor:
    """[1, M, M] |x_i - x_j| of points on a line (exact, no rounding near the decisions below)."""
    x = torch.tensor(points, dtype=torch.float64)
    return (x[:, None] - x[None, :]).abs().float()[None]


@pytest.mark.parametrize("b,m,c,k", [(2, 196, 64, 137), (3, 50, 16, 10), (1, 20, 8, 5), (2, 30, 8, 30)])
def test_clustering_bodies_equal_torch(b, m, c, k):
    g = torch.Generator().manual_seed(m)
    x = torch.randn(b, m, c, generator=g)
    dist, weight = pairwise_distances(x), torch.rand(b, m, generator=g)
    for iterations in (0, 1, 3):
        got = run_node(
            "KMedoidsSelect", {"dist": dist.numpy(), "weight": weight.numpy()}, TensorProto.INT64, 2, clusters=k, iterations=iterations
        )
        np.testing.assert_array_equal(got, ops.kmedoids_select(dist, weight, k, iterations).numpy())
    for neighbors in (1, 5):
        scaled = dist / c**0.5
        got = run_node("DPCKNNAssign", {"dist": scaled.numpy()}, TensorProto.INT64, 2, clusters=k, neighbors=neighbors)
        np.testing.assert_array_equal(got, ops.dpcknn_assign(scaled, k, neighbors).numpy())


def test_kmedoids_hand_case_moves_a_medoid_to_the_other_group():
    # A = 0, 0.1, 0.2 (weights 5, 4, 3) and B = 10, 10.1, 10.2 (weights 1). The first medoids are the two
    # heaviest tokens, both in A; B joins token 1's cluster, whose cheapest member (w * summed distance:
    # token 3, 1 * 30.0, against 4 * 30.2 and 3 * 30.0) becomes its medoid; then A's medoid settles on token 2.
    dist = line_distances([0, 0.1, 0.2, 10, 10.1, 10.2])
    weight = torch.tensor([[5.0, 4.0, 3.0, 1.0, 1.0, 1.0]])
    assert ops.kmedoids_select(dist, weight, 2, 0).tolist() == [[0, 1, 2, 2, 2, 2]]
    assert ops.kmedoids_select(dist, weight, 2, 1).tolist() == [[0, 2, 2, 1, 2, 2]]
    assert ops.kmedoids_select(dist, weight, 2, 3).tolist() == [[2, 2, 0, 1, 2, 2]]


def test_dpcknn_hand_case_centres_by_density_peak_and_ties_by_index():
    # 2 neighbours (itself included): tokens 3 and 4 (10, 10.02) are the densest, equally; neither is
    # strictly denser, so both take the largest distance (10.5) as peak and tie on score: token 3 first,
    # then token 4. Token 0 (A's densest, peak 10 to token 3) comes third; the rest have small peaks.
    dist = line_distances([0, 0.1, 0.3, 10, 10.02, 10.5])
    assert ops.dpcknn_assign(dist, 2, 2).tolist() == [[0, 0, 0, 0, 1, 1]]  # A is nearer to 10 than to 10.02
    assert ops.dpcknn_assign(dist, 3, 2).tolist() == [[2, 2, 2, 0, 1, 1]]  # A gets its own centre


@pytest.mark.parametrize("b,m,count", [(2, 196, 138), (3, 50, 26), (1, 20, 21), (2, 30, 2)])
def test_ats_body_equals_torch(b, m, count):
    g = torch.Generator().manual_seed(m)
    scores = torch.rand(b, m, generator=g) * (torch.rand(b, m, generator=g) > 0.2)
    size = torch.ones(b, m, 1)
    size[0, m - m // 5 :] = 0  # empty slots at the end
    steps = ats_steps(count)
    got = run_node("ATSSample", {"scores": scores.numpy(), "size": size.numpy(), "steps": steps.numpy()}, TensorProto.INT64, 2)
    np.testing.assert_array_equal(got, ops.ats_sample(scores, size, steps).numpy())


def test_ats_hand_case_duplicates_leave_an_empty_slot():
    # scores 1, 1, 1, 1 -> CDF 0.25, 0.5, 0.75, 1.0: steps 0.1 and 0.55 pick tokens 0 and 1 (0.5 is nearer
    # 0.55 than 0.75), 0.5 picks token 1 again: 2 tokens in 3 slots, slot 2 stays empty
    scores, size = torch.ones(1, 4), torch.ones(1, 4, 1)
    assert ops.ats_sample(scores, size, torch.tensor([0.1, 0.5, 0.55])).tolist() == [[0, 1, 3, 3]]
    # an empty token (size 0) has CDF + 0.1: 1.1, so step 0.9 picks token 2 (CDF 1.0), not token 3
    scores = torch.tensor([[1.0, 1.0, 2.0, 0.0]])
    size = torch.tensor([[[1.0], [1.0], [1.0], [0.0]]])
    assert ops.ats_sample(scores, size, torch.tensor([0.1, 0.5, 0.9])).tolist() == [[0, 1, 2, 3]]


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: ops.kmedoids_select(torch.rand(2, 5, 4), torch.rand(2, 5), 2, 3), r"dist \[B, M, M\] and weight \[B, M\]"),
        (lambda: ops.kmedoids_select(torch.rand(2, 5, 5), torch.rand(2, 4), 2, 3), r"got dist \(2, 5, 5\), weight \(2, 4\)"),
        (lambda: ops.kmedoids_select(torch.rand(2, 5, 5), torch.rand(2, 5), 6, 3), r"clusters=6 is not allowed for 5 tokens"),
        (lambda: ops.kmedoids_select(torch.rand(2, 5, 5), torch.rand(2, 5), 2, -1), r"iterations=-1 must be >= 0"),
        (lambda: ops.dpcknn_assign(torch.rand(2, 5, 5), 0, 2), r"clusters must be in \[1, 5\]"),
        (lambda: ops.dpcknn_assign(torch.rand(2, 5, 5), 2, 6), r"neighbors=6 must be in \[1, 5\]"),
        (lambda: ops.dpcknn_assign(torch.rand(5, 5), 2, 2), r"expects pairwise distances dist \[B, M, M\]"),
        (lambda: ops.ats_sample(torch.rand(2, 5), torch.ones(2, 4, 1), torch.rand(3)), r"got scores \(2, 5\), size \(2, 4, 1\)"),
        (lambda: ops.ats_sample(torch.rand(2, 5), torch.ones(2, 5, 1), torch.rand(6)), r"6 steps for 5 tokens"),
    ],
)
def test_clustering_ops_reject_bad_input_before_compute(call, message):
    with pytest.raises(DeploytkError, match=message):
        call()


def test_ats_near_tie_accepts_the_other_nearest_cdf_token_only():
    from deploytk.ops.ats_sample.reference import ats_near_tie, ats_sample

    # 4 tokens, CDF 0.25 / 0.5 / 0.75 / 1.0 (less 1e-6 of the normaliser); steps 0.375 and 0.875 lie
    # midway between two CDF values, so either neighbour is the nearest to rounding
    scores, size = torch.tensor([[1.0, 1.0, 1.0, 1.0]]), torch.ones(1, 4, 1)
    steps = torch.tensor([0.375, 0.875])
    want = ats_sample(scores, size, steps)
    assert want.tolist() == [[2, 0, 2, 1]]  # tokens 1 and 3 picked, 0 and 2 dropped (slot 2)
    for other in ([[0, 2, 2, 1]], [[2, 0, 1, 2]], [[0, 2, 1, 2]]):  # token 0 for token 1, 2 for 3, or both
        assert ats_near_tie(scores, size, steps, torch.tensor(other)), other
    assert not ats_near_tie(scores, size, steps, torch.tensor([[0, 1, 2, 2]]))  # token 1 for step 0.875: 0.375 away
    assert not ats_near_tie(scores, size, steps, torch.tensor([[2, 1, 2, 0]]))  # the right tokens, slots out of order
    # 0.4% more score on token 1: token 0 is nearer to step 0.375 by 2.5e-4, far above rounding
    skewed = torch.tensor([[1.0, 1.004, 1.0, 1.0]])
    assert ats_sample(skewed, size, steps).tolist() == [[0, 2, 1, 2]]
    assert not ats_near_tie(skewed, size, steps, torch.tensor([[2, 0, 1, 2]]))
