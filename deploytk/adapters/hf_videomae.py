"""Hugging Face transformers VideoMAE: ``VideoMAEModel`` and ``VideoMAEForVideoClassification``.

A clip ``pixel_values [B, T, 3, H, W]`` becomes (T / tubelet) x (H / patch) x (W / patch) tubelet tokens (a Conv3d),
time first, plus fixed sinusoidal positions; there is no class token, so every token may merge. Pre-norm layers
(``layernorm_before`` / ``layernorm_after``) with the older BERT-style attention (``query`` / ``key`` / ``value``, the
output projection in ``attention.output.dense``) and MLP (``intermediate.dense``, then ``output.dense`` plus the
residual). The classifier mean-pools the last tokens and normalises the mean (``fc_norm``, ``use_mean_pooling``): a
merged token weighs its size in that mean, so the pooled feature of an unreduced clip is unchanged. ``VideoMAEModel``
built with mean pooling has no final norm; deploytk's embedding of it is the same size-weighted mean of its
``last_hidden_state``.
"""

from __future__ import annotations

from torch import nn

from deploytk.adapters.base import BlockParts, pool_tokens, register_family
from deploytk.adapters.hf_common import HFVideoFamily, OutputOf, image_grid
from deploytk.errors import DeploytkError


class VideoMAEBlock(BlockParts):
    """``x + attention(layernorm_before(x))`` then ``x + output.dense(intermediate(layernorm_after(x)))``."""

    def __init__(self, layer: nn.Module):
        self.layer = layer
        attention = layer.attention.attention
        self.num_heads = int(attention.num_attention_heads)
        self.head_dim = int(attention.attention_head_size)
        self.scale = float(attention.scaling)

    def attn_input(self, x):
        return self.layer.layernorm_before(x)

    def qkv(self, h, which="qkv"):
        attention = self.layer.attention.attention
        b, n, _ = h.shape
        projections = {"q": attention.query, "k": attention.key, "v": attention.value}
        return [projections[name](h).view(b, n, self.num_heads, self.head_dim).transpose(1, 2) for name in which]

    def attn_output(self, out, gate=None):
        b, _, n, _ = out.shape
        return self.layer.attention.output.dense(out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim))

    def attn_residual(self, x, out):
        return x + out

    def mlp_residual(self, x):
        return x + self.layer.output.dense(self.layer.intermediate(self.layer.layernorm_after(x)))


class MeanPooled(nn.Module):
    """``VideoMAEModel`` reduced to one output: the mean of its ``last_hidden_state`` (the embedding deploytk exports)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).last_hidden_state.mean(1)


@register_family
class HFVideoMAE(HFVideoFamily):
    name = "hf-videomae"
    summary = "transformers VideoMAEModel (mean-pooled embedding), VideoMAEForVideoClassification (clips, no class token)"
    modules = ("videomae",)
    classes = ("VideoMAEModel", "VideoMAEForVideoClassification")
    processor_class = "VideoMAEImageProcessor"  # resize the short side, centre crop, ImageNet's mean/std

    def check(self):
        model = self.model
        config = model.config
        self.backbone = getattr(model, "videomae", model)
        self.classifier = type(model).__name__ == "VideoMAEForVideoClassification"
        if self.classifier and getattr(model, "fc_norm", None) is None:
            raise DeploytkError(
                "this VideoMAEForVideoClassification is built with `use_mean_pooling=False`: its classifier reads the first "
                "patch token, which token reduction merges away; deploytk runs the mean-pooled classifier only."
            )
        self.blocks = [VideoMAEBlock(layer) for layer in self.backbone.encoder.layer]
        self.has_class_token = False
        self.num_prefix_tokens = 0
        self.img_size, self.grid_size = image_grid(config)
        self.tubelet = int(config.tubelet_size)
        self.frames = int(config.num_frames)
        self.time_groups = self.frames // self.tubelet
        self.embed_dim = int(config.hidden_size)
        self.mlp_dim = int(config.intermediate_size)
        self.pool = "avg"
        self.num_classes = int(config.num_labels) if self.classifier else 0
        self.num_features = self.embed_dim
        self.architecture = type(model).__name__

    def _prefix(self) -> str:
        return "" if self.backbone is self.model else "videomae."

    def embed(self, images):
        return self.backbone.embeddings(images, None)

    def final_norm(self, x):
        return x if self.backbone.layernorm is None else self.backbone.layernorm(x)

    def pre_logits(self, x, size):
        """The size-weighted mean of the tokens, through ``fc_norm`` for the classifier."""
        mean = pool_tokens(x, size, "avg", 0)
        return self.model.fc_norm(mean) if self.classifier else mean

    def head(self, x, size):
        features = self.pre_logits(x, size)
        return self.model.classifier(features) if self.classifier else features

    def block_path(self, i):
        return f"{self._prefix()}encoder.layer.{i}"

    def patch_embedding_path(self):
        return f"{self._prefix()}embeddings.patch_embeddings"

    def plain(self):
        return OutputOf(self.model, "logits") if self.classifier else MeanPooled(self.model)
