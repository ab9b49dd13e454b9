"""Hugging Face transformers ViT and DeiT: ``ViTModel``, ``ViTForImageClassification``, ``DeiTModel``,
``DeiTForImageClassification`` and ``DeiTForImageClassificationWithTeacher`` (class + distillation token).

Pre-norm layers (``layernorm_before`` / ``layernorm_after``), a final ``layernorm``; the
classifiers read the class token (the teacher variant averages the class and distillation
heads, as transformers does at inference), ``ViTModel`` / ``DeiTModel`` give their
``pooler_output`` (dense + tanh of the class token), or the class token itself when built
without a pooler.
"""

from __future__ import annotations

from deploytk.adapters.base import register_family
from deploytk.adapters.hf_common import HFBlock, HFFamily, OutputOf, image_grid

_IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


@register_family
class HFViT(HFFamily):
    name = "hf-vit"
    summary = "transformers ViTModel, ViTForImageClassification, DeiTModel, DeiTForImageClassification(WithTeacher)"
    modules = ("vit", "deit")
    classes = (
        "ViTModel",
        "ViTForImageClassification",
        "DeiTModel",
        "DeiTForImageClassification",
        "DeiTForImageClassificationWithTeacher",
    )

    def check(self):
        model = self.model
        self.backbone = getattr(model, "vit", None) or getattr(model, "deit", None) or model
        config = model.config
        self.blocks = [HFBlock(layer, "attention", ("layernorm_before", "layernorm_after"), "o_proj") for layer in self.backbone.layers]
        self.deit = type(model).__name__.startswith("DeiT")
        self.has_class_token = True
        self.has_dist_token = self.deit
        self.num_prefix_tokens = 2 if self.deit else 1
        self.img_size, self.grid_size = image_grid(config)
        self.embed_dim = int(config.hidden_size)
        self.mlp_dim = int(config.intermediate_size)
        self.pool = "token"
        self.classifier = type(model).__name__.endswith(("ForImageClassification", "WithTeacher"))
        self.num_classes = int(config.num_labels) if self.classifier else 0
        pooler = getattr(self.backbone, "pooler", None)
        self.num_features = int(getattr(config, "pooler_output_size", None) or config.hidden_size) if pooler else self.embed_dim
        self.architecture = type(model).__name__
        self.output_key = "logits" if self.classifier else ("pooler_output" if pooler is not None else None)
        self.embedding_name = "pooler_output" if self.output_key == "pooler_output" else "embedding"

    def embed(self, images):
        return self.backbone.embeddings(images)

    def final_norm(self, x):
        return self.backbone.layernorm(x)

    def head(self, x, size):
        model = self.model
        if hasattr(model, "distillation_classifier"):  # the teacher variant: both heads averaged, as at inference
            return (model.cls_classifier(x[:, 0]) + model.distillation_classifier(x[:, 1])) / 2
        if self.classifier:
            return model.classifier(x[:, 0])
        return self.pre_logits(x, size)

    def pre_logits(self, x, size):
        """What the classifier reads: the class token (the teacher variant: class and distillation tokens averaged, as
        timm's distilled DeiT does); a model without a classifier: its ``pooler_output`` or the class token."""
        if hasattr(self.model, "distillation_classifier"):
            return (x[:, 0] + x[:, 1]) / 2
        if self.classifier:
            return x[:, 0]
        pooler = getattr(self.backbone, "pooler", None)
        return pooler(x) if pooler is not None else x[:, 0]

    def block_path(self, i):
        prefix = "" if self.backbone is self.model else ("deit." if self.deit else "vit.")
        return f"{prefix}layers.{i}"

    def patch_embedding_path(self):
        return ("" if self.backbone is self.model else ("deit." if self.deit else "vit.")) + "embeddings.patch_embeddings"

    def image_processor_settings(self):
        # ViTImageProcessor normalises with 0.5, DeiTImageProcessor with ImageNet's mean/std
        return _IMAGENET if self.deit else ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))

    def plain(self):
        return OutputOf(self.model, self.output_key)
