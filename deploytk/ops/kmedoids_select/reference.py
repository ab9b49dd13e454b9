"""Eager reference of ``KMedoidsSelect``: the K-Medoids clustering of "Which Tokens to Use?" (Haurum et al.).

The study's ``k_medoids_fit`` with token weights (its default): the initial medoids are the
``clusters`` tokens of largest weight; each iteration assigns every token to its nearest
medoid (``dist``; the first medoid on ties) and makes the new medoid of each cluster the
member with the smallest cost w_i * sum_j dist[i, j] (first index on ties; a cluster left
without members gets token 0, as the official masked argmin does). The medoids themselves
are the output tokens, in cluster order; every other token is dropped.
"""

from __future__ import annotations

import torch

from deploytk.ops.reference_common import top_indices


def kmedoids_medoids(dist: torch.Tensor, weight: torch.Tensor, clusters: int, iterations: int) -> torch.Tensor:
    """Medoid token index of each cluster [B, clusters]."""
    b, m, _ = dist.shape
    cost = (dist * weight[..., None]).sum(-1)  # the official weighted row sum
    medoids = top_indices(weight, clusters)
    slots = torch.arange(clusters, device=dist.device)
    for _ in range(iterations):
        assign = dist.gather(2, medoids[:, None, :].expand(b, m, clusters)).argmin(-1)  # [B, M]
        members = assign[:, None, :] == slots[None, :, None]  # [B, K, M]
        medoids = torch.where(members, cost[:, None, :], torch.inf).argmin(-1)
    return medoids


def kmedoids_select(dist: torch.Tensor, weight: torch.Tensor, clusters: int, iterations: int) -> torch.Tensor:
    """dest [B, M]: the medoid of cluster k -> slot k; every other token -> slot ``clusters`` (dropped).

    A token that is the medoid of two clusters (possible only for an empty cluster) takes the
    first one's slot; the other slot then stays empty, where the official code repeats the token.
    """
    medoids = kmedoids_medoids(dist, weight, clusters, iterations)
    m = dist.shape[1]
    hit = medoids[:, :, None] == torch.arange(m, device=medoids.device)  # [B, K, M]
    return torch.where(hit.any(1), hit.int().argmax(1), clusters)
