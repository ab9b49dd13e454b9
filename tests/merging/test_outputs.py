"""``export.output``: patch_features (unmerge) and tokens, held to the plain models and to an independent computation.

- with no reduction, patch_features / tokens equal the model's own patch tokens / hidden states (timm's
  forward_features and blocks, transformers' last_hidden_state and hidden_states) for DeiT, DINOv2 with registers
  and CLIP;
- unmerged features equal, patch by patch, the final token that holds the patch as visualize's source tracking
  (analysis/token_map.py: numpy, one image, its own composition of the ops' dest) finds it, for ToMe, MCTF,
  DPC-KNN, PiToMe and VisionZip; a patch a pruning method dropped (Top-K, DynamicViT, K-Medoids' non-medoids: the study's model keeps the
  medoids alone) carries the hidden state entering the block that dropped it, read from a tokens output at that
  feature layer;
- what cannot be given is refused with the reason.
"""

from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import transformers

from deploytk.adapters import adapt
from deploytk.analysis.token_map import track_sources
from deploytk.config import config_from_dict
from deploytk.errors import DeploytkError
from deploytk.merging.merged_vit import build_merged
from deploytk.merging.outputs import OutputSpec
from deploytk.reducers import METHODS, get_method

from helpers import seeded_init

IMG = 64


def deit(depth=12):
    torch.manual_seed(0)
    return seeded_init(timm.create_model("deit_tiny_patch16_224", img_size=IMG, depth=depth), seed=1).eval()


def images(n=2, seed=3, size=IMG):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((n, 3, size, size)).astype(np.float32))


def merged(vit, method="tome", r=0, output=None, **options):
    m = get_method(method)
    torch.manual_seed(7)  # a learned method's layers: the same random init in every model of a test
    return build_merged(m, vit, r, True, m.parse_options(options), output).eval()


def run(model, x):
    with torch.no_grad():
        return model(x)


# ---- no reduction: the model's own features ---------------------------------------------------------------------


def test_timm_patch_features_and_layer_tokens_equal_the_models_own():
    vit, x = deit(), images()
    with torch.no_grad():
        own = vit.forward_features(x)
        hidden = vit.norm_pre(vit._pos_embed(vit.patch_embed(x)))
        for blk in vit.blocks[:-2]:
            hidden = blk(hidden)
    features_model = merged(vit, output=OutputSpec("patch_features"))
    assert features_model.output_names == ["patch_features"]  # the graph's output name
    feats = run(features_model, x)
    assert feats.shape == (2, 16, 192)
    torch.testing.assert_close(feats, own[:, 1:], atol=1e-5, rtol=0)
    tokens_model = merged(vit, output=OutputSpec("tokens", feature_layer=-3))
    assert tokens_model.output_names == ["tokens", "token_sizes"]
    tokens, sizes = run(tokens_model, x)  # hidden_states[-3]: after 10 blocks
    torch.testing.assert_close(tokens, hidden[:, 1:], atol=1e-5, rtol=0)
    assert torch.equal(sizes, torch.ones(2, 16))
    with_prefix = run(merged(vit, output=OutputSpec("tokens", feature_layer=10, keep_prefix_tokens=True)), x)[0]
    torch.testing.assert_close(with_prefix, hidden, atol=1e-5, rtol=0)


HF = {
    "Dinov2WithRegistersModel": ("Dinov2WithRegistersConfig", {"mlp_ratio": 2, "num_register_tokens": 4}, 5),
    "CLIPVisionModel": ("CLIPVisionConfig", {"intermediate_size": 128}, 1),
}


def hf_model(name):
    config_class, extra, _ = HF[name]
    config = getattr(transformers, config_class)(
        hidden_size=64, num_hidden_layers=4, num_attention_heads=2, image_size=32, patch_size=4, **extra
    )
    return seeded_init(getattr(transformers, name)(config), seed=5).eval()


