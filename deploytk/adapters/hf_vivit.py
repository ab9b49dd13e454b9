"""Hugging Face transformers ViViT: ``VivitModel`` and ``VivitForVideoClassification``.

A clip ``pixel_values [B, T, 3, H, W]`` becomes tubelet tokens (a Conv3d over ``tubelet_size`` = (t, h, w)), time
first, after a class token (protected), with learned positions; pre-norm layers (``layernorm_before`` /
``layernorm_after``, ``attention`` with ``o_proj``, ``mlp``) and a final ``layernorm``. The classifier reads the class
token; ``VivitModel``'s ``pooler_output`` is its pooler (dense + activation) on the class token.
"""

from __future__ import annotations

from deploytk.adapters.base import register_family
from deploytk.adapters.hf_common import HFBlock, HFVideoFamily, OutputOf


@register_family
class HFViViT(HFVideoFamily):
    name = "hf-vivit"
    summary = "transformers VivitModel (pooler_output), VivitForVideoClassification (clips, class token)"
    modules = ("vivit",)
    classes = ("VivitModel", "VivitForVideoClassification")
    processor_class = "VivitImageProcessor"  # resize the short side, centre crop, rescaled to [-1, 1] (its offset)

    def check(self):
        model = self.model
        config = model.config
        self.backbone = getattr(model, "vivit", model)
        self.blocks = [HFBlock(layer, "attention", ("layernorm_before", "layernorm_after"), "o_proj") for layer in self.backbone.layers]
        self.has_class_token = True
        self.num_prefix_tokens = 1
        size = config.image_size
        self.img_size = (int(size), int(size)) if isinstance(size, int) else (int(size[0]), int(size[1]))
        t, h, w = (int(v) for v in config.tubelet_size)
        self.frames = int(config.num_frames)
        self.time_groups = self.frames // t
        self.grid_size = (self.img_size[0] // h, self.img_size[1] // w)
        self.embed_dim = int(config.hidden_size)
        self.mlp_dim = int(config.intermediate_size)
        self.pool = "token"
        self.classifier = type(model).__name__ == "VivitForVideoClassification"
        self.num_classes = int(config.num_labels) if self.classifier else 0
        pooler = getattr(self.backbone, "pooler", None)
        self.num_features = int(pooler.dense.out_features) if pooler is not None else self.embed_dim
        self.architecture = type(model).__name__
        self.output_key = "logits" if self.classifier else ("pooler_output" if pooler is not None else None)
        self.embedding_name = "pooler_output" if self.output_key == "pooler_output" else "embedding"

    def _prefix(self) -> str:
        return "" if self.backbone is self.model else "vivit."

    def embed(self, images):
        return self.backbone.embeddings(images)

    def final_norm(self, x):
        return self.backbone.layernorm(x)

    def pre_logits(self, x, size):
        """What the classifier reads: the class token; a model without a classifier: its pooler on it."""
        pooler = getattr(self.backbone, "pooler", None)
        return pooler(x) if pooler is not None and not self.classifier else x[:, 0]

    def head(self, x, size):
        return self.model.classifier(x[:, 0]) if self.classifier else self.pre_logits(x, size)

    def block_path(self, i):
        return f"{self._prefix()}layers.{i}"

    def patch_embedding_path(self):
        return f"{self._prefix()}embeddings.patch_embeddings"

    def plain(self):
        return OutputOf(self.model, self.output_key)
