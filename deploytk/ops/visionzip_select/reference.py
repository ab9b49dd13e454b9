"""Eager reference of ``VisionZipSelect``: VisionZip's dominant and contextual tokens (Yang et al., CVPR 2025).

It follows the official ``CLIPVisionTower_VisionZip.forward`` (dvlab-research/VisionZip ``visionzip/clip_encoder.py``,
read at 3151f6d), generalising its class token to the first ``protected`` tokens:

- dominant: the protected tokens and the ``dominant`` patch tokens that receive the most attention (``scores``: the
  class token's attention, summed over heads), in index order (the official ``masked_select`` keeps that order);
- contextual: of the M remaining tokens, in index order, every ``step``-th (step = max(1, M // contextual)) is a
  target, the first ``contextual`` of them; every other remaining token joins the target it is most similar to
  (cosine on ``metric``, the keys averaged over heads; the first target on ties, as ``argmax``).

Output slots: the dominant tokens, then the targets in order. Ties in the scores resolve to the lower index (ONNX
TopK's rule), where the official ``topk`` leaves them unspecified.
"""

from __future__ import annotations

import math

import torch

from deploytk.ops.reference_common import kept_mask, kept_slots, unit_rows


def target_step(remaining: int, contextual: int) -> int:
    """The stride between targets among the remaining tokens (the official ``max(1, M // contextual)``)."""
    return max(1, remaining // contextual)


def contextual_targets(remaining: torch.Tensor, step: int, contextual: int) -> torch.Tensor:
    """[B, N] int64: k where a token is the k-th target, -1 elsewhere (``remaining`` [B, N] bool: not dominant).

    Every remaining token's rank among them, in index order, decides: ranks 0, step, 2 step, ... up to ``contextual``
    targets. The merge's weights need it too (a contextual token is its target plus the mean of the others).
    """
    rank = remaining.long().cumsum(1) - 1
    is_target = remaining & (rank % step == 0) & (rank < step * contextual)
    return torch.where(is_target, rank // step, torch.full_like(rank, -1))


def visionzip_select(scores: torch.Tensor, metric: torch.Tensor, dominant: int, contextual: int, protected: int) -> torch.Tensor:
    """dest [B, N]: dominant tokens -> their slots in order, targets -> protected + dominant + k, the rest -> their target's."""
    kept = kept_mask(scores, dominant, protected)
    remaining = ~kept
    step = target_step(scores.shape[1] - protected - dominant, contextual)
    target = contextual_targets(remaining, step, contextual)
    m = unit_rows(metric)
    sim = (m @ m.transpose(1, 2)).masked_fill((target < 0)[:, None, :], -math.inf)
    joined = target.gather(1, sim.argmax(dim=-1))
    first = protected + dominant
    return torch.where(kept, kept_slots(kept), first + torch.where(target >= 0, target, joined))
