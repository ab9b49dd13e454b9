"""The multi-scale ViT of "Multi-Scale And Token Mergence: Make Your ViT More Efficient" (section 3.4, Figure 3).

A DeiT (any pre-norm timm ViT with a class token) with a second, low-scale token group: the image is
embedded twice, as the ViT's grid of patches (high scale: 196 tokens at 224 px) and a grid half as fine in
each direction (low scale: 49), each group with a class token and a learnable position embedding of its
own. The first ``fusion_block`` blocks (3: the paper's first token-pruning block is the 4th) run both groups
with the same weights: the low-scale group as a plain ViT block, the high-scale group with its attention on
downsampled tokens (Eq. 6: X_h + UP(MHSA(DOWN(X_h))), the class token untouched), so that each of these blocks
costs about one plain block. Then the groups are fused on the high-scale grid (Eq. 5):
X = PEG(X_h + LKA(UP(X_l))), and the remaining blocks are plain blocks, where the token reduction runs.

The paper publishes no code; where it leaves a detail open, the choice made here and why:

- **low-scale embedding**: the high-scale patch embedding's weights on the image average-pooled 2x
  (``low_scale_embedding: shared``, the default): one patch embedding, two token counts. The paper's Table 1 gives
  5.8 M / 22.2 M parameters for DeiT-T / -S, within 0.1 M of plain DeiT, and this reading reproduces them (5.78 M,
  22.25 M); an embedding of its own (``own``: a ``Conv2d`` with twice the patch size, as CrossViT's two patch sizes)
  adds 0.59 M / 1.18 M / 2.36 M for DeiT-T / -S / -B, which the table's counts leave no room for.
- **DOWN**: 2x2 average pooling of the patch grid (parameter-free, "a simple downsample", and it gives exactly the
  low-scale token count); it applies to the residual stream before the block's pre-norm, so the attention
  sub-layer (norm1 + attention) sees the pooled tokens, as Eq. 6 writes it. **UP** (both places): nearest.
- **the upsampling convolution** of the fusion ("nearest interpolation and convolution"): a depth-wise 3x3 conv
  after the nearest upsampling, which smooths its 2x2 blocks per channel; channel mixing is LKA's 1x1.
- **LKA**: Visual Attention Network's module as its paper defines it: depth-wise 5x5, depth-wise 7x7 with dilation 3,
  1x1, and the input multiplied by the result (the module alone, without VAN's surrounding projections).
- **PEG**: CPVT's positional encoding generator, a depth-wise 3x3 conv over the token grid added to its input, on the
  patch tokens only (CPVT leaves the class token out of the convolution).
- **the class tokens at the fusion**: added, as the patch tokens are (the low-scale class token's information is
  kept; a trained model can learn to ignore it).
- **the low-scale group runs blocks 0 .. fusion_block - 1** (shared weights): the paper's claim that each of those
  blocks costs about one plain ViT block holds only if both groups go through them (the high scale's attention on 50
  tokens plus the low scale's whole block on 50 stand in for a plain block's attention on 197; measured: 0.355 against
  0.379 GFLOPs for DeiT-S, ``benchmarks/multiscale_vs_paper.py``).

Checkpoint layout, key by key (a state dict, ``.safetensors`` or ``.pth``): every key of the timm ViT it extends
(``cls_token``, ``pos_embed`` [1, 1 + P, C], ``patch_embed.proj.{weight,bias}``, ``blocks.{i}.*``, ``norm.*``,
``head.*``), plus ``cls_token_low`` [1, 1, C], ``pos_embed_low`` [1, 1 + P/4, C], ``patch_embed_low.proj.{weight,
bias}`` [C, 3, 2p, 2p] (``low_scale_embedding: own`` only), ``fusion.up.{weight,bias}`` [C, 1, 3, 3], ``fusion.lka.conv0.{weight,bias}``
[C, 1, 5, 5], ``fusion.lka.conv_spatial.{weight,bias}`` [C, 1, 7, 7], ``fusion.lka.conv1.{weight,bias}``
[C, C, 1, 1], ``fusion.peg.proj.{weight,bias}`` [C, 1, 3, 3].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import PatchEmbed, trunc_normal_
from timm.models import clean_state_dict
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn

from deploytk.adapters.base import register_family
from deploytk.adapters.timm_vit import STATE_FILE, TimmBlock, TimmViT, constructor_arguments, save_state
from deploytk.errors import DeploytkError

#: a config's ``model:`` that names a multi-scale model: ``multiscale:<timm ViT name>`` (deit_tiny_patch16_224, ...)
PREFIX = "multiscale:"
#: the options this family takes from ``model_kwargs`` (the rest go to timm's ``create_model``)
OPTIONS = {"fusion_block": 3, "low_scale_embedding": "shared"}


class LKA(nn.Module):
    """Large-kernel attention (Visual Attention Network): a 21x21 receptive field from three cheap convolutions, used
    as a multiplicative attention map on its input."""

    def __init__(self, dim: int):
        super().__init__()
        self.conv0 = nn.Conv2d(dim, dim, 5, padding=2, groups=dim)
        self.conv_spatial = nn.Conv2d(dim, dim, 7, padding=9, groups=dim, dilation=3)
        self.conv1 = nn.Conv2d(dim, dim, 1)

    def forward(self, x):
        return x * self.conv1(self.conv_spatial(self.conv0(x)))


class PEG(nn.Module):
    """Positional encoding generator (CPVT): position information from a depth-wise 3x3 conv over the token grid."""

    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x):
        return x + self.proj(x)


class ScaleFusion(nn.Module):
    """Eq. 5 on [B, 1 + P, C] token groups: X = PEG(X_h + LKA(UP(X_l))) on the patch grids, class tokens added."""

    def __init__(self, dim: int):
        super().__init__()
        self.up = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.lka = LKA(dim)
        self.peg = PEG(dim)

    def forward(self, x_high, x_low, grid: tuple[int, int]):
        low = upsample(as_grid(x_low[:, 1:], (grid[0] // 2, grid[1] // 2)))
        fused = self.peg(as_grid(x_high[:, 1:], grid) + self.lka(self.up(low)))
        return torch.cat([x_high[:, :1] + x_low[:, :1], as_tokens(fused)], dim=1)


def as_grid(tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """[B, H*W, C] patch tokens -> [B, C, H, W]."""
    return tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], *grid)


def as_tokens(grid: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, H*W, C]."""
    return grid.flatten(2).transpose(1, 2)


