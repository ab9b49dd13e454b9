"""Hugging Face transformers CLIP image towers: ``CLIPVisionModel`` and ``CLIPVisionModelWithProjection``.

The embeddings are followed by CLIP's ``pre_layrnorm``; pre-norm layers (``layer_norm1`` /
``layer_norm2``, ``self_attn`` with ``out_proj``); ``post_layernorm`` normalises the class token
into ``pooler_output``, which the projection variant maps to ``image_embeds``. (Applied to every
token, ``post_layernorm`` is per token, so normalising all and reading the class token is the same.)
"""

from __future__ import annotations

from deploytk.adapters.base import register_family
from deploytk.adapters.hf_common import HFBlock, HFFamily, OutputOf, image_grid

_OPENAI_CLIP = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))


@register_family
class HFCLIP(HFFamily):
    name = "hf-clip"
    summary = "transformers CLIPVisionModel (pooler_output), CLIPVisionModelWithProjection (image_embeds)"
    modules = ("clip",)
    classes = ("CLIPVisionModel", "CLIPVisionModelWithProjection")

    def check(self):
        model = self.model
        self.tower = getattr(model, "vision_model", model)
        config = model.config
        self.blocks = [HFBlock(layer, "self_attn", ("layer_norm1", "layer_norm2"), "out_proj") for layer in self.tower.encoder.layers]
        self.has_class_token = True
        self.num_prefix_tokens = 1
        self.img_size, self.grid_size = image_grid(config)
        self.embed_dim = int(config.hidden_size)
        self.mlp_dim = int(config.intermediate_size)
        self.pool = "token"
        self.projection = getattr(model, "visual_projection", None)
        self.num_classes = 0
        self.num_features = int(self.projection.out_features) if self.projection is not None else self.embed_dim
        self.architecture = type(model).__name__
        self.embedding_name = "image_embeds" if self.projection is not None else "pooler_output"

    def _prefix(self) -> str:
        return "" if self.tower is self.model else "vision_model."

    def embed(self, images):
        return self.tower.pre_layrnorm(self.tower.embeddings(images))

    def final_norm(self, x):
        return self.tower.post_layernorm(x)

    def features(self, x):
        """``last_hidden_state``: CLIP normalises the class token alone (``post_layernorm``), not the patch tokens."""
        return x

    def head(self, x, size):
        return self.projection(x[:, 0]) if self.projection is not None else x[:, 0]

    def block_path(self, i):
        return f"{self._prefix()}encoder.layers.{i}"

    def patch_embedding_path(self):
        return f"{self._prefix()}embeddings.patch_embedding"

    def image_processor_settings(self):
        return _OPENAI_CLIP  # CLIPImageProcessor: OpenAI's mean/std

    def plain(self):
        return OutputOf(self.model, "image_embeds" if self.projection is not None else "pooler_output")
