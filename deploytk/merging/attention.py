"""timm ``Attention`` taken apart, for methods that need its pieces (MCTF's attention map, EViT's class attention)."""

from __future__ import annotations

from torch import nn


def qkv_heads(attn: nn.Module, x):
    """q, k, v [B, H, N, D] of a timm Attention (after its q/k norms)."""
    b, n, _ = x.shape
    qkv = attn.qkv(x).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    return attn.q_norm(q), attn.k_norm(k), v


def attention_probs(attn: nn.Module, q, k, size):
    """softmax((q * scale) k^T [+ log size]) in plain ops: [B, H, Nq, N], always fp32."""
    logits = ((q * attn.scale) @ k.transpose(-2, -1)).float()
    if size is not None:
        logits = logits + size.log()[:, None, None, :, 0]
    return logits.softmax(dim=-1)


def attend(probs, v):
    """probs @ v in v's precision (probs are fp32)."""
    return probs.to(v.dtype) @ v


def attention_gate(attn: nn.Module, x):
    """The sigmoid gate of a gated timm Attention on its input ``x``; None for an ungated one."""
    return attn.gate(x).sigmoid() if getattr(attn, "gate", None) is not None else None


def attention_output(attn: nn.Module, out, gate=None):
    """[B, H, N, D] attention values -> timm Attention's output (norm, gate, proj)."""
    b, _, n, _ = out.shape
    out = attn.norm(out.transpose(1, 2).reshape(b, n, attn.attn_dim))
    if gate is not None:
        out = out * gate
    return attn.proj_drop(attn.proj(out))
