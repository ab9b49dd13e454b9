"""Attention in plain ops, with log(size) on the logits over merged tokens: for the methods that need its map (MCTF's
fusion, EViT's class attention, ATS, K-Medoids) and for the attention-pooling heads of the families (SigLIP's).

The projections come from the block's or head's family (``BlockParts.qkv`` / ``attn_output``); what is computed between
them is the same for every family.
"""

from __future__ import annotations


def attention_probs(scale: float, q, k, size):
    """softmax((q * scale) k^T [+ log size]) in plain ops: [B, H, Nq, N], always fp32."""
    logits = ((q * scale) @ k.transpose(-2, -1)).float()
    if size is not None:
        logits = logits + size.log()[:, None, None, :, 0]
    return logits.softmax(dim=-1)


def attend(probs, v):
    """probs @ v in v's precision (probs are fp32)."""
    return probs.to(v.dtype) @ v
