"""Hugging Face transformers DINOv2: ``Dinov2Model`` and ``Dinov2WithRegistersModel``.

Pre-norm layers (``norm1`` / ``norm2``) with LayerScale (``layer_scale1`` / ``layer_scale2``),
a class token and, with registers, ``num_register_tokens`` register tokens after it (all
protected); the output is ``pooler_output``, the final-normed class token.
(``Dinov2ForImageClassification``, which concatenates the class token with the patch mean,
is not supported yet.)
"""

from __future__ import annotations

from deploytk.adapters.base import register_family
from deploytk.adapters.hf_common import HFBlock, HFFamily, OutputOf, image_grid


@register_family
class HFDinov2(HFFamily):
    name = "hf-dinov2"
    summary = "transformers Dinov2Model, Dinov2WithRegistersModel (class token, registers, LayerScale)"
    modules = ("dinov2", "dinov2_with_registers")
    classes = ("Dinov2Model", "Dinov2WithRegistersModel")

    def check(self):
        model, config = self.model, self.model.config
        self.blocks = [
            HFBlock(layer, "attention", ("norm1", "norm2"), "o_proj", ("layer_scale1", "layer_scale2")) for layer in model.encoder.layer
        ]
        self.has_class_token = True
        self.num_prefix_tokens = 1 + int(getattr(config, "num_register_tokens", 0) or 0)
        self.img_size, self.grid_size = image_grid(config)
        self.embed_dim = int(config.hidden_size)
        self.mlp_dim = int(model.encoder.layer[0].mlp.fc1.out_features)
        self.pool = "token"
        self.num_classes = 0
        self.num_features = self.embed_dim
        self.architecture = type(model).__name__
        self.embedding_name = "pooler_output"

    def embed(self, images):
        return self.model.embeddings(images)

    def final_norm(self, x):
        return self.model.layernorm(x)

    def head(self, x, size):
        return x[:, 0]

    def block_path(self, i):
        return f"encoder.layer.{i}"

    def patch_embedding_path(self):
        return "embeddings.patch_embeddings"

    def image_processor_settings(self):
        return (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # BitImageProcessor as DINOv2 configures it

    def plain(self):
        return OutputOf(self.model, "pooler_output")
