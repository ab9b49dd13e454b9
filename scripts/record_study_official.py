"""Record the official K-Medoids, DPC-KNN and ATS outputs of "Which Tokens to Use?" for deploytk's tests.

Runs the study's own code (JoakimHaurum/TokenReduction, ``models/kmedoids.py``,
``models/dpcknn.py`` and ``models/ats.py``) and writes ``tests/data/study_official.npz``:

- ``{method}_{model}_k{keep}_logits``: the official model's forward (``KMedoidsVisionTransformer``
  token-weighted, 3 iterations; ``DPCKNNVisionTransformer`` with ``--equal_weight``, 5 neighbours)
  on timm weights from ``tests/helpers/weights.py::seeded_init(model, seed=1)`` and inputs
  ``seeded_images(2, seed=2)``, reducing before blocks 3, 6, 9;
- ``{method}_{model}_k{keep}_tokens``: the tokens each block received in that forward, for the
  study's keep rates 0.25, 0.5, 0.7, 0.9;
- ``ats_{model}_k{keep}_logits`` / ``_tokens``: ``ATSVisionTransformer`` (sampling in blocks 3, 6, 9);
  ``_logits_exact`` with the step-to-CDF distances taken exactly (``torch.cdist``'s
  ``donot_use_mm_for_euclid_dist`` mode): the default mode computes them as sqrt(s^2 + c^2 - 2sc),
  whose rounding (~3e-4 near 0) decides picks between two tokens, where deploytk takes |s - c|.
  ATS's token counts depend on the batch (it pads to the most tokens any image kept);
- ``kmedoids_fit_*`` / ``dpcknn_fit_*``: the official clustering functions on seeded random
  tokens (their chosen medoids / assignments), to check deploytk's ops on their own.

The official model classes need timm 0.4's constructor, so the script builds them without
their ``__init__`` from the current timm model's modules, exactly as that ``__init__`` would
(blocks with LayerNorm eps 1e-6; DPC-KNN keeps timm's blocks), and runs the official
``forward``. DPC-KNN adds uniform noise of 1e-6 to its densities; torch is seeded (0) before
each forward. ``dpcknn_*_logits_noiseless`` repeat the forward with that noise set to 0 (the
official module's ``torch.rand`` returning zeros): deploytk's DPC-KNN breaks density ties by
index instead, and on random weights the densities are ~1e-5..1e-3, so the noise itself moves
the official logits (by up to 0.07 across seeds on DeiT-S). Only the recorded outputs are kept
in the repository.

Usage: python scripts/record_study_official.py PATH/TO/TokenReduction
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from functools import partial
from pathlib import Path

import numpy as np
import timm
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers import seeded_images, seeded_init  # noqa: E402

OUT = ROOT / "tests" / "data" / "study_official.npz"
REDUCTION_LOC = [3, 6, 9]  # the study's blocks 4, 7 and 10, 0-indexed
KEEP_RATES = (0.25, 0.5, 0.7, 0.9)
MODELS = {"deit_small": "deit_small_patch16_224", "deit_tiny": "deit_tiny_patch16_224"}
LOGITS_AT = {("deit_small", 0.7), ("deit_tiny", 0.5)}  # the acceptance points; the rest: token counts


def load(repo: Path, name: str):
    spec = importlib.util.spec_from_file_location(f"official_{name}", repo / "models" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec.loader.exec_module(module)
    return module


def official_model(module, cls_name: str, vit, keep_rate: float, method: str):
    """The official model class around ``vit``'s modules, set up as its ``__init__`` does."""
    model = getattr(module, cls_name).__new__(getattr(module, cls_name))
    nn.Module.__init__(model)
    for attr in ("patch_embed", "cls_token", "pos_embed", "pos_drop", "norm", "head"):
        setattr(model, attr, getattr(vit, attr))
    model.pre_logits = nn.Identity()
    model.num_tokens = 1
    model.viz_mode = False
    model.cluster_loc = REDUCTION_LOC
    counts = [int(vit.patch_embed.num_patches * keep_rate ** (idx + 1)) for idx in range(len(REDUCTION_LOC))]
    dim, heads = vit.embed_dim, vit.blocks[0].attn.num_heads
    if method == "ats":
        model.sample_loc = REDUCTION_LOC
        samples = dict(zip(REDUCTION_LOC, counts, strict=True))
        blocks = []
        for i, blk in enumerate(vit.blocks):
            count = samples[i] + 1 if i in samples else 0  # ATS's bound: int(keep^(s+1) * patches) + 1
            ob = module.ATSBlock(
                dim, heads, mlp_ratio=4.0, qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6), ats_sample_count=count
            )
            ob.load_state_dict(blk.state_dict())
            blocks.append(ob)
        model.blocks = nn.ModuleList(blocks)
    elif method == "kmedoids":
        model.cluster_layers = nn.ModuleList([module.KMedoids(c, 3, False) for c in counts])
        blocks = []
        for blk in vit.blocks:
            ob = module.Block(dim, heads, mlp_ratio=4.0, qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6))
            ob.load_state_dict(blk.state_dict())
            blocks.append(ob)
        model.blocks = nn.ModuleList(blocks)
    else:
        model.cluster_layers = nn.ModuleList([module.CTM(dim, c, 5, True) for c in counts])
        model.blocks = nn.ModuleList([*vit.blocks])
    return model.eval()


