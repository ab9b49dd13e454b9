"""Eager reference of ``ProportionalAttention``."""

from __future__ import annotations

import torch


def proportional_attention(q, k, v, size, scale: float) -> torch.Tensor:
    """The matmuls in q's dtype, the logits, log(size) and softmax in fp32."""
    logits = ((q * scale) @ k.transpose(-2, -1)).float() + size.float().log()[:, None, None, :, 0]
    return logits.softmax(dim=-1).to(v.dtype) @ v