@pytest.mark.parametrize("name", list(HF))
def test_hf_patch_features_and_penultimate_tokens_equal_the_models_own(name):
    model, prefix, x = hf_model(name), HF[name][2], images(size=32)
    with torch.no_grad():
        own = model(pixel_values=x, output_hidden_states=True)
    feats = run(merged(model, output=OutputSpec("patch_features")), x)
    assert feats.shape == (2, 64, 64)
    torch.testing.assert_close(feats, own.last_hidden_state[:, prefix:], atol=1e-5, rtol=0)  # CLIP's is not post-normed
    tokens, _ = run(merged(model, output=OutputSpec("tokens", feature_layer=-2)), x)  # LLaVA's vision_feature_layer
    torch.testing.assert_close(tokens, own.hidden_states[-2][:, prefix:], atol=1e-5, rtol=0)


def test_embedding_of_a_classifier_is_what_its_head_reads():
    vit, x = deit(4), images()
    emb = run(merged(vit, output=OutputSpec("embedding")), x)
    with torch.no_grad():
        own = vit.forward_head(vit.forward_features(x), pre_logits=True)
    torch.testing.assert_close(emb, own, atol=1e-5, rtol=0)
    model = merged(vit, output=OutputSpec("embedding"))
    assert model.output_names == ["embedding"]
    assert adapt(hf_model("CLIPVisionModel")).embedding_name == "pooler_output"


# ---- reduced: unmerge against the independent source tracking -------------------------------------------------


@pytest.mark.parametrize(
    ("method", "r", "options"),
    [
        ("tome", 3, {}),
        ("mctf", 3, {}),
        ("dpcknn", 0, {"keep_rate": 0.5}),
        ("pitome", 0, {"keep_rate": 0.8}),
        ("visionzip", 0, {"dominant": 6, "contextual": 4, "layer": 6}),
    ],
)
def test_unmerged_patches_take_the_feature_of_the_token_holding_them(method, r, options):
    vit, x = deit(), images(1)
    feats = run(merged(vit, method, r, OutputSpec("patch_features"), **options), x)[0].numpy()
    tokens_model = merged(vit, method, r, OutputSpec("tokens", keep_prefix_tokens=True, token_map=True), **options)
    tokens, sizes, token_of_patch = (t[0].numpy() for t in run(tokens_model, x))
    sources = track_sources(merged(vit, method, r, **options), x)
    owner = sources.owner[-1]
    alive = owner >= 0
    assert alive.sum() > 0 and len(np.unique(owner[alive])) < alive.sum()  # some patches share a token: a real merge
    np.testing.assert_array_equal(token_of_patch, owner)
    np.testing.assert_allclose(feats[alive], tokens[owner[alive]], atol=1e-6)
    assert alive.all()
    np.testing.assert_array_equal(sizes[1:], np.bincount(owner - 1, minlength=len(sizes) - 1))  # each size counts its patches


@pytest.mark.parametrize(
    ("method", "options"),
    [
        ("topk", {"keep_rate": 0.5}),
        ("dynamicvit", {"keep_rate": 0.5}),
        ("evit", {"keep_rate": 0.5}),
        ("kmedoids", {"keep_rate": 0.5}),
        ("ats", {"keep_rate": 0.5}),
    ],
)
def test_a_dropped_patch_keeps_its_hidden_state_from_the_block_that_dropped_it(method, options):
    vit, x = deit(), images(1)
    feats = run(merged(vit, method, 0, OutputSpec("patch_features"), **options), x)[0]
    sources = track_sources(merged(vit, method, 0, **options), x)
    owner = sources.owner
    final = run(merged(vit, method, 0, OutputSpec("tokens", keep_prefix_tokens=True), **options), x)[0][0]
    checked = 0
    for p in range(owner.shape[1]):
        gone = np.flatnonzero(owner[:, p] < 0)
        if not len(gone):
            torch.testing.assert_close(feats[p], final[owner[-1, p]], atol=1e-6, rtol=0)
            continue
        block = int(gone[0])  # the block that dropped it; its input is hidden_states[block]
        at = owner[block - 1, p] if block else 1 + p
        hidden = run(merged(vit, method, 0, OutputSpec("tokens", feature_layer=block, keep_prefix_tokens=True), **options), x)[0][0]
        with torch.no_grad():
            want = vit.norm(hidden[at])
        torch.testing.assert_close(feats[p], want, atol=1e-5, rtol=0)
        checked += 1
    if method == "evit":  # the patches EViT does not keep follow its fused token, like merged ones: none is dropped
        assert checked == 0 and sources.fused[-1].any()
    else:
        assert checked > 0