def block_inputs(model) -> list[int]:
    """Record the token count each block's MLP receives during the next forward (ATS samples before it)."""
    seen = []
    for blk in model.blocks:
        blk.mlp.register_forward_pre_hook(lambda _m, args: seen.append(int(args[0].shape[1])))
    return seen


def exact_cdist(module, model) -> torch.Tensor:
    """The official ATS forward with torch.cdist in its exact (difference) mode."""
    cdist = module.torch.cdist
    module.torch.cdist = lambda a, b: cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist")
    try:
        with torch.no_grad():
            return model(seeded_images(2, seed=2))
    finally:
        module.torch.cdist = cdist


def noiseless(module, model) -> torch.Tensor:
    """The official DPC-KNN forward with its density noise (``torch.rand`` * 1e-6) set to 0."""
    rand = module.torch.rand
    module.torch.rand = lambda shape, device=None, dtype=None: torch.zeros(shape, device=device, dtype=dtype)
    try:
        with torch.no_grad():
            return model(seeded_images(2, seed=2))
    finally:
        module.torch.rand = rand


def main(repo: Path) -> None:
    modules = {"kmedoids": load(repo, "kmedoids"), "dpcknn": load(repo, "dpcknn"), "ats": load(repo, "ats")}
    classes = {"kmedoids": "KMedoidsVisionTransformer", "dpcknn": "DPCKNNVisionTransformer", "ats": "ATSVisionTransformer"}
    out = {}
    for key, name in MODELS.items():
        for keep in KEEP_RATES:
            for method, module in modules.items():
                vit = seeded_init(timm.create_model(name), seed=1)
                model = official_model(module, classes[method], vit, keep, method)
                seen = block_inputs(model)
                torch.manual_seed(0)
                with torch.no_grad():
                    logits = model(seeded_images(2 if (key, keep) in LOGITS_AT else 1, seed=2))
                out[f"{method}_{key}_k{keep}_tokens"] = np.array(seen[: len(model.blocks)])
                if (key, keep) in LOGITS_AT:
                    out[f"{method}_{key}_k{keep}_logits"] = logits.numpy()
                if (key, keep) in LOGITS_AT and method == "dpcknn":
                    out[f"{method}_{key}_k{keep}_logits_noiseless"] = noiseless(module, model).numpy()
                if (key, keep) in LOGITS_AT and method == "ats":
                    out[f"{method}_{key}_k{keep}_logits_exact"] = exact_cdist(module, model).numpy()
    gen = torch.Generator().manual_seed(5)
    for b, n, c, k in [(2, 196, 384, 137), (3, 96, 192, 48), (2, 20, 16, 6)]:
        x = torch.randn(b, n, c, generator=gen) + torch.randn(b, 1, c, generator=gen)
        weight = torch.rand(b, n, 1, generator=gen)
        _, medoids, _ = modules["kmedoids"].k_medoids_fit(x, k, 3, weight)
        out[f"kmedoids_fit_{n}x{c}_k{k}_x"] = x.numpy()
        out[f"kmedoids_fit_{n}x{c}_k{k}_weight"] = weight[..., 0].numpy()
        out[f"kmedoids_fit_{n}x{c}_k{k}_medoids"] = medoids.numpy()
        torch.manual_seed(0)
        assign, centres = modules["dpcknn"].cluster_dpc_knn(x, k, 5)
        out[f"dpcknn_fit_{n}x{c}_k{k}_centres"] = centres.numpy()
        out[f"dpcknn_fit_{n}x{c}_k{k}_assign"] = assign.numpy()
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} ({len(out)} arrays)")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
