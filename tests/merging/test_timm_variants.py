"""Every supported timm ViT feature: r = 0 equals timm; r > 0 exported ONNX equals the reference."""

import json

import numpy as np
import pytest
import timm
import torch

from deploytk.backends.ort import ort_session
from deploytk.errors import DeploytkError
from deploytk.exporter.onnx_export import custom_op_counts, export_model
from deploytk.merging.merged_vit import MergedViT

from helpers import seeded_init, tome_model

# small depth/width keeps export fast; each entry exercises one timm feature
VARIANTS = {
    "plain_vit": ("vit_small_patch16_224", dict(depth=4)),
    "distilled_deit": ("deit_tiny_distilled_patch16_224", dict(depth=4)),
    "deit3_layerscale": ("deit3_small_patch16_224", dict(depth=4)),
    "qk_norm": ("vit_small_patch16_224", dict(depth=4, qk_norm=True)),
    "registers_gap": ("vit_base_patch16_reg4_gap_256", dict(depth=3, embed_dim=192, num_heads=3)),
    "avg_pool_no_cls": ("vit_small_patch16_224", dict(depth=4, global_pool="avg", class_token=False, fc_norm=True)),
    # max pooling reads no sizes: their last aggregation was dead code the ONNX optimizer removed, and export refused
    "max_pool": ("vit_small_patch16_224", dict(depth=3, global_pool="max")),
    "other_img_size": ("deit_tiny_patch16_224", dict(depth=4, img_size=160)),
    "res_post_norm": ("vit_small_patch16_224", dict(depth=3, block_fn=timm.models.vision_transformer.ResPostBlock)),
    "siglip_map_head": ("vit_base_patch16_siglip_224", dict(depth=3, embed_dim=192, num_heads=3)),
}


def build(name, kwargs):
    return seeded_init(timm.create_model(name, **kwargs), seed=3)


def images(vit, n=3):
    h, w = vit.patch_embed.img_size
    return torch.from_numpy(np.random.default_rng(4).standard_normal((n, 3, h, w)).astype(np.float32))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_r0_reproduces_timm(variant):
    vit = build(*VARIANTS[variant])
    x = images(vit)
    with torch.no_grad():
        torch.testing.assert_close(MergedViT.dense(vit)(x), vit(x), rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_onnx_equals_reference_with_merging(variant, tmp_path):
    vit = build(*VARIANTS[variant])
    model = tome_model(vit, 24)
    assert all(r > 0 for r in model.schedule.effective_r)
    x = images(vit)
    proto = export_model(model, model.family.input_kind, 2, 18, tmp_path / "m.onnx")
    counts = custom_op_counts(proto)
    # tokens and sizes per merge; the last block's sizes are dead code unless the head pools by size
    assert 2 * len(vit.blocks) - 1 <= counts.pop("TokenAggregate") <= 2 * len(vit.blocks)
    assert counts == {"ToMeMatch": len(vit.blocks), "ProportionalAttention": len(vit.blocks)}
    got = ort_session(tmp_path / "m.onnx").run(None, {"input": x.numpy()})[0]
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # merging really changed the output (the test could fail)
    with torch.no_grad():
        assert np.abs(vit(x).numpy() - want).max() > 1e-3


def test_size_weighted_average_pool():
    vit = build("vit_small_patch16_224", dict(depth=2, global_pool="avg", class_token=False, fc_norm=True))
    model = tome_model(vit, [40, 30])
    x = images(vit, 1)
    with torch.no_grad():
        feats = vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(x))))
        size = torch.ones_like(feats[..., :1])
        for i, blk in enumerate(model.family.blocks):
            feats, size = model.reduction.block(model, i, blk, feats, size)
        feats = vit.norm(feats)
        want = vit.head(vit.fc_norm((feats * size).sum(1) / size.sum(1)))
        torch.testing.assert_close(model(x), want)
        assert size.sum().item() == 196  # every patch is counted once


