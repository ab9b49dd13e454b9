"""Record the official PiToMe outputs (Tran et al., NeurIPS 2024, hchautran/PiToMe) for deploytk's tests.

Runs the official code of a checkout (``algo/pitome/merge.py`` and ``algo/pitome/patch/timm.py``: ``pitome_vision``,
``merge_wavg``, ``PiToMeBlock``, ``PiToMeAttention``; read at commit 550b5de) and writes ``tests/data/pitome_official.npz``:

- ``{model}_ratio{ratio}_logits`` / ``_tokens``: a DeiT (timm weights from ``tests/helpers/weights.py::seeded_init(model,
  seed=1)``, inputs ``seeded_images(2, seed=2)``) whose blocks are the official ``PiToMeBlock`` / ``PiToMeAttention``
  (set on timm's modules as the official ``apply_patch`` does), with the official DeiT schedule of
  ``make_pitome_class`` / ``apply_patch``: keep ``ratio`` of the non-class tokens in every block (r = floor(T - T*ratio)),
  margin 0.75 - 0.75 * i / depth in block i, the energy-sorted bipartite matching (``pitome_bsm``) in the first
  ceil(depth / 2) blocks and the protected variant (``pitome``) in the rest; the class token is protected. The official
  blocks run plain attention (no proportional attention: ``PiToMeBlock`` passes no size) and ``merge_wavg``'s
  size-weighted average. ``_tokens``: the tokens entering each block;
- ``match_{variant}_{i}_{metric,x,margin,r,out_x,out_size}``: ``pitome_vision`` + ``merge_wavg`` on seeded random
  metrics and tokens (class token first) for the two variants, the op-level check.

The official DeiT model class (``forward_features``) reads ``dist_token`` and ``pre_logits``, which timm 1.0's
VisionTransformer does not have, and its package ``__init__`` imports every patch (LAVIS, BERT); so the script loads
only ``merge.py`` and ``patch/timm.py`` (under stub parent packages) and runs timm's own embedding, final norm and head
around the official blocks. Only the recorded outputs are kept in the repository, not the official code.

Usage: python scripts/record_pitome_official.py PATH/TO/PiToMe
"""

from __future__ import annotations

import importlib
import math
import sys
import types
from pathlib import Path

import numpy as np
import timm
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers import seeded_images, seeded_init  # noqa: E402

OUT = ROOT / "tests" / "data" / "pitome_official.npz"
MODELS = {"deit_tiny": "deit_tiny_patch16_224", "deit_small": "deit_small_patch16_224"}
RATIOS = (0.9, 0.925)  # the official eval scripts' DeiT sweep: 0.9 .. 0.975


def official(repo: Path):
    """``algo.pitome.merge`` and ``algo.pitome.patch.timm`` of the checkout, without the package ``__init__`` files."""
    for name, folder in (("algo", "algo"), ("algo.pitome", "algo/pitome"), ("algo.pitome.patch", "algo/pitome/patch")):
        package = types.ModuleType(name)
        package.__path__ = [str(repo / folder)]
        sys.modules[name] = package
    return importlib.import_module("algo.pitome.merge"), importlib.import_module("algo.pitome.patch.timm")


def margins(depth: int) -> list[float]:
    """``apply_patch``'s per-block margins for DeiT."""
    return [0.75 - 0.75 * (i / depth) for i in range(depth)]


def run_model(patch, vit, images: torch.Tensor, ratio: float) -> tuple[np.ndarray, list[int]]:
    depth = len(vit.blocks)
    bsm_layers = math.ceil(depth * 0.5)
    info = {
        "ratio": [ratio] * depth,
        "use_bsm_pitome": [True] * bsm_layers + [False] * (depth - bsm_layers),
        "size": None,
        "source": None,
        "trace_source": False,
        "class_token": True,
    }
    for i, block in enumerate(vit.blocks):
        block.__class__ = patch.PiToMeBlock
        block.attn.__class__ = patch.PiToMeAttention
        block._info = info
        block.init_margin(margins(depth)[i])
    tokens = []
    with torch.no_grad():
        x = vit.norm_pre(vit._pos_embed(vit.patch_embed(images)))
        for block in vit.blocks:
            tokens.append(x.shape[1])
            x = block(x)
        logits = vit.head(vit.norm(x)[:, 0])
    return logits.numpy(), tokens


def record_matches(merge, out: dict) -> None:
    gen = torch.Generator().manual_seed(5)
    for variant, use_bsm_pitome in (("bsm", True), ("protected", False)):
        for i, (tokens, ratio, margin) in enumerate(((17, 0.75, 0.5), (65, 0.9, 0.25), (197, 0.9, 0.75))):
            metric = torch.randn(2, tokens, 16, generator=gen)
            x = torch.randn(2, tokens, 8, generator=gen)
            size = 1 + torch.randint(0, 3, (2, tokens, 1), generator=gen).float()
            fn = merge.pitome_vision(metric=metric, ratio=ratio, margin=margin, class_token=True, use_bsm_pitome=use_bsm_pitome)
            out_x, out_size = merge.merge_wavg(fn, x, size)
            key = f"match_{variant}_{i}_"
            r = math.floor((tokens - 1) - (tokens - 1) * ratio)
            out |= {
                key + "metric": metric.numpy(),
                key + "x": x.numpy(),
                key + "size": size.numpy(),
                key + "margin": np.float64(margin),
                key + "r": np.int64(r),
                key + "out_x": out_x.numpy(),
                key + "out_size": out_size.numpy(),
            }


def main(repo: Path) -> None:
    merge, patch = official(repo)
    out: dict[str, np.ndarray] = {}
    images = seeded_images(2, seed=2)
    for short, name in MODELS.items():
        for ratio in RATIOS:
            vit = seeded_init(timm.create_model(name), seed=1).eval()
            logits, tokens = run_model(patch, vit, images, ratio)
            out[f"{short}_ratio{ratio}_logits"] = logits
            out[f"{short}_ratio{ratio}_tokens"] = np.array(tokens)
            print(f"{short} ratio {ratio}: tokens {tokens}, logits[0, :3] {logits[0, :3]}")
    record_matches(merge, out)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} ({len(out)} arrays)")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not (Path(sys.argv[1]) / "algo" / "pitome" / "merge.py").is_file():
        raise SystemExit("usage: python scripts/record_pitome_official.py PATH/TO/PiToMe (a checkout with algo/pitome/merge.py)")
    main(Path(sys.argv[1]))
