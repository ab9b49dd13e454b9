"""Eager reference of ``CrucialMatch``: the ``keep`` crucial tokens stay; every other token joins its
most similar crucial token (cosine on the metric; ties: the first index).

Crucial tokens are chosen as in TopKSelect (protected tokens + the ``keep`` best-scored
others, in order); protected tokens absorb nothing.
"""

from __future__ import annotations

import math

import torch

from deploytk.ops.reference_common import kept_mask, kept_slots, unit_rows


def crucial_match(metric: torch.Tensor, scores: torch.Tensor, keep: int, protected: int) -> torch.Tensor:
    """dest [B, N]: crucial tokens keep a slot; every other token joins its most similar crucial token."""
    kept = kept_mask(scores, keep, protected)
    slots = kept_slots(kept)
    m = unit_rows(metric)
    sim = (m @ m.transpose(1, 2)).masked_fill(~kept[:, None, :], -math.inf)
    sim[:, :, :protected] = -math.inf  # protected tokens absorb nothing
    target = sim.argmax(dim=-1)
    return torch.where(kept, slots, slots.gather(1, target))