def test_unsupported_pool_is_rejected():
    vit = timm.create_model("vit_small_patch16_224", depth=1, global_pool="map")
    vit.attn_pool.pos_embed = torch.nn.Parameter(torch.zeros(196, 384))  # a pooling position embedding fixes the token count
    with pytest.raises(DeploytkError, match="global_pool='map' with AttentionPoolLatent \\(pos_embed=True"):
        MergedViT.dense(vit)


def test_the_attention_pool_weighs_a_merged_token_as_the_tokens_it_stands_for():
    """SigLIP's `map` head over [a (size 2), b] equals it over [a, a, b]: log(size) on the latent's logits."""
    vit = build("vit_base_patch16_siglip_224", dict(depth=1, embed_dim=192, num_heads=3))
    family = MergedViT.dense(vit).family
    a, b = torch.randn(2, 1, 1, 192).unbind(0)
    with torch.no_grad():
        merged = family.head(torch.cat([a, b], 1), torch.tensor([[[2.0], [1.0]]]))
        duplicated = family.head(torch.cat([a, a, b], 1), torch.ones(1, 3, 1))
        plain = family.head(torch.cat([a, b], 1), torch.ones(1, 2, 1))
    torch.testing.assert_close(merged, duplicated, rtol=1e-5, atol=1e-5)
    assert (merged - plain).abs().max() > 1e-3  # the size mattered


#: the constructor options users set on a timm ViT object (issue 53), each on a tiny model: what the model object's stored
#: recipe (``save_source``) must rebuild in another process. Seeded weights, so that an option that only changes the
#: forward a little (an activation, a norm placement) shows in the comparison.
TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)
CONSTRUCTOR_OPTIONS = {
    "token": ("vit_tiny_patch16_224", {}),
    "avg": ("vit_tiny_patch16_224", dict(global_pool="avg")),
    "avgmax": ("vit_tiny_patch16_224", dict(global_pool="avgmax")),
    "max": ("vit_tiny_patch16_224", dict(global_pool="max")),
    "map": ("vit_tiny_patch16_224", dict(global_pool="map")),
    "no_pool": ("vit_tiny_patch16_224", dict(global_pool="")),
    "avg_fc_norm_false": ("vit_tiny_patch16_224", dict(global_pool="avg", fc_norm=False)),
    "token_fc_norm_true": ("vit_tiny_patch16_224", dict(fc_norm=True)),
    "no_class_token_avg": ("vit_tiny_patch16_224", dict(class_token=False, global_pool="avg")),
    "no_class_token_map": ("vit_tiny_patch16_224", dict(class_token=False, global_pool="map")),
    "registers_no_class_token_avg": ("vit_tiny_patch16_224", dict(reg_tokens=4, class_token=False, global_pool="avg")),
    "registers": ("vit_tiny_patch16_224", dict(reg_tokens=4)),
    "no_embed_class": ("vit_tiny_patch16_224", dict(no_embed_class=True)),
    "pre_norm": ("vit_tiny_patch16_224", dict(pre_norm=True)),
    "final_norm_false": ("vit_tiny_patch16_224", dict(final_norm=False)),
    "final_norm_false_avg": ("vit_tiny_patch16_224", dict(final_norm=False, global_pool="avg")),
    "qk_norm": ("vit_tiny_patch16_224", dict(qk_norm=True)),
    "layer_scale": ("vit_tiny_patch16_224", dict(init_values=1e-5)),
    "no_qkv_bias": ("vit_tiny_patch16_224", dict(qkv_bias=False)),
    "no_proj_bias": ("vit_tiny_patch16_224", dict(proj_bias=False)),
    "no_pos_embed": ("vit_tiny_patch16_224", dict(pos_embed="none")),
    "avg_with_prefix": ("vit_tiny_patch16_224", dict(global_pool="avg", pool_include_prefix=True)),
    "scaled_norms": ("vit_tiny_patch16_224", dict(scale_attn_norm=True, scale_mlp_norm=True)),
    "gelu_tanh": ("vit_tiny_patch16_224", dict(act_layer="gelu_tanh")),
    "non_square": ("vit_tiny_patch16_224", dict(img_size=(32, 48))),
    "headless": ("vit_tiny_patch16_224", dict(num_classes=0)),
    "distilled_deit": ("deit_tiny_distilled_patch16_224", {}),
    "registers_gap": ("vit_base_patch16_reg4_gap_256", {}),
    "siglip_map_head": ("vit_base_patch16_siglip_224", {}),
    "deit3_layerscale": ("deit3_small_patch16_224", {}),
}


