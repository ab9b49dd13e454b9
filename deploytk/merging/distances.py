"""Pairwise Euclidean distances in plain ops, computed the way ``torch.cdist`` computes them.

The clustering methods of "Which Tokens to Use?" call ``torch.cdist(x, x)``. Its default
mode takes, for more than 25 rows, the matrix-product form |x|^2 + |y|^2 - 2 x.y (clamped at
1e-30, then the square root), and otherwise the direct difference. The same arithmetic here
traces to standard ONNX ops (MatMul, ReduceSum, Sqrt) and keeps the reference's choices those
of the official code, down to the self-distance being sqrt(rounding error), not 0.
"""

from __future__ import annotations

import torch

#: torch.cdist's "use_mm_for_euclid_dist_if_necessary": the matrix product above this many rows
CDIST_MM_ROWS = 25


def pairwise_distances(x: torch.Tensor) -> torch.Tensor:
    """[B, M, C] -> [B, M, M] Euclidean distances, as ``torch.cdist(x, x)`` (fp32)."""
    x = x.float()
    if x.shape[1] <= CDIST_MM_ROWS:
        return (x[:, :, None, :] - x[:, None, :, :]).pow(2).sum(-1).sqrt()
    sq = x.pow(2).sum(-1, keepdim=True)
    ones = torch.ones_like(sq)
    left = torch.cat([x * -2, sq, ones], dim=-1)
    right = torch.cat([x, ones, sq], dim=-1)
    return (left @ right.transpose(1, 2)).clamp_min(1e-30).sqrt()
