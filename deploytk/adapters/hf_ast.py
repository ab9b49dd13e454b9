"""Hugging Face transformers Audio Spectrogram Transformer: ``ASTModel`` and ``ASTForAudioClassification``.

A spectrogram ``input_values [B, time, mel]`` (log-mel filter banks, ``ASTFeatureExtractor``) is cut into overlapping
16 x 16 patches (a Conv2d with ``frequency_stride`` / ``time_stride``) over the (mel, time) plane: the patch grid's rows
are frequencies and its columns times. Class and distillation tokens lead (both protected, never merged), learned
positions; pre-norm layers (``layernorm_before`` / ``layernorm_after``, ``attention`` with ``o_proj``, ``mlp``), a final
``layernorm``; the pooled output is the mean of the two leading tokens, which the classifier (``layernorm`` + ``dense``)
reads.
"""

from __future__ import annotations

from deploytk.adapters.base import register_family
from deploytk.adapters.hf_common import HFBlock, HFFamily, OutputOf
from deploytk.errors import DeploytkError
from deploytk.inputs import PatchGrid, SpectrogramInput


@register_family
class HFAST(HFFamily):
    name = "hf-ast"
    summary = "transformers ASTModel (pooler_output), ASTForAudioClassification (spectrograms, class + distillation tokens)"
    modules = ("audio_spectrogram_transformer",)
    classes = ("ASTModel", "ASTForAudioClassification")

    def check(self):
        model = self.model
        config = model.config
        self.backbone = getattr(model, "audio_spectrogram_transformer", model)
        self.blocks = [HFBlock(layer, "attention", ("layernorm_before", "layernorm_after"), "o_proj") for layer in self.backbone.layers]
        self.has_class_token = True
        self.has_dist_token = True
        self.num_prefix_tokens = 2
        frequencies, times = self.backbone.embeddings.get_shape(config)
        self.grid_size = (int(frequencies), int(times))
        self.time_steps, self.mel_bins = int(config.max_length), int(config.num_mel_bins)
        self.img_size = (self.mel_bins, self.time_steps)  # the (mel, time) plane the patch grid is cut from
        patch = int(config.patch_size)
        self._patches = PatchGrid(*self.grid_size, stride=(int(config.frequency_stride), int(config.time_stride)), size=(patch, patch))
        self.embed_dim = int(config.hidden_size)
        self.mlp_dim = int(config.intermediate_size)
        self.pool = "token"
        self.classifier = type(model).__name__ == "ASTForAudioClassification"
        self.num_classes = int(config.num_labels) if self.classifier else 0
        self.num_features = self.embed_dim
        self.architecture = type(model).__name__
        self.embedding_name = "pooler_output"

    def refuse_img_size(self, name, img_size):
        """An audio model has no image size: ``export.img_size`` may only be left out (or name the spectrogram's own
        (mel, time) plane, as an export of a model object records it)."""
        raise DeploytkError(
            f"`export.img_size` is for image and video models; {name} is an audio model whose input is its config.json's "
            "max_length x num_mel_bins spectrogram.",
            hint="Leave `export.img_size` out (or null).",
        )

    @property
    def input_kind(self):
        return SpectrogramInput(self.time_steps, self.mel_bins)

    @property
    def patch_grid(self):
        """Overlapping patches: ``patch_size`` squares ``frequency_stride`` x ``time_stride`` apart over (mel, time)."""
        return self._patches

    def _prefix(self) -> str:
        return "" if self.backbone is self.model else "audio_spectrogram_transformer."

    def embed(self, images):
        return self.backbone.embeddings(images)

    def final_norm(self, x):
        return self.backbone.layernorm(x)

    def pre_logits(self, x, size):
        """``pooler_output``: the class and distillation tokens averaged (what the classifier reads)."""
        return (x[:, 0] + x[:, 1]) / 2

    def head(self, x, size):
        pooled = self.pre_logits(x, size)
        return self.model.classifier(pooled) if self.classifier else pooled

    def block_path(self, i):
        return f"{self._prefix()}layers.{i}"

    def patch_embedding_path(self):
        return f"{self._prefix()}embeddings.patch_embeddings"

    def eval_transform(self):
        """A decoded sound (``input_kind.read``: mono float32 and its rate) -> ``[time, mel]`` through the model's saved
        ``ASTFeatureExtractor``, or one at the model's ``max_length`` and ``num_mel_bins`` (16 kHz, AudioSet's mean/std),
        after resampling to the extractor's rate."""
        extractor = self._feature_extractor()

        def transform(sound):
            samples = resample(sound.samples, sound.rate, extractor.sampling_rate)
            return extractor(samples, sampling_rate=extractor.sampling_rate, return_tensors="pt")["input_values"][0]

        return transform

    def normalization(self):
        extractor = self._feature_extractor()
        return (extractor.mean,), (extractor.std * 2,)

    def _feature_extractor(self):
        if getattr(self, "_extractor", None) is None:
            import transformers  # optional: deploytk[hf]; a model of it is loaded already

            extractor = self.saved_preprocessor(transformers.ASTFeatureExtractor)
            if extractor is None:  # the defaults at the model's size
                extractor = transformers.ASTFeatureExtractor(num_mel_bins=self.mel_bins, max_length=self.time_steps)
            if (extractor.num_mel_bins, extractor.max_length) != (self.mel_bins, self.time_steps):
                raise DeploytkError(
                    f"{self.model.name_or_path}'s feature extractor makes {extractor.max_length} x {extractor.num_mel_bins} "
                    f"spectrograms, but the model is built for {self.time_steps} x {self.mel_bins}.",
                    hint="Save the feature extractor that matches the model (max_length, num_mel_bins) with save_pretrained.",
                )
            self._extractor = extractor
        return self._extractor

    def plain(self):
        return OutputOf(self.model, "logits" if self.classifier else "pooler_output", argument="input_values")


def resample(samples, rate: int, target: int):
    """``samples`` at ``rate`` resampled to ``target`` Hz (scipy's polyphase filter); unchanged when the rates agree."""
    if rate == target:
        return samples
    from math import gcd

    from scipy.signal import resample_poly  # scipy comes with onnxruntime's and NNCF's dependencies

    g = gcd(int(rate), int(target))
    return resample_poly(samples, int(target) // g, int(rate) // g).astype("float32")