def rebuilt_from_recipe(held):
    """The model the stored recipe rebuilds, as another process reads it: through JSON (the manifest), from the folder."""
    from deploytk.config import DeployConfig
    from deploytk.exporter.artifacts import rebuild_config
    from deploytk.models import create_vit

    recipe = json.loads(json.dumps(held.recipe))
    return create_vit(rebuild_config(DeployConfig(model="memory:", export={"img_size": list(held.img_size)}), recipe, held.folder))


@pytest.mark.parametrize("variant", sorted(CONSTRUCTOR_OPTIONS))
def test_a_model_object_s_stored_recipe_rebuilds_it(variant):
    from deploytk.exporter.source import take

    name, options = CONSTRUCTOR_OPTIONS[variant]
    vit = build(name, TINY | options)
    held = take(vit)
    try:
        assert held.cannot_rebuild is None, held.cannot_rebuild
        rebuilt = rebuilt_from_recipe(held)
        assert type(rebuilt) is type(vit) and sorted(rebuilt.state_dict()) == sorted(vit.state_dict())
        x = images(vit, 2)
        with torch.no_grad():
            torch.testing.assert_close(rebuilt(x), vit(x), rtol=0, atol=1e-6)
    finally:
        held.close()


def test_a_model_built_without_create_model_is_read_back_from_its_modules():
    """timm records the constructor arguments in ``timm.create_model``; a model made by calling the architecture's function
    has no record, and its arguments are read from its modules: avg pooling means fc_norm, not no final norm."""
    from timm.models.vision_transformer import vit_tiny_patch16_224

    from deploytk.exporter.source import take

    vit = seeded_init(vit_tiny_patch16_224(**TINY, global_pool="avg", reg_tokens=2, pos_embed="none"), seed=3)
    assert not hasattr(vit, "_model_args")
    held = take(vit)
    try:
        assert held.cannot_rebuild is None, held.cannot_rebuild
        kwargs = held.recipe["model_kwargs"]
        assert (kwargs["final_norm"], kwargs["fc_norm"], kwargs["reg_tokens"], kwargs["pos_embed"]) == (True, True, 2, "none")
        x = images(vit, 2)
        with torch.no_grad():
            torch.testing.assert_close(rebuilt_from_recipe(held)(x), vit(x), rtol=0, atol=1e-6)
    finally:
        held.close()


@pytest.mark.parametrize("num_classes", [0, 5])
def test_a_model_that_pools_nothing_is_refused_at_export_unless_a_dense_output_is_asked(num_classes, tmp_path):
    """global_pool='': the model's output is one row per token (17 here); a reduced graph has fewer rows, which are not the
    model's (export wrote [batch, 13, C] and called it the model's logits or embedding). Refused at export with what to
    ask instead, nothing written; the dense outputs it names export and validate."""
    import deploytk

    vit = timm.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=num_classes, global_pool=""
    )
    with pytest.raises(
        DeploytkError, match=r"pools nothing \(`global_pool=''`\): its output \((logits|embedding)\) is one row per token"
    ) as err:
        deploytk.export(vit, tmp_path / "out", method="tome", r=2)
    assert "`export.output: tokens`" in str(err.value) and not (tmp_path / "out").exists()
    with torch.no_grad():  # without reduction the rows are the model's own
        torch.testing.assert_close(deploytk.patch(vit, "tome", r=0)(images(vit)), vit.eval()(images(vit)), rtol=1e-5, atol=1e-5)
    artifact = deploytk.export(vit, tmp_path / "tokens", method="tome", r=2, output_kind="tokens")
    assert artifact.manifest["outputs"][0]["shape"] == ["batch", 12, 32]  # 16 patches + class token, 4 merged, prefix left out
    assert artifact.validate(["ort"], num_samples=4, batch_size=2).passed
