"""timm checkpoints in the formats users have: loaded through timm's own conversion (checkpoint_filter_fn), as
timm.create_model(..., pretrained=True) loads them, and refused, naming keys, where they do not fit."""

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file

from deploytk.config import config_from_dict, load_config
from deploytk.errors import DeploytkError
from deploytk.models import build_reference, create_vit

from helpers import seeded_init

TINY = {"depth": 2}


def config(checkpoint, model="deit_tiny_patch16_224", img_size=224, **kwargs):
    return config_from_dict(
        {
            "model": model,
            "model_kwargs": kwargs or TINY,
            "checkpoint": str(checkpoint),
            "export": {"img_size": img_size},
            "merge": {"method": "tome", "r": 0},
        }
    )


def test_a_224_checkpoint_exports_at_256_with_the_position_embedding_resampled_as_timm_does(tmp_path):
    trained = seeded_init(timm.create_model("deit_tiny_patch16_224", **TINY), seed=1)
    path = tmp_path / "w224.safetensors"
    save_file(trained.state_dict(), str(path))
    got = create_vit(config(path, img_size=256))
    want = timm.create_model("deit_tiny_patch16_224", **TINY, img_size=256, pretrained=True, pretrained_cfg_overlay={"file": str(path)})
    assert got.pos_embed.shape == (1, 1 + 16 * 16, 192) and trained.pos_embed.shape == (1, 1 + 14 * 14, 192)
    for name, value in want.state_dict().items():
        torch.testing.assert_close(got.state_dict()[name], value, rtol=0, atol=0, msg=name)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3, 256, 256)).astype(np.float32))
    with torch.no_grad():
        torch.testing.assert_close(build_reference(config(path, img_size=256))(x), want.eval()(x), rtol=1e-5, atol=1e-5)


def openai_clip_layout(vit) -> dict[str, torch.Tensor]:
    """A timm CLIP ViT's weights in OpenAI CLIP's visual layout (the inverse of timm's _convert_openai_clip, written out)."""
    s, out = vit.state_dict(), {}
    out["visual.conv1.weight"] = s["patch_embed.proj.weight"]
    out["visual.class_embedding"] = s["cls_token"][0, 0]
    out["visual.positional_embedding"] = s["pos_embed"][0]
    out["visual.proj"] = s["head.weight"].t()
    for kind in ("weight", "bias"):
        out[f"visual.ln_pre.{kind}"] = s[f"norm_pre.{kind}"]
        out[f"visual.ln_post.{kind}"] = s[f"norm.{kind}"]
        for i in range(len(vit.blocks)):
            t, o = f"blocks.{i}.", f"visual.transformer.resblocks.{i}."
            out[o + f"ln_1.{kind}"] = s[t + f"norm1.{kind}"]
            out[o + f"ln_2.{kind}"] = s[t + f"norm2.{kind}"]
            out[o + f"attn.in_proj_{kind}"] = s[t + f"attn.qkv.{kind}"]
            out[o + f"attn.out_proj.{kind}"] = s[t + f"attn.proj.{kind}"]
            out[o + f"mlp.c_fc.{kind}"] = s[t + f"mlp.fc1.{kind}"]
            out[o + f"mlp.c_proj.{kind}"] = s[t + f"mlp.fc2.{kind}"]
    return out


CLIP_KWARGS = {"depth": 2, "embed_dim": 64, "num_heads": 2, "num_classes": 32}


def test_an_openai_clip_checkpoint_loads_through_timms_filter(tmp_path):
    vit = seeded_init(timm.create_model("vit_base_patch16_clip_224", **CLIP_KWARGS), seed=2)
    with torch.no_grad():
        vit.head.bias.zero_()  # OpenAI's projection has no bias; timm's conversion gives zeros
    path = tmp_path / "openai_clip.pt"
    torch.save({"state_dict": {f"module.{k}": v for k, v in openai_clip_layout(vit).items()}}, path)  # a wrapped DDP save
    got = create_vit(config(path, "vit_base_patch16_clip_224", **CLIP_KWARGS))
    for name, value in vit.state_dict().items():
        torch.testing.assert_close(got.state_dict()[name], value, rtol=0, atol=0, msg=name)


