"""Eager reference of ``DPCKNNAssign``: the DPC-KNN clustering of "Which Tokens to Use?" (after TCFormer).

The study's ``cluster_dpc_knn``: a token's local density is exp(-mean of its ``neighbors``
smallest squared distances) (itself included); its peak distance is the distance to the
nearest token of higher density (the image's largest distance for the densest token); the
``clusters`` tokens with the largest density x peak distance are the centres (ties: lower
index first); every token joins the centre nearest to it (dist[centre, token], the first
centre on ties) and every centre its own cluster. The official code adds uniform noise of
1e-6 to the densities to break exact ties; this one breaks them by index (a higher density
must be strictly higher), so it is deterministic.
"""

from __future__ import annotations

import torch

from deploytk.ops.reference_common import top_indices


def dpcknn_centres(dist: torch.Tensor, clusters: int, neighbors: int) -> torch.Tensor:
    """Centre token index of each cluster [B, clusters], best score first."""
    nearest = dist.topk(neighbors, dim=-1, largest=False).values
    density = (-(nearest**2).mean(dim=-1)).exp()
    higher = density[:, None, :] > density[:, :, None]  # [b, i, j]: j is denser than i
    dist_max = dist.flatten(1).max(dim=-1).values[:, None, None]
    peak = torch.where(higher, dist, dist_max).min(dim=-1).values
    return top_indices(peak * density, clusters)


def dpcknn_assign(dist: torch.Tensor, clusters: int, neighbors: int) -> torch.Tensor:
    """dest [B, M]: each token's cluster in [0, clusters) (cluster k: the k-th best centre)."""
    b, m, _ = dist.shape
    centres = dpcknn_centres(dist, clusters, neighbors)
    assign = dist.gather(1, centres[:, :, None].expand(b, clusters, m)).argmin(dim=1)
    return assign.scatter(1, centres, torch.arange(clusters, device=dist.device).expand(b, clusters))
