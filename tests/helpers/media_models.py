"""Tiny video and audio classifiers (VideoMAE, AST) for the tests that package and serve them: built from small configs
with seeded random weights, saved with save_pretrained (no download) and exported as `model: hf:<folder>` with ToMe.

The same sizes as tests/families/test_video_audio.py: a 4-frame 32x32 clip ``pixel_values [batch, 4, 3, 32, 32]`` and a
100 x 48 spectrogram ``input_values [batch, 100, 48]``, 5 classes each.
"""

from __future__ import annotations

from pathlib import Path

from helpers.weights import seeded_init

_LAYERS = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=2, intermediate_size=128, num_labels=5)
#: name -> (transformers model class, its config class, the config, one sample's shape)
TINY = {
    "videomae": (
        "VideoMAEForVideoClassification",
        "VideoMAEConfig",
        dict(image_size=32, patch_size=8, num_frames=4, tubelet_size=2, **_LAYERS),
        (4, 3, 32, 32),
    ),
    "ast": (
        "ASTForAudioClassification",
        "ASTConfig",
        dict(patch_size=16, frequency_stride=10, time_stride=10, max_length=100, num_mel_bins=48, **_LAYERS),
        (100, 48),
    ),
}


def export_tiny(name: str, root: Path, r: int = 4) -> Path:
    """The tiny ``name`` model saved under ``root/name-model`` and exported with ToMe ``r`` to ``root/name``."""
    import transformers

    import deploytk

    model_class, config_class, settings, _ = TINY[name]
    folder = root / f"{name}-model"
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**settings))
    seeded_init(model, seed=20).save_pretrained(folder)
    return deploytk.export(f"hf:{folder}", root / name, method="tome", r=r).directory
