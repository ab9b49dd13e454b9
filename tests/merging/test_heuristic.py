"""The l1/l2/l-inf heuristic of "Which Tokens to Use?": the official code's kept tokens, and pruning == its attention mask."""

from pathlib import Path

import numpy as np
import pytest
import timm
import torch

from deploytk.adapters import adapt
from deploytk.errors import DeploytkError
from deploytk.merging.merged_vit import build_merged
from deploytk.reducers import get_method
from deploytk.reducers.heuristic import radial_distance, stage_radii

from helpers import seeded_init

RECORDED = np.load(Path(__file__).parents[1] / "data" / "heuristic_official_masks.npz")
LAYERS = [3, 6, 9]


def heuristic(vit, **options):
    method = get_method("heuristic")
    return build_merged(method, vit, 0, False, method.parse_options({"layers": LAYERS, **options})).eval()


@pytest.mark.parametrize("key", sorted(RECORDED.files))
def test_kept_patches_equal_the_official_code(key):
    """Per block, the patches the official code leaves unmasked (recorded by scripts/record_heuristic_official.py)."""
    grid, pattern, keep_rate = key.split("_")
    grid, keep_rate = int(grid.removeprefix("grid")), float(keep_rate.removeprefix("k"))
    distance = radial_distance(grid, pattern)
    radii = stage_radii(distance, keep_rate, len(LAYERS))
    radius_of_block = [max(distance)] * 12
    for stage, layer in enumerate(LAYERS):
        radius_of_block[layer:] = [radii[stage]] * (12 - layer)
    want = RECORDED[key]
    got = np.stack([(distance <= r).numpy() for r in radius_of_block])
    np.testing.assert_array_equal(got, want)


def tiny_vit(**kwargs):
    """12 blocks on an 8x8 patch grid (as the digits ViT), small width: the layers 3, 6, 9 exist and it runs fast."""
    args = dict(img_size=32, patch_size=4, embed_dim=48, num_heads=3, num_classes=10, depth=12) | kwargs
    return seeded_init(timm.create_model("vit_tiny_patch16_224", **args), seed=5)


@pytest.mark.parametrize("pattern", ["l1", "l2", "linf"])
def test_schedule_counts_the_official_kept_patches(pattern):
    model = heuristic(tiny_vit(), pattern=pattern, keep_rate=0.5)
    patches = RECORDED[f"grid8_{pattern}_k0.5"].sum(1)  # kept patches from each block on
    # tokens entering block i (before its pruning) are the class token and the patches kept before it
    assert model.schedule.tokens == [65] + [1 + int(p) for p in patches[:-1]]
    assert model.schedule.tokens_out == 1 + int(patches[-1])


def masked_forward(vit, masks, images):
    """The official formulation, written independently: no token is removed; from its reduction block on, a
    pruned patch is masked out of attention (logits -max for every pair it is part of), the head reads the class token."""
    x = vit.norm_pre(vit._pos_embed(vit.patch_embed(images)))
    for blk, parts, keep in zip(vit.blocks, adapt(vit).blocks, masks, strict=True):
        mask = torch.cat([torch.ones(1, dtype=torch.bool), torch.from_numpy(keep)])  # the class token is always kept
        h = blk.norm1(x)
        q, k, v = parts.qkv(h)
        logits = (q * blk.attn.scale) @ k.transpose(-2, -1)
        pair = mask[None, None, :, None] & mask[None, None, None, :]
        logits = logits.masked_fill(~pair, -torch.finfo(logits.dtype).max)
        x = x + blk.ls1(parts.attn_output(logits.softmax(-1) @ v))
        x = x + blk.ls2(blk.mlp(blk.norm2(x)))
    return vit.head(vit.fc_norm(vit.norm(x)[:, 0]))


@pytest.mark.parametrize("pattern, keep_rate", [("l1", 0.7), ("l2", 0.5), ("linf", 0.25)])
def test_pruning_equals_the_official_attention_mask(pattern, keep_rate):
    vit = tiny_vit()
    images = torch.from_numpy(np.random.default_rng(6).standard_normal((3, 3, 32, 32)).astype(np.float32))
    with torch.no_grad():
        want = masked_forward(vit, RECORDED[f"grid8_{pattern}_k{keep_rate}"], images)
        got = heuristic(vit, pattern=pattern, keep_rate=keep_rate)(images)
        dense = vit(images)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert (got - dense).abs().max() > 1e-3  # pruning changed the output: the comparison could fail


def test_bad_options_and_models_are_refused():
    with pytest.raises(DeploytkError, match=r"`merge.options.pattern` = 'l3'"):
        get_method("heuristic").parse_options({"pattern": "l3"})
    with pytest.raises(DeploytkError, match="needs a square patch grid"):
        heuristic(tiny_vit(img_size=(32, 48)))
    with pytest.raises(DeploytkError, match=r"block indices must be in \[0, 3\]"):
        heuristic(tiny_vit(depth=4))


def test_a_clip_keeps_the_same_centre_patches_in_every_tubelet_group():
    """A video's patches are one grid per tubelet group (time first): the pattern applies to each grid, so every group
    keeps the patches the same pattern keeps on one image. (ViViT's 2 groups of 4x4 patches once failed inside the
    reference: the pattern covered one grid only.)"""
    import transformers

    config = transformers.VivitConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=32,
        num_frames=4,
        tubelet_size=[2, 8, 8],
    )
    vivit = seeded_init(transformers.VivitModel(config), seed=2)
    method = get_method("heuristic")
    model = build_merged(method, vivit, 0, False, method.parse_options({"layers": [1], "keep_rate": 0.5, "pattern": "l2"})).eval()
    distance = radial_distance(4, "l2")
    kept_on_one_grid = int((distance <= stage_radii(distance, 0.5, 1)[0]).sum())
    assert model.schedule.tokens == [1 + 32, 1 + 32] and model.schedule.tokens_out == 1 + 2 * kept_on_one_grid
    clips = torch.from_numpy(np.random.default_rng(3).standard_normal((2, 4, 3, 32, 32)).astype(np.float32))
    with torch.no_grad():
        assert model(clips).shape == (2, 32)