def test_k_is_the_token_count_the_graph_outputs_for_every_method_and_feature_layer():
    vit, x = deit(), images(1)
    for name, method in METHODS.items():
        options = {} if method.uses_r else {"keep_rate": 0.5}
        if name == "atm":
            options = {"cls_only_last": False}
        if name == "visionzip":
            options = {"dominant": 6, "contextual": 4, "layer": 5}
        for layer in (1, 3, 4, 6, 9, 12):  # K-Medoids clusters at the end of blocks 2, 5 and 8
            spec = OutputSpec("tokens", feature_layer=layer, keep_prefix_tokens=True)
            model = merged(vit, name, 2 if method.uses_r else 0, spec, **options)
            assert run(model, x)[0].shape[1] == model.output_tokens, (name, layer)


# ---- refusals ------------------------------------------------------------------------------------------------------


def test_what_cannot_be_output_is_refused_with_the_reason():
    vit = deit(4)
    with pytest.raises(DeploytkError, match=r"`export.feature_layer` = 9 is outside this 4-block model's layers: allowed 0..4"):
        merged(vit, output=OutputSpec("tokens", feature_layer=9))
    with pytest.raises(DeploytkError, match=r"patch_features needs to know which token holds each patch, and method patchmerger"):
        merged(vit, "patchmerger", 0, OutputSpec("patch_features"), layers=[1], keep_rate=0.5)
    with pytest.raises(DeploytkError, match=r"`export.output: logits` needs a classifier head; CLIPVisionModel has none"):
        merged(hf_model("CLIPVisionModel"), output=OutputSpec("logits"))
    atm = get_method("atm")
    with pytest.raises(DeploytkError, match=r"`export.output: tokens` would be empty: method atm leaves no token but the prefix"):
        build_merged(atm, deit(), 0, True, atm.parse_options({}), OutputSpec("tokens"))
    with pytest.raises(DeploytkError, match=r"would give every patch a feature from before the last block") as err:
        build_merged(atm, deit(), 0, True, atm.parse_options({}), OutputSpec("patch_features"))
    assert "cls_only_last: false" in err.value.hint


def test_output_settings_without_their_output_are_config_errors():
    with pytest.raises(DeploytkError, match=r"`export.token_map` is for `export.output: tokens`, and the output is patch_features"):
        config_from_dict({"export": {"output": "patch_features", "token_map": True}})
    with pytest.raises(
        DeploytkError, match=r"`export.feature_layer` is for `export.output: patch_features / tokens`, and the output is the"
    ):
        config_from_dict({"export": {"feature_layer": -2}})
    with pytest.raises(DeploytkError, match=r"`export.output` = 'features'.*allowed: logits, embedding, patch_features, tokens"):
        config_from_dict({"export": {"output": "features"}})


def test_an_export_from_before_output_kinds_reads_as_its_model_gave_it():
    from deploytk.exporter.artifacts import Artifact

    for num_classes, kind in ((0, "embedding"), (10, "logits")):
        old = {"model": {"num_classes": num_classes}, "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 8]}]}
        artifact = Artifact(Path("old"), old)
        assert artifact.output_kind == kind and artifact.output_names == ["logits"]
