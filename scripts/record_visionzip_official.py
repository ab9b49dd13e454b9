"""Record the official VisionZip outputs (Yang et al., CVPR 2025, dvlab-research/VisionZip) for deploytk's tests.

Runs the official ``CLIPVisionTower_VisionZip.forward`` (``visionzip/clip_encoder.py``, read at commit 3151f6d) on a
transformers ``CLIPVisionModel`` with LLaVA-1.5's tower geometry (336 px, patch 14: 576 patches + the class token) but
a small width and depth (hidden 64, 2 heads, 4 layers, so that layers[-2] exists as in the 24-layer tower), weights
from ``tests/helpers/weights.py::seeded_init(model, seed=3)``, eager attention, and writes ``tests/data/visionzip_official.npz``:

- ``images``: the inputs (``seeded_images(2, img=336, seed=4)``);
- ``tokens_{k}``, ``indices_{k}``: the official output (dominant tokens, class token first, then the contextual ones)
  and ``all_indices`` for LLaVA-1.5's budgets k = 64, 128, 192 tokens, as ``visionzip(model, dominant=D, contextual=C)``
  sets them: D + C = 54 + 10, 108 + 20, 162 + 30 (``dominant`` counts the class token: ``apply_info`` passes D - 1).

The official tower reads ``attentions[-2]`` and ``hidden_states[-2]`` of the forward and the keys of ``layers[-2]``
averaged over heads, which its patched ``CLIPAttention.forward`` (transformers 4.37) stores as ``metric``; here a
forward hook on that layer's ``k_proj`` stores the same average, and the official ``forward`` runs on a stand-in
``self`` that holds the model. ``visionzip/__init__.py`` imports LLaVA and ``utils.py`` transformers 4.37's classes, so
the script loads ``clip_encoder.py`` alone under a stub package (with a stub ``utils``: the two monkeypatches it imports
are not called by the forward). Only the recorded outputs are kept in the repository.

Usage: python scripts/record_visionzip_official.py PATH/TO/VisionZip
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import numpy as np
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers import VISIONZIP_BUDGETS as BUDGETS  # noqa: E402
from helpers import VISIONZIP_TOWER as TOWER  # noqa: E402
from helpers import seeded_images, seeded_init  # noqa: E402

OUT = ROOT / "tests" / "data" / "visionzip_official.npz"


def official_tower_class(repo: Path):
    package = types.ModuleType("visionzip")
    package.__path__ = [str(repo / "visionzip")]
    sys.modules["visionzip"] = package
    # utils.py holds the transformers-4.37 monkeypatches (its imports fail on transformers 5); clip_encoder.py imports two
    # of them for the patching that main.py does, and the forward recorded here does not call them
    utils = types.ModuleType("visionzip.utils")
    utils.CLIPAttention_forward = utils.CLIP_EncoderLayer_forward = None
    sys.modules["visionzip.utils"] = utils
    return importlib.import_module("visionzip.clip_encoder").CLIPVisionTower_VisionZip


class Tower:
    """What the official forward reads from ``self.vision_tower``: the call, ``vision_model`` and ``_info``."""

    def __init__(self, model, dominant: int, contextual: int):
        self.model = model
        self.vision_model = getattr(model, "vision_model", model)  # transformers 5's CLIPVisionModel is the tower itself
        self._info = {"dominant": dominant - 1, "contextual": contextual}  # as apply_info(dominant_num=dominant - 1)

    def __call__(self, images, output_hidden_states, output_attentions):
        return self.model(pixel_values=images, output_hidden_states=output_hidden_states, output_attentions=output_attentions)


def main(repo: Path) -> None:
    forward = official_tower_class(repo).forward
    config = transformers.CLIPVisionConfig(**TOWER)
    model = seeded_init(transformers.CLIPVisionModel._from_config(config, attn_implementation="eager"), seed=3)
    layer = getattr(model, "vision_model", model).encoder.layers[-2]
    heads = config.num_attention_heads

    def keep_metric(module, inputs, keys):  # the patched CLIPAttention's raw_key_states.mean(1): keys averaged over heads
        b, n, c = keys.shape
        layer.metric = keys.view(b, n, heads, c // heads).mean(2)

    layer.self_attn.k_proj.register_forward_hook(keep_metric)
    images = seeded_images(2, img=336, seed=4)
    out = {"images": images.numpy()}
    for k, (dominant, contextual) in BUDGETS.items():
        tower = types.SimpleNamespace(vision_tower=Tower(model, dominant, contextual), device=images.device, dtype=images.dtype)
        tokens, indices = forward(tower, images)
        assert tokens.shape == (2, k, config.hidden_size), tokens.shape
        out[f"tokens_{k}"], out[f"indices_{k}"] = tokens.numpy(), indices.numpy()
        print(f"{k} tokens: {dominant} dominant (class token included) + {contextual} contextual, output {tuple(tokens.shape)}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} ({len(out)} arrays)")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not (Path(sys.argv[1]) / "visionzip" / "clip_encoder.py").is_file():
        raise SystemExit("usage: python scripts/record_visionzip_official.py PATH/TO/VisionZip (a checkout with visionzip/clip_encoder.py)")
    main(Path(sys.argv[1]))
