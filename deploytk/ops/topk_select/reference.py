"""Eager reference of ``TopKSelect``: keep the protected tokens and the ``keep`` best-scored others.

Protected tokens (class, distillation, registers) always stay, in front; the ``keep``
best-scored other tokens stay in their original order (ties: the lower token index first,
ONNX TopK's rule). Every other token goes to slot protected + keep: dropped (Top-K) or fused
into one extra token (EViT), as the caller's ``TokenAggregate`` decides.
"""

from __future__ import annotations

import torch

from deploytk.ops.reference_common import kept_mask, kept_slots


def topk_select(scores: torch.Tensor, keep: int, protected: int) -> torch.Tensor:
    """dest [B, N]: kept tokens -> their slot; the others -> slot protected + keep.

    That slot is the drop bucket when nothing is fused (tokens_out = protected + keep) and
    the fused token when the rest is fused (tokens_out = protected + keep + 1).
    """
    kept = kept_mask(scores, keep, protected)
    return torch.where(kept, kept_slots(kept), protected + keep)
