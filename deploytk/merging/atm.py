"""ATM (adaptive token merging, "Lossless Token Merging Even Without Fine-Tuning"), in two forms.

Dynamic (PyTorch only, used by ``deploytk calibrate``): in layer l (1-based) a token pair
merges when its cosine similarity exceeds theta_l = max(alpha - (exp(beta*(l-1)) - 1),
theta_min); the batch's r is the mean over its images of the number of A tokens whose best
match clears the threshold (floored). From ``split_layer`` on, tokens are split by size
(small half = sources, large half = destinations) instead of by alternation, so large
tokens do not merge with each other. In the last layer only the class token is kept.

Static (exported): the same layers with a fixed per-layer r calibrated from data, because a
TensorRT/ONNX graph needs static token counts.
"""

from __future__ import annotations

import math

import torch

from deploytk.merging.assign import kept_slots
from deploytk.merging.tome import protected_split


def thresholds(depth: int, alpha: float, beta: float, theta_min: float) -> list[float]:
    """theta_l for l = 1..depth."""
    return [max(alpha - (math.exp(beta * (layer - 1)) - 1.0), theta_min) for layer in range(1, depth + 1)]


def _size_split(size: torch.Tensor, protected: int):
    """Candidate tokens sorted by size (stable): first half A (small, sources), rest B."""
    cand = size[:, protected:, 0]
    order = cand.argsort(dim=1, stable=True)
    na = (cand.shape[1] + 1) // 2
    return order[:, :na], order[:, na:]


def size_split_scores(metric: torch.Tensor, size: torch.Tensor, protected: int):
    """Cosine scores [B, Na, Nb] between the small-size and large-size halves, and the halves."""
    oa, ob = _size_split(size, protected)
    m = metric / metric.norm(dim=-1, keepdim=True)
    mc = m[:, protected:]
    d = mc.shape[-1]
    a = mc.gather(1, oa[..., None].expand(-1, -1, d))
    b = mc.gather(1, ob[..., None].expand(-1, -1, d))
    return a @ b.transpose(1, 2), oa, ob


def size_split_match(metric: torch.Tensor, size: torch.Tensor, r: int, protected: int) -> torch.Tensor:
    """dest [B, N]: the r best-matched small tokens merge into their most similar large token.

    Every other token keeps a slot, in original order (protected tokens first).
    """
    scores, oa, ob = size_split_scores(metric, size, protected)
    node_max, node_idx = scores.max(dim=-1)
    src_pos = node_max.argsort(dim=1, descending=True, stable=True)[:, :r]
    src_tok = oa.gather(1, src_pos)
    m = oa.shape[1] + ob.shape[1]
    merged = torch.zeros(oa.shape[0], m, dtype=torch.bool, device=oa.device).scatter_(1, src_tok, True)
    target = torch.zeros_like(merged, dtype=torch.long).scatter_(1, oa, ob.gather(1, node_idx))
    prefix = torch.zeros(oa.shape[0], protected, dtype=torch.bool, device=oa.device)
    merged = torch.cat([prefix, merged], dim=1)
    target = torch.cat([prefix.long(), target + protected], dim=1)
    slots = kept_slots(~merged)
    return torch.where(merged, slots.gather(1, target), slots)


def count_above(metric: torch.Tensor, size: torch.Tensor, protected: int, threshold: float, size_split: bool) -> torch.Tensor:
    """Per image: A tokens whose best match has similarity > threshold (the pairs ATM would merge)."""
    if size_split:
        scores, _, _ = size_split_scores(metric, size, protected)
    else:
        m = metric / metric.norm(dim=-1, keepdim=True)
        scores = m[:, ::2] @ m[:, 1::2].transpose(1, 2)
        pa, pb = protected_split(protected)
        scores[:, :pa] = -math.inf
        scores[:, :, :pb] = -math.inf
    return (scores.amax(dim=-1) > threshold).sum(dim=1)


__all__ = ["thresholds", "size_split_match", "count_above"]
