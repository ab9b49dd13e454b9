"""``deploytk.KMedoidsSelect``: the K-Medoids token clustering of "Which Tokens to Use?" (Haurum et al., 2023).

KMedoidsSelect(dist [B, M, M], weight [B, M]; clusters, iterations) -> dest [B, M]: the
medoid of cluster k -> slot k, every other token -> slot ``clusters`` (dropped). ``dist``
holds the candidate tokens' pairwise distances (computed in standard ops before the node),
``weight`` their token weights (the attention each token received in the previous block).
"""

from __future__ import annotations

import torch

from deploytk.errors import DeploytkError
from deploytk.ops.checks import check_cluster_args
from deploytk.ops.flop_rules import no_flops
from deploytk.ops.kmedoids_select.onnx_function import KMedoidsSelect
from deploytk.ops.kmedoids_select.reference import kmedoids_select as reference
from deploytk.ops.spec import INT64, OpSpec, SelftestPlan, distances, floats
from deploytk.ops.ties import ties_when_perturbed


def check_kmedoids_args(dist, weight, clusters: int, iterations: int) -> None:
    check_cluster_args("kmedoids_select", dist, clusters, weight)
    if iterations < 0:
        raise DeploytkError(f"kmedoids_select: iterations={iterations} must be >= 0.")


@torch.library.custom_op("deploytk::kmedoids_select", mutates_args=())
def kmedoids_select(dist: torch.Tensor, weight: torch.Tensor, clusters: int, iterations: int) -> torch.Tensor:
    check_kmedoids_args(dist, weight, clusters, iterations)
    return reference(dist, weight, clusters, iterations)


@kmedoids_select.register_fake
def _kmedoids_select_fake(dist, weight, clusters, iterations):
    return weight.new_empty(weight.shape, dtype=torch.int64)


def translate(dist, weight, clusters: int, iterations: int):
    return KMedoidsSelect(dist, weight, clusters=clusters, iterations=iterations)


def _selftest_calls(draw: dict) -> list:
    return [
        (
            [draw["dist"], draw["weight"], draw["clusters"], iterations],
            {**draw["shape"], "clusters": draw["clusters"], "iterations": iterations},
        )
        for iterations in (0, 3)
    ]


SPEC = OpSpec(
    name="KMedoidsSelect",
    torch_op=kmedoids_select,
    onnx_function=KMedoidsSelect,
    translation=translate,
    reference=reference,
    inputs=(distances("B M M"), floats("B M")),
    output=INT64,
    output_shape=lambda shapes, attrs: list(shapes[1][:2]),
    flops=no_flops,  # comparisons and sums; the distances are matmuls fvcore counts before the node
    kernel="deploytk.ops.kmedoids_select.kernel",
    selftest=SelftestPlan("clustering", _selftest_calls, ties_when_perturbed(0)),
    matching=True,
    drops_tokens=True,
    dest_covers_patches_only=True,
)