def jax_npz_layout(vit) -> dict[str, np.ndarray]:
    """A timm ViT's weights in Google's JAX/Flax ViT checkpoint layout (AugReg .npz), written out key by key from that
    layout (HWIO convolutions, [in, out] dense kernels, attention kernels [D, heads, head_dim])."""
    s = {k: v.detach().numpy() for k, v in vit.state_dict().items()}
    d, heads = vit.embed_dim, vit.blocks[0].attn.num_heads
    w = {
        "embedding/kernel": s["patch_embed.proj.weight"].transpose(2, 3, 1, 0),
        "embedding/bias": s["patch_embed.proj.bias"],
        "cls": s["cls_token"],
        "Transformer/posembed_input/pos_embedding": s["pos_embed"],
        "Transformer/encoder_norm/scale": s["norm.weight"],
        "Transformer/encoder_norm/bias": s["norm.bias"],
        "head/kernel": s["head.weight"].T,
        "head/bias": s["head.bias"],
    }
    for i in range(len(vit.blocks)):
        b, p = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        mha = p + "MultiHeadDotProductAttention_1/"
        weights, biases = np.split(s[b + "attn.qkv.weight"], 3), np.split(s[b + "attn.qkv.bias"], 3)
        for n, weight, bias in zip(("query", "key", "value"), weights, biases, strict=True):
            w[mha + f"{n}/kernel"] = weight.T.reshape(d, heads, d // heads)
            w[mha + f"{n}/bias"] = bias.reshape(heads, d // heads)
        w[mha + "out/kernel"] = s[b + "attn.proj.weight"].reshape(d, heads, d // heads).transpose(1, 2, 0)
        w[mha + "out/bias"] = s[b + "attn.proj.bias"]
        for norm, ln in (("norm1", "LayerNorm_0"), ("norm2", "LayerNorm_2")):
            w[p + f"{ln}/scale"], w[p + f"{ln}/bias"] = s[b + f"{norm}.weight"], s[b + f"{norm}.bias"]
        for fc, dense in (("fc1", "Dense_0"), ("fc2", "Dense_1")):
            w[p + f"MlpBlock_3/{dense}/kernel"], w[p + f"MlpBlock_3/{dense}/bias"] = s[b + f"mlp.{fc}.weight"].T, s[b + f"mlp.{fc}.bias"]
    return w


def test_a_jax_npz_checkpoint_loads_through_timms_reader(tmp_path):
    trained = seeded_init(timm.create_model("vit_tiny_patch16_224", **TINY), seed=4)
    path = tmp_path / "augreg.npz"
    np.savez(path, **jax_npz_layout(trained))
    got = create_vit(config(path, model="vit_tiny_patch16_224"))
    for name, value in trained.state_dict().items():
        torch.testing.assert_close(got.state_dict()[name], value, rtol=0, atol=0, msg=name)
    bigger = create_vit(config(path, model="vit_tiny_patch16_224", img_size=256))  # the position embedding resampled by timm
    assert bigger.pos_embed.shape == (1, 1 + 16 * 16, 192)
    headless = {k: v for k, v in jax_npz_layout(trained).items() if not k.startswith("head/")}
    np.savez(tmp_path / "headless.npz", **headless)
    with pytest.raises(DeploytkError, match=r"has no classifier head, and vit_tiny_patch16_224 here has 1000 classes") as err:
        create_vit(config(tmp_path / "headless.npz", model="vit_tiny_patch16_224"))
    assert "num_classes: 0" in err.value.hint
    dpcknn = config_from_dict(
        config(path, model="vit_tiny_patch16_224").model_dump() | {"merge": {"method": "dpcknn", "options": {"layers": [1]}}}
    )
    build_reference(dpcknn)  # a method that may load layers of its own reads none from a .npz
    np.savez(tmp_path / "other.npz", weights=np.zeros(3))
    with pytest.raises(DeploytkError, match=r"could not be read as a JAX/Flax ViT checkpoint by timm .*embedding/kernel, Transformer"):
        create_vit(config(tmp_path / "other.npz", model="vit_tiny_patch16_224"))


def test_an_incompatible_checkpoint_is_refused_naming_keys(tmp_path):
    vit = seeded_init(timm.create_model("vit_base_patch16_clip_224", **CLIP_KWARGS), seed=2)
    path = tmp_path / "openai_clip.pt"
    torch.save(openai_clip_layout(vit), path)
    deeper = dict(CLIP_KWARGS, depth=3)
    with pytest.raises(DeploytkError, match=r"does not match model VisionTransformer: .*missing from the checkpoint, e.g. \['blocks\.2\."):
        create_vit(config(path, "vit_base_patch16_clip_224", **deeper))
    wider = dict(CLIP_KWARGS, embed_dim=96, num_heads=3)
    with pytest.raises(DeploytkError, match=r"parameter '.*' has shape \[.*64.*\] in the checkpoint but \[.*96.*\] in the model"):
        create_vit(config(path, "vit_base_patch16_clip_224", **wider))


def test_a_relative_checkpoint_is_read_from_the_configs_folder(tmp_path, monkeypatch):
    save_file(seeded_init(timm.create_model("deit_tiny_patch16_224", **TINY)).state_dict(), str(tmp_path / "w.safetensors"))
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "c.yaml").write_text("model: deit_tiny_patch16_224\nmodel_kwargs: {depth: 2}\ncheckpoint: ../w.safetensors\n")
    monkeypatch.chdir("/")  # anywhere
    assert load_config(tmp_path / "configs" / "c.yaml").checkpoint == str(tmp_path / "w.safetensors")
    (tmp_path / "configs" / "old.yaml").write_text("model: deit_tiny_patch16_224\ncheckpoint: w.safetensors\n")
    monkeypatch.chdir(tmp_path)  # where the old rule (working directory) would have found it
    with pytest.raises(DeploytkError, match="read relative to the config's folder") as err:
        load_config(tmp_path / "configs" / "old.yaml")
    assert "checkpoint: ../w.safetensors" in err.value.hint


def hub_cache_with_timm_config(root, repo="timm/deit_tiny_patch16_224.fb_in1k", architecture="deit_tiny_patch16_224"):
    """A Hugging Face cache holding one timm Hub repo's config.json (what `hf-hub:` names read), as huggingface_hub lays
    it out: models--<owner>--<name>/refs/main -> snapshots/<commit>/config.json."""
    import json

    folder = root / f"models--{repo.replace('/', '--')}"
    commit = "0" * 40
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    (folder / "snapshots" / commit).mkdir(parents=True)
    pretrained_cfg = {"num_classes": 1000, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "crop_pct": 0.875}
    config = {"architecture": architecture, "num_classes": 1000, "pretrained_cfg": pretrained_cfg | {"input_size": [3, 224, 224]}}
    (folder / "snapshots" / commit / "config.json").write_text(json.dumps(config))
    return root


def test_timm_hub_names_are_accepted_and_say_what_to_do_offline_without_the_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # as HF_HUB_OFFLINE=1 does: the cache answers, nothing else
    cfg = config_from_dict({"model": "hf-hub:timm/deit_tiny_patch16_224.fb_in1k", "model_kwargs": {"depth": 2}, "merge": {"r": 8}})
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache_with_timm_config(tmp_path / "cache")))
    assert build_reference(cfg).schedule.tokens == [197, 189]
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(DeploytkError, match=r"could not read the Hub repo of 'hf-hub:timm/deit_tiny_patch16_224.fb_in1k'") as err:
        create_vit(cfg)
    assert "name the timm architecture itself" in err.value.hint
