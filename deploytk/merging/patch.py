"""Wrap a timm VisionTransformer so that it runs with a fixed token-merge schedule.

The wrapper re-uses the timm model's own modules (so its state_dict and weights are the
timm ones) and re-implements only the forward pass: every block runs attention, optionally
with proportional attention, merges tokens between attention and MLP (ToMe's placement),
and carries per-token sizes to a size-weighted average pool. With r = 0 everywhere it
computes exactly what the timm model computes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import deploytk.ops  # noqa: F401  (registers torch.ops.deploytk.*)
from deploytk.errors import DeploytkError
from deploytk.merging.schedule import TokenSchedule, cap_schedule, parse_r


def aggregate_size(size: torch.Tensor, dest: torch.Tensor, tokens_out: int) -> torch.Tensor:
    """Sizes of the output tokens: the sum of the sizes merged into each."""
    return torch.ops.deploytk.token_aggregate(size, torch.ones_like(size), dest, tokens_out, False)


_SUPPORTED_POOLS = ("token", "avg", "avgmax", "max", "")


def _check_supported(vit: nn.Module) -> None:
    from timm.layers import Attention
    from timm.models.vision_transformer import Block, ResPostBlock, VisionTransformer

    name = type(vit).__name__
    if not isinstance(vit, VisionTransformer):
        raise DeploytkError(
            f"model class {name} is not a timm VisionTransformer; deploytk supports the timm "
            "VisionTransformer family (vit_*, deit_*, deit3_*, ...)."
        )
    for i, blk in enumerate(vit.blocks):
        if type(blk) not in (Block, ResPostBlock):
            raise DeploytkError(
                f"block {i} is a {type(blk).__name__}; deploytk supports timm's Block and ResPostBlock (parallel blocks are not supported)."
            )
        if type(blk.attn) is not Attention:
            raise DeploytkError(f"block {i} uses {type(blk.attn).__name__}; deploytk supports timm's standard Attention.")
    if getattr(vit, "attn_pool", None) is not None or vit.global_pool not in _SUPPORTED_POOLS:
        raise DeploytkError(f"global_pool={vit.global_pool!r} is not supported; allowed: token, avg, avgmax, max, ''.")
    if getattr(vit, "dynamic_img_size", False):
        raise DeploytkError("dynamic_img_size=True models are not supported: export needs a fixed image size.")


class MergedViT(nn.Module):
    """A timm ViT run with a static per-layer merge schedule (the PyTorch reference).

    ``schedule.effective_r[i]`` tokens are merged in block i. ``prop_attn`` adds log(size)
    to the attention logits so merged tokens keep their weight.
    """

    def __init__(self, vit: nn.Module, r_per_layer: list[int], prop_attn: bool = True):
        super().__init__()
        _check_supported(vit)
        self.vit = vit
        self.prop_attn = prop_attn
        self.protected = int(vit.num_prefix_tokens)  # class + distillation + register tokens
        # ToMe keeps unmerged tokens in original order whenever there is a class token.
        self.sort_unmerged = self.protected > 0
        self.schedule = self._plan(list(r_per_layer), self.num_tokens)
        #: called as hook(op_name, args, dest) -> dest by every matching op; the validator records
        #: the reference's choices and replays a backend's through it (None: plain reference)
        self.dest_hook = None
        #: weights/activations dtype; ``merging.precision.to_precision`` lowers it (I/O stays fp32)
        self.compute_dtype = torch.float32
        #: without prop_attn, run fp16/bf16 attention as PyTorch's fused SDPA instead of the fp32
        #: softmax the export has: what a latency benchmark compares (the reference keeps False)
        self.fused_low_precision_attention = False

    def _plan(self, requested: list[int], num_tokens: int) -> TokenSchedule:
        """The static token counts per layer (ToMe's cap)."""
        return cap_schedule(requested, num_tokens, self.protected)

    @property
    def num_tokens(self) -> int:
        """Tokens entering the first block: prefix tokens + patches."""
        return self.vit.patch_embed.num_patches + self.protected

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        vit = self.vit
        x = vit.patch_embed(x.to(self.compute_dtype))
        x = vit._pos_embed(x)
        x = vit.patch_drop(x)
        x = vit.norm_pre(x)
        size = torch.ones(x.shape[0], x.shape[1], 1, dtype=torch.float32, device=x.device)  # always fp32
        for i, blk in enumerate(vit.blocks):
            x, size = self._block(i, blk, x, size)
        x = vit.norm(x)
        return self._head(x, size).float()

    def expected_custom_ops(self) -> dict[str, int]:
        """deploytk nodes the exported graph must contain (checked after export)."""
        merges = sum(1 for r in self.schedule.effective_r if r > 0)
        return {
            "ToMeMatch": merges,
            "TokenAggregate": 2 * merges,  # tokens and sizes
            "ProportionalAttention": len(self.vit.blocks) if self.prop_attn else 0,
        }

    def _block(self, i: int, blk: nn.Module, x, size):
        """One block: attention (+ residual), the layer's reduction, MLP (+ residual)."""
        from timm.models.vision_transformer import ResPostBlock

        post_norm = isinstance(blk, ResPostBlock)
        attn_in = x if post_norm else blk.norm1(x)
        attn_out, metric, cls_attn = self._attention(blk.attn, attn_in, size, self._wants_cls_attention(i))
        attn_out = blk.norm1(attn_out) if post_norm else blk.ls1(attn_out)
        x = x + blk.drop_path1(attn_out)
        x, size = self._reduce(i, x, size, metric, cls_attn)
        mlp_out = blk.norm2(blk.mlp(x)) if post_norm else blk.ls2(blk.mlp(blk.norm2(x)))
        return x + blk.drop_path2(mlp_out), size

    def _match(self, op_name: str, *args):
        """A matching/selection op (-> ``dest``), routed through ``dest_hook`` when one is set.

        Its float inputs are cast to fp32: a discrete choice made on fp16 scores would flip
        on ties that fp32 resolves.
        """
        args = tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        dest = getattr(torch.ops.deploytk, op_name)(*args)
        return dest if self.dest_hook is None else self.dest_hook(op_name, args, dest)

    def _wants_cls_attention(self, i: int) -> bool:
        return False

    def _reduce(self, i: int, x, size, metric, cls_attn):
        """ToMe: merge r tokens on the attention keys (between attention and MLP)."""
        r = self.schedule.effective_r[i]
        if r > 0:
            x, size = self._tome_merge(x, size, metric, r)
        return x, size

    def _tome_merge(self, x, size, metric, r: int):
        """One ToMe merge: match on the metric, then size-weighted average of x; sizes add up."""
        dest = self._match("tome_match", metric, r, self.protected, self.sort_unmerged)
        n_out = x.shape[1] - r
        return torch.ops.deploytk.token_aggregate(x, size, dest, n_out, True), aggregate_size(size, dest, n_out)

    def _attention(self, attn: nn.Module, x, size, cls_attention: bool = False):
        """timm Attention.forward, with proportional attention.

        Also returns ToMe's metric (keys averaged over heads) and, if asked, the attention
        the class token pays every token (mean over heads) [B, N].
        """
        b, n, _ = x.shape
        gate = attn.gate(x).sigmoid() if getattr(attn, "gate", None) is not None else None
        q, k, v = qkv_heads(attn, x)
        if self.prop_attn:
            out = torch.ops.deploytk.proportional_attention(q, k, v, size, float(attn.scale))
        elif q.dtype == torch.float32 or self.fused_low_precision_attention:
            out = F.scaled_dot_product_attention(q, k, v)
        else:  # low precision: keep the softmax in fp32, as ProportionalAttention does
            out = attend(attention_probs(attn, q, k, None), v)
        cls_attn = attention_probs(attn, q[:, :, :1], k, size if self.prop_attn else None)[:, :, 0].mean(1) if cls_attention else None
        return attention_output(attn, out, gate), k.mean(1), cls_attn

    def _head(self, x, size):
        vit = self.vit
        if getattr(vit, "dist_token", None) is not None:  # distilled DeiT: average both heads
            return (vit.head(vit.head_drop(x[:, 0])) + vit.head_dist(vit.head_drop(x[:, 1]))) / 2
        pool = vit.global_pool
        if pool == "token":
            x = x[:, 0]
        elif pool:
            if not vit.pool_include_prefix:
                x, size = x[:, vit.num_prefix_tokens :], size[:, vit.num_prefix_tokens :]
            avg = ((x * size).sum(dim=1) / size.sum(dim=1)).to(x.dtype)  # a merged token counts `size` times (fp32 sums)
            if pool == "avg":
                x = avg
            elif pool == "max":
                x = x.amax(dim=1)
            else:  # avgmax
                x = 0.5 * (x.amax(dim=1) + avg)
        x = vit.fc_norm(x)
        x = vit.head_drop(x)
        return vit.head(x)


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


def attention_output(attn: nn.Module, out, gate=None):
    """[B, H, N, D] attention values -> timm Attention's output (norm, gate, proj)."""
    b, _, n, _ = out.shape
    out = attn.norm(out.transpose(1, 2).reshape(b, n, attn.attn_dim))
    if gate is not None:
        out = out * gate
    return attn.proj_drop(attn.proj(out))


def build_schedule(vit: nn.Module, r_spec) -> list[int]:
    """The requested per-layer r for this model from the config's r spec."""
    return parse_r(len(vit.blocks), r_spec)


__all__ = ["MergedViT", "TokenSchedule", "build_schedule"]
