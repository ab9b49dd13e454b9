"""Hugging Face transformers SigLIP image tower: ``SiglipVisionModel`` (its ``pooler_output``).

No class token: every token is a patch, so nothing is protected and a method that ranks tokens
by the class token's attention is refused. Pre-norm layers (``layer_norm1`` / ``layer_norm2``,
``self_attn`` with ``out_proj``), ``post_layernorm``, then the attention-pooling head: one
learned probe attends over the tokens (``nn.MultiheadAttention``), and a LayerNorm + MLP
residual follows. Over merged tokens the probe attends proportionally, with log(size) added
to its logits as the blocks do, so a token standing for k patches weighs as the k would.
"""

from __future__ import annotations

import torch.nn.functional as F

from deploytk.adapters.attention import attend, attention_probs
from deploytk.adapters.base import register_family
from deploytk.adapters.hf_common import HFBlock, HFFamily, OutputOf, image_grid
from deploytk.errors import DeploytkError


@register_family
class HFSiglip(HFFamily):
    name = "hf-siglip"
    summary = "transformers SiglipVisionModel (no class token; attention-pooling head, proportional over merged tokens)"
    modules = ("siglip",)
    classes = ("SiglipVisionModel",)

    def check(self):
        model = self.model
        self.tower = getattr(model, "vision_model", model)
        config = model.config
        if getattr(self.tower, "head", None) is None:
            raise DeploytkError(
                f"{type(model).__name__} was built with `vision_use_head: false`: it has no pooled output, and deploytk exports "
                "one output per image (patch features come with the outputs issue)."
            )
        self.blocks = [HFBlock(layer, "self_attn", ("layer_norm1", "layer_norm2"), "out_proj") for layer in self.tower.encoder.layers]
        self.has_class_token = False
        self.num_prefix_tokens = 0
        self.img_size, self.grid_size = image_grid(config)
        self.embed_dim = int(config.hidden_size)
        self.mlp_dim = int(config.intermediate_size)
        self.pool = "attention"
        self.num_classes = 0
        self.num_features = self.embed_dim
        self.architecture = type(model).__name__
        self.embedding_name = "pooler_output"

    def _prefix(self) -> str:
        return "" if self.tower is self.model else "vision_model."

    def embed(self, images):
        return self.tower.embeddings(images)

    def final_norm(self, x):
        return self.tower.post_layernorm(x)

    def head(self, x, size):
        """SiglipMultiheadAttentionPoolingHead with log(size) on the probe's logits (plain ops; fp32 softmax)."""
        head = self.tower.head
        mha = head.attention
        b, n, c = x.shape
        heads = mha.num_heads
        d = c // heads
        w, bias = mha.in_proj_weight, mha.in_proj_bias
        probe = head.probe.expand(b, -1, -1)

        def project(t, part):
            rows = slice(part * c, (part + 1) * c)
            return F.linear(t, w[rows], bias[rows] if bias is not None else None).view(b, t.shape[1], heads, d).transpose(1, 2)

        q, k, v = project(probe, 0), project(x, 1), project(x, 2)
        pooled = attend(attention_probs(d**-0.5, q, k, size), v).transpose(1, 2).reshape(b, 1, c)
        pooled = mha.out_proj(pooled)
        pooled = pooled + head.mlp(head.layernorm(pooled))
        return pooled[:, 0]

    def block_path(self, i):
        return f"{self._prefix()}encoder.layers.{i}"

    def patch_embedding_path(self):
        return f"{self._prefix()}embeddings.patch_embedding"

    def image_processor_settings(self):
        return (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)  # SiglipImageProcessor: mean/std 0.5

    def plain(self):
        return OutputOf(self.model, "pooler_output")
