"""``MergedViT``: a timm VisionTransformer run with a token-reduction method at a static schedule.

The wrapper re-uses the timm model's own modules (so its state_dict and weights are the timm
ones) and re-implements only the forward pass: patch embedding and prefix tokens, per-token
sizes (carried to proportional attention and a size-weighted average pool), each block run by
the method (``Reduction.block``; by default attention, the method's ``reduce``, MLP), and the
head. With the base ``Reduction`` (no reduction) it computes exactly what the timm model
computes. This is the PyTorch reference: the ground truth every backend is held to.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import Attention
from timm.models.vision_transformer import Block, ResPostBlock, VisionTransformer
from torch import nn

import deploytk.ops  # noqa: F401  (registers torch.ops.deploytk.*)
from deploytk.errors import DeploytkError
from deploytk.merging.attention import attend, attention_gate, attention_output, attention_probs, qkv_heads
from deploytk.merging.reduction import MethodOptions, Reduction
from deploytk.merging.schedule import TokenSchedule, parse_r

_SUPPORTED_POOLS = ("token", "avg", "avgmax", "max", "")


def check_supported(vit: nn.Module) -> None:
    """Refuse, with the reason, a model the forward pass below does not reproduce."""
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


def aggregate_size(size: torch.Tensor, dest: torch.Tensor, tokens_out: int) -> torch.Tensor:
    """Sizes of the output tokens: the sum of the sizes merged into each."""
    return torch.ops.deploytk.token_aggregate(size, torch.ones_like(size), dest, tokens_out, False)


class MergedViT(nn.Module):
    """A timm ViT run with a token-reduction method (``reduction``) at its static schedule.

    ``prop_attn`` adds log(size) to the attention logits so merged tokens keep their weight.
    """

    def __init__(self, vit: nn.Module, reduction: Reduction, prop_attn: bool = True):
        super().__init__()
        check_supported(vit)
        if reduction.needs_prop_attn and not prop_attn:
            raise DeploytkError(
                f"method {reduction.name} needs `merge.prop_attn: true`: it leaves empty token slots of size 0, "
                "which only proportional attention (log size = -inf) ignores."
            )
        self.vit = vit
        self.reduction = reduction
        self.prop_attn = prop_attn
        #: class + distillation + register tokens
        self.protected = reduction.protected
        #: called as hook(op_name, args, dest) -> dest by every matching op; the validator records
        #: the reference's choices and replays a backend's through it (None: plain reference)
        self.dest_hook = None
        #: weights/activations dtype; ``merging.precision.to_precision`` lowers it (I/O stays fp32)
        self.compute_dtype = torch.float32
        #: without prop_attn, run fp16/bf16 attention as PyTorch's fused SDPA instead of the fp32
        #: softmax the export has: what a latency benchmark compares (the reference keeps False)
        self.fused_low_precision_attention = False

    @classmethod
    def dense(cls, vit: nn.Module, prop_attn: bool = True) -> MergedViT:
        """The same weights with no reduction (what every speedup and FLOP ratio is relative to)."""
        return cls(vit, Reduction(vit, [], MethodOptions()), prop_attn)

    @property
    def schedule(self) -> TokenSchedule:
        return self.reduction.schedule

    @property
    def num_tokens(self) -> int:
        """Tokens entering the first block: prefix tokens + patches."""
        return self.reduction.num_tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        vit = self.vit
        x = vit.patch_embed(x.to(self.compute_dtype))
        x = vit._pos_embed(x)
        x = vit.patch_drop(x)
        x = vit.norm_pre(x)
        size = torch.ones(x.shape[0], x.shape[1], 1, dtype=torch.float32, device=x.device)  # always fp32
        for i, blk in enumerate(vit.blocks):
            x, size = self.reduction.block(self, i, blk, x, size)
        x = vit.norm(x)
        return self._head(x, size).float()

    # ---- what a method's block and reduction use -------------------------------------------

    def standard_block(self, i: int, blk: nn.Module, x, size):
        """One block: attention (+ residual), the method's ``reduce``, MLP (+ residual)."""
        post_norm = isinstance(blk, ResPostBlock)
        attn_in = x if post_norm else blk.norm1(x)
        attn_out, metric, cls_attn = self.attention(blk.attn, attn_in, size, self.reduction.wants_cls_attention(i))
        attn_out = blk.norm1(attn_out) if post_norm else blk.ls1(attn_out)
        x = x + blk.drop_path1(attn_out)
        x, size = self.reduction.reduce(self, i, x, size, metric, cls_attn)
        return self.mlp_residual(blk, x), size

    @staticmethod
    def mlp_residual(blk: nn.Module, x):
        """x + the block's MLP branch (post-norm for ResPostBlock, LayerScale for pre-norm blocks)."""
        mlp_out = blk.norm2(blk.mlp(x)) if isinstance(blk, ResPostBlock) else blk.ls2(blk.mlp(blk.norm2(x)))
        return x + blk.drop_path2(mlp_out)

    def block_with_attention_map(self, blk: nn.Module, x, size):
        """One block without reduction, its attention run in plain ops so that the map is kept:
        (x, probs [B, H, N, N] fp32), for methods that score tokens by the attention they received."""
        post_norm = isinstance(blk, ResPostBlock)
        attn = blk.attn
        h = x if post_norm else blk.norm1(x)
        gate = attention_gate(attn, h)
        q, k, v = qkv_heads(attn, h)
        probs = attention_probs(attn, q, k, size if self.prop_attn else None)
        out = attention_output(attn, attend(probs, v), gate)
        x = x + blk.drop_path1(blk.norm1(out) if post_norm else blk.ls1(out))
        return self.mlp_residual(blk, x), probs

    def match(self, op_name: str, *args):
        """A matching/selection op (-> ``dest``), routed through ``dest_hook`` when one is set.

        Its float inputs are cast to fp32: a discrete choice made on fp16 scores would flip
        on ties that fp32 resolves.
        """
        args = tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        dest = getattr(torch.ops.deploytk, op_name)(*args)
        return dest if self.dest_hook is None else self.dest_hook(op_name, args, dest)

    def attention(self, attn: nn.Module, x, size, cls_attention: bool = False):
        """timm Attention.forward, with proportional attention.

        Also returns the keys averaged over heads (ToMe's metric) and, if asked, the attention
        the class token pays every token (mean over heads) [B, N].
        """
        gate = attention_gate(attn, x)
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


def build_merged(method: type[Reduction], vit: nn.Module, r_spec, prop_attn: bool, options: MethodOptions) -> MergedViT:
    """``vit`` with ``method`` at the schedule ``r_spec`` (an int, a per-block list or (r, inflection))."""
    return MergedViT(vit, method(vit, parse_r(len(vit.blocks), r_spec), options), prop_attn)