def upsample(grid: torch.Tensor) -> torch.Tensor:
    """UP: nearest, 2x in each direction."""
    return F.interpolate(grid, scale_factor=2.0, mode="nearest")


class MultiScaleViT(nn.Module):
    """The multi-scale model around a timm ``VisionTransformer`` whose modules it takes over (same names, same keys)."""

    def __init__(self, vit: VisionTransformer, fusion_block: int = 3, low_scale_embedding: str = "shared"):
        super().__init__()
        dim = vit.embed_dim
        self.patch_embed, self.cls_token, self.pos_embed = vit.patch_embed, vit.cls_token, vit.pos_embed
        self.blocks, self.norm, self.fc_norm, self.head = vit.blocks, vit.norm, vit.fc_norm, vit.head
        self.grid = tuple(int(v) for v in vit.patch_embed.grid_size)
        self.grid_low = (self.grid[0] // 2, self.grid[1] // 2)
        self.fusion_block = fusion_block
        self.low_scale_embedding = low_scale_embedding
        self.embed_dim, self.num_classes, self.num_features = dim, vit.num_classes, vit.num_features
        self.pretrained_cfg = vit.pretrained_cfg
        #: what rebuilds the ViT it extends (timm's constructor arguments; ``save_source`` stores them)
        self.vit_arguments = constructor_arguments(vit)
        patch = tuple(int(p) for p in vit.patch_embed.patch_size)
        if low_scale_embedding == "own":
            img = tuple(int(v) for v in vit.patch_embed.img_size)
            self.patch_embed_low = PatchEmbed(img, (2 * patch[0], 2 * patch[1]), vit.patch_embed.proj.in_channels, dim)
        self.cls_token_low = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed_low = nn.Parameter(torch.zeros(1, 1 + self.grid_low[0] * self.grid_low[1], dim))
        self.fusion = ScaleFusion(dim)
        trunc_normal_(self.pos_embed_low, std=0.02)
        nn.init.normal_(self.cls_token_low, std=1e-6)

    def embed_low(self, images):
        if self.low_scale_embedding == "own":
            patches = self.patch_embed_low(images)
        else:  # the high-scale embedding's weights on the image at half the resolution
            patches = as_tokens(self.patch_embed.proj(F.avg_pool2d(images, 2)))
        return torch.cat([self.cls_token_low.expand(images.shape[0], -1, -1), patches], dim=1) + self.pos_embed_low

    def embed_high(self, images):
        return torch.cat([self.cls_token.expand(images.shape[0], -1, -1), self.patch_embed(images)], dim=1) + self.pos_embed

    def high_scale_block(self, blk: Block, x):
        """Eq. 6: the attention sub-layer on the 2x2-pooled patch tokens (class token as is), its output upsampled
        (nearest) back to the grid; the MLP on every token."""
        pooled = as_tokens(F.avg_pool2d(as_grid(x[:, 1:], self.grid), 2))
        out = blk.attn(blk.norm1(torch.cat([x[:, :1], pooled], dim=1)))
        out = torch.cat([out[:, :1], as_tokens(upsample(as_grid(out[:, 1:], self.grid_low)))], dim=1)
        x = x + blk.drop_path1(blk.ls1(out))
        return x + blk.drop_path2(blk.ls2(blk.mlp(blk.norm2(x))))

    def forward_stem(self, images):
        """Images -> the fused tokens entering block ``fusion_block`` [B, 1 + P, C]."""
        high, low = self.embed_high(images), self.embed_low(images)
        for blk in self.blocks[: self.fusion_block]:
            high, low = self.high_scale_block(blk, high), blk(low)
        return self.fusion(high, low, self.grid)

    def forward_features(self, images):
        x = self.forward_stem(images)
        for blk in self.blocks[self.fusion_block :]:
            x = blk(x)
        return self.norm(x)

    def forward(self, images):
        return self.head(self.fc_norm(self.forward_features(images)[:, 0]))


@register_family
class MultiScale(TimmViT):
    name = "multiscale-vit"
    prefix = PREFIX
    takes_learned_reducers = False
    summary = 'the multi-scale ViT of "Multi-Scale And Token Mergence" (two token scales fused by LKA + PEG), on a timm DeiT'
    model_syntax = "multiscale:<timm ViT name>"
    classes = ("MultiScaleViT",)

    @classmethod
    def load(cls, name, *, img_size, model_kwargs, pretrained, checkpoint):
        """timm builds the ViT ``name`` after the prefix names (``model_kwargs`` other than this family's own
        ``fusion_block`` and ``low_scale_embedding``); the multi-scale parts are added at random init."""
        if pretrained:
            raise DeploytkError(
                f"`pretrained: true` for {name!r}: no public weights of the multi-scale model exist (its paper released none), "
                "and timm's DeiT weights would leave the low-scale embedding and the fusion random.",
                hint="Train it (scripts/train_digits_multiscale.py shows how on the digits data) and pass the weights with `checkpoint:`.",
            )
        own = {k: model_kwargs.pop(k) for k in list(model_kwargs) if k in OPTIONS}
        options = OPTIONS | own
        if options["low_scale_embedding"] not in ("own", "shared"):
            raise DeploytkError(f"`model_kwargs.low_scale_embedding` = {options['low_scale_embedding']!r}: allowed: own, shared.")
        vit = TimmViT.load(name[len(PREFIX) :], img_size=img_size, model_kwargs=model_kwargs, pretrained=False, checkpoint=None)
        grid = tuple(int(v) for v in vit.patch_embed.grid_size)
        depth, fusion = len(vit.blocks), options["fusion_block"]
        problems = [
            (getattr(vit, "cls_token", None) is None, "has no class token (the fusion and the paper's selection need one)"),
            (int(vit.num_prefix_tokens) != 1, f"has {vit.num_prefix_tokens} prefix tokens (distillation / registers)"),
            (any(type(b) is not Block for b in vit.blocks), "has blocks other than timm's pre-norm Block"),
            (vit.global_pool != "token", f"pools by {vit.global_pool!r}, not the class token"),
            (any(v % 2 for v in grid), f"has a {grid[0]}x{grid[1]} patch grid; the low scale halves it, so both sides must be even"),
            (not (isinstance(fusion, int) and 1 <= fusion < depth), f"cannot fuse after {fusion!r} of its {depth} blocks"),
        ]
        bad = [why for failed, why in problems if failed]
        if bad:
            raise DeploytkError(f"{name!r} cannot be a multi-scale ViT: the ViT {'; '.join(bad)}.")
        return MultiScaleViT(vit, fusion, options["low_scale_embedding"]).eval()

    @classmethod
    def accepts(cls, model):
        return isinstance(model, MultiScaleViT)

    def save_source(self, folder):
        """The weights and the recipe ``multiscale:<architecture>`` with its ViT's constructor arguments and the fusion's
        settings from the object."""
        m = self.model
        arch = (getattr(m, "pretrained_cfg", None) or {}).get("architecture")
        if type(m) is not MultiScaleViT or not arch:
            return f"its class {type(m).__qualname__} or its ViT's architecture ({arch}) is not one deploytk builds by name"
        save_state(m, folder)
        kwargs = getattr(m, "vit_arguments", {}) | {"num_classes": int(m.num_classes)}
        kwargs |= {"fusion_block": int(m.fusion_block), "low_scale_embedding": m.low_scale_embedding}
        return {"model": PREFIX + arch, "model_kwargs": kwargs, "checkpoint": STATE_FILE}

    def check(self):
        m = self.model
        self.blocks = [TimmBlock(b) for b in m.blocks]
        self.stem_blocks = m.fusion_block
        self.num_prefix_tokens = 1
        self.has_class_token = True
        self.has_dist_token = False
        self.grid_size = m.grid
        img = m.patch_embed.img_size
        self.img_size = (int(img[0]), int(img[1]))
        self.embed_dim = int(m.embed_dim)
        self.mlp_dim = int(m.blocks[0].mlp.fc1.out_features)
        self.pool = "token"
        self.num_classes = int(m.num_classes)
        self.num_features = int(m.num_features)
        self.architecture = f"multi-scale {m.pretrained_cfg.get('architecture', 'ViT')}"

    def embed(self, images):
        return self.model.forward_stem(images)

    def pre_logits(self, x, size):
        return self.model.fc_norm(x[:, 0])

    def head(self, x, size):
        return self.model.head(self.pre_logits(x, size))

    def flop_parts(self):
        parts = {"low-scale patch embedding": "patch_embed_low"} if self.model.low_scale_embedding == "own" else {}
        return parts | {"fusion: upsampling conv": "fusion.up", "fusion: LKA": "fusion.lka", "fusion: PEG": "fusion.peg"}

    def convert_checkpoint(self, state):
        return clean_state_dict(state)

    def read_checkpoint(self, path):
        return None

    def reads_natively(self, path) -> bool:
        return False
