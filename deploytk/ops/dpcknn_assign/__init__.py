"""``deploytk.DPCKNNAssign``: the DPC-KNN token clustering of "Which Tokens to Use?" (after TCFormer).

DPCKNNAssign(dist [B, M, M]; clusters, neighbors) -> dest [B, M]: each candidate token's
cluster in [0, clusters); ``TokenAggregate`` (normalize) then averages each cluster.
``dist`` holds the tokens' pairwise distances, computed in standard ops before the node.
"""

from __future__ import annotations

import torch

from deploytk.errors import DeploytkError
from deploytk.ops.checks import check_cluster_args
from deploytk.ops.dpcknn_assign.onnx_function import DPCKNNAssign
from deploytk.ops.dpcknn_assign.reference import dpcknn_assign as reference
from deploytk.ops.flop_rules import no_flops
from deploytk.ops.spec import INT64, OpSpec, SelftestPlan, distances
from deploytk.ops.ties import ties_when_perturbed

#: the kernel keeps each token's nearest distances in registers
MAX_NEIGHBORS = 64


def check_dpcknn_args(dist, clusters: int, neighbors: int) -> None:
    check_cluster_args("dpcknn_assign", dist, clusters)
    m = dist.shape[1]
    if not 1 <= neighbors <= min(m, MAX_NEIGHBORS):
        raise DeploytkError(f"dpcknn_assign: neighbors={neighbors} must be in [1, {min(m, MAX_NEIGHBORS)}] for {m} tokens.")


@torch.library.custom_op("deploytk::dpcknn_assign", mutates_args=())
def dpcknn_assign(dist: torch.Tensor, clusters: int, neighbors: int) -> torch.Tensor:
    check_dpcknn_args(dist, clusters, neighbors)
    return reference(dist, clusters, neighbors)


@dpcknn_assign.register_fake
def _dpcknn_assign_fake(dist, clusters, neighbors):
    return dist.new_empty(dist.shape[:2], dtype=torch.int64)


def translate(dist, clusters: int, neighbors: int):
    return DPCKNNAssign(dist, clusters=clusters, neighbors=neighbors)


def _selftest_calls(draw: dict) -> list:
    return [([draw["dist"], draw["clusters"], k], {**draw["shape"], "clusters": draw["clusters"], "neighbors": k}) for k in (1, 5)]


SPEC = OpSpec(
    name="DPCKNNAssign",
    torch_op=dpcknn_assign,
    onnx_function=DPCKNNAssign,
    translation=translate,
    reference=reference,
    inputs=(distances("B M M"),),
    output=INT64,
    output_shape=lambda shapes, attrs: list(shapes[0][:2]),
    flops=no_flops,  # comparisons; the distances are matmuls fvcore counts before the node
    kernel="deploytk.ops.dpcknn_assign.kernel",
    selftest=SelftestPlan("clustering", _selftest_calls, ties_when_perturbed(0)),
    matching=True,
    dest_covers_patches_only=True,
)
