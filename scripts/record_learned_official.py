"""Record the official DynamicViT, PatchMerger, SiT, Sinkhorn and learned-weight DPC-KNN outputs of "Which Tokens to Use?".

Runs the study's own model classes (JoakimHaurum/TokenReduction at commit 88fe07e:
``models/dyvit.py``, ``patchmerger.py``, ``sit.py``, ``sinkhorn.py``, and ``dpcknn.py``
without ``--equal_weight``, i.e. with its learned token score) in eval mode and writes
``tests/data/learned_official.npz``:

- ``{method}_{model}_k{keep}_logits``: the official forward on timm weights from
  ``tests/helpers/weights.py::seeded_init(model, seed=1)``, the learned layers from
  ``seeded_learned_state(official_learned_layout(...), seed=3)`` loaded strictly into the
  official modules (so the layout is the official one), inputs ``seeded_images(2, seed=2)``,
  reducing before blocks 3, 6, 9, at DeiT-S 0.7 and DeiT-T 0.5 (Sinkhorn: eps 1, 3 rounds;
  DPC-KNN: 5 neighbours, its 1e-6 density noise set to 0, as in record_study_official.py);
- ``{method}_{model}_k{keep}_tokens``: the tokens each block's MLP received, at the study's
  keep rates 0.25, 0.5, 0.7, 0.9;
- ``{method}_{model}_k{keep}_keys``: the official model's full state_dict as "key:shape"
  strings, the checkpoint layout deploytk must load.

The official classes need timm 0.4's constructor, so the script builds them without their
``__init__`` from the current timm model's modules, exactly as that ``__init__`` would
(DynamicViT: its own ``Block_DyVIT`` with LayerNorm eps 1e-6, the timm block weights loaded
into it; the others keep timm's blocks). Only the recorded outputs are kept in the repository.

Usage: python scripts/record_learned_official.py PATH/TO/TokenReduction
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import numpy as np
import timm
import torch
from record_study_official import KEEP_RATES, LOGITS_AT, MODELS, REDUCTION_LOC, load
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers import official_learned_layout, seeded_images, seeded_init, seeded_learned_state  # noqa: E402

OUT = ROOT / "tests" / "data" / "learned_official.npz"
CLASSES = {
    "dynamicvit": ("dyvit", "DynamicVisionTransformer"),
    "patchmerger": ("patchmerger", "PatchMergerVisionTransformer"),
    "sit": ("sit", "SelfSlimmedVisionTransformer"),
    "sinkhorn": ("sinkhorn", "SinkhornVisionTransformer"),
    "dpcknn": ("dpcknn", "DPCKNNVisionTransformer"),
}


def official_model(module, method: str, vit, keep_rate: float):
    """The official model class around ``vit``'s modules, set up as its ``__init__`` does."""
    cls = getattr(module, CLASSES[method][1])
    model = cls.__new__(cls)
    nn.Module.__init__(model)
    for attr in ("patch_embed", "cls_token", "pos_embed", "pos_drop", "norm", "head"):
        setattr(model, attr, getattr(vit, attr))
    model.pre_logits = nn.Identity()
    model.num_tokens = 1
    model.viz_mode = False
    dim, heads = vit.embed_dim, vit.blocks[0].attn.num_heads
    counts = [int(vit.patch_embed.num_patches * keep_rate ** (idx + 1)) for idx in range(len(REDUCTION_LOC))]
    if method == "dynamicvit":
        model.num_patches = vit.patch_embed.num_patches
        model.pruning_loc = REDUCTION_LOC
        model.token_ratio = [keep_rate ** (idx + 1) for idx in range(len(REDUCTION_LOC))]
        model.dyvit_distillation = False
        model.score_predictor = nn.ModuleList([module.PredictorLG(dim) for _ in REDUCTION_LOC])
        blocks = []
        for blk in vit.blocks:
            ob = module.Block_DyVIT(dim, heads, mlp_ratio=4.0, qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6))
            ob.load_state_dict(blk.state_dict())
            blocks.append(ob)
        model.blocks = nn.ModuleList(blocks)
    else:
        model.cluster_loc = REDUCTION_LOC
        model.cluster_count = counts
        if method == "patchmerger":
            layers = [module.PatchMerger(dim, c) for c in counts]
        elif method == "sit":
            layers = [module.TokenSlimmingModule(dim, c) for c in counts]
        elif method == "dpcknn":
            layers = [module.CTM(dim, c, 5, equal_weight=False) for c in counts]
        else:
            layers = [module.Sinkhorn(dim, c, 1.0, 3) for c in counts]
        model.cluster_layers = nn.ModuleList(layers)
        model.blocks = nn.ModuleList([*vit.blocks])
    prefix = "score_predictor" if method == "dynamicvit" else "cluster_layers"
    learned = seeded_learned_state(official_learned_layout(method, dim, counts), seed=3)
    getattr(model, prefix).load_state_dict({k.removeprefix(prefix + "."): v for k, v in learned.items()}, strict=True)
    return model.eval()


@contextmanager
def no_density_noise(module):
    """DPC-KNN's density noise (``torch.rand`` * 1e-6) set to 0: deploytk breaks those ties by index."""
    rand = module.torch.rand
    module.torch.rand = lambda shape, device=None, dtype=None: torch.zeros(shape, device=device, dtype=dtype)
    try:
        yield
    finally:
        module.torch.rand = rand


def main(repo: Path) -> None:
    modules = {method: load(repo, file) for method, (file, _) in CLASSES.items()}
    out = {}
    for key, name in MODELS.items():
        for keep in KEEP_RATES:
            for method, module in modules.items():
                model = official_model(module, method, seeded_init(timm.create_model(name), seed=1), keep)
                seen = []
                for blk in model.blocks:
                    blk.mlp.register_forward_pre_hook(lambda _m, args, seen=seen: seen.append(int(args[0].shape[1])))
                with torch.no_grad(), no_density_noise(module):
                    logits = model(seeded_images(2 if (key, keep) in LOGITS_AT else 1, seed=2))
                out[f"{method}_{key}_k{keep}_tokens"] = np.array(seen[: len(model.blocks)])
                out[f"{method}_{key}_k{keep}_keys"] = np.array([f"{k}:{list(v.shape)}" for k, v in model.state_dict().items()])
                if (key, keep) in LOGITS_AT:
                    out[f"{method}_{key}_k{keep}_logits"] = logits.numpy()
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} ({len(out)} arrays)")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
