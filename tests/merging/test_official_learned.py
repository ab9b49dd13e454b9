"""DynamicViT, PatchMerger, SiT, Sinkhorn and learned-weight DPC-KNN against outputs recorded from the study's own code
(scripts/record_learned_official.py), loaded from checkpoints in the official key layout.

The acceptance points: DeiT-S at keep rate 0.7 and DeiT-T at 0.5, same seeded weights and
images, through the PyTorch reference and the exported ONNX on ONNX Runtime; token counts at
every keep rate; the checkpoint layout; refusals of checkpoints that do not fit.
"""

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import timm
import torch

from deploytk.analysis.flops import count_flops
from deploytk.config import config_from_dict, config_to_dict
from deploytk.errors import DeploytkError
from deploytk.exporter.pipeline import run_export
from deploytk.models import build_reference

from helpers import official_learned_layout, seeded_images, seeded_init, seeded_learned_state

RECORDED = np.load(Path(__file__).parent.parent / "data" / "learned_official.npz")
MODELS = {"deit_small": "deit_small_patch16_224", "deit_tiny": "deit_tiny_patch16_224"}
POINTS = [("deit_small", 0.7), ("deit_tiny", 0.5)]
#: the ONNX Runtime points: DeiT-T in the default suite, DeiT-S (the same code on a larger model) in the slow tier
ONNX_POINTS = [pytest.param(*p, marks=pytest.mark.slow) if p[0] == "deit_small" else p for p in POINTS]
LEARNED = ["dynamicvit", "patchmerger", "sit", "sinkhorn"]
METHODS = [*LEARNED, "dpcknn"]  # dpcknn with equal_weight: false (the study's default, a learned token score)


def counts(keep: float) -> list[int]:
    return [int(196 * keep ** (s + 1)) for s in range(3)]


def official_checkpoint(path: Path, method: str, key: str, keep: float) -> Path:
    """A checkpoint as the study's train.py saves it: {'model': state_dict} in the official layout."""
    vit = seeded_init(timm.create_model(MODELS[key]), seed=1)
    learned = seeded_learned_state(official_learned_layout(method, vit.embed_dim, counts(keep)), seed=3)
    torch.save({"model": vit.state_dict() | learned, "epoch": 29}, path)
    return path


def config(method: str, key: str, keep: float, checkpoint=None):
    options = {"keep_rate": keep} | ({"equal_weight": False} if method == "dpcknn" else {})
    merge = {"method": method, "prop_attn": False, "options": options}  # the study's models run plain attention
    return config_from_dict({"model": MODELS[key], "checkpoint": str(checkpoint) if checkpoint else None, "merge": merge})


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize("method", METHODS)
def test_checkpoint_layout_is_the_official_one(method):
    # every key (and shape) the official model class saves is one deploytk loads, and nothing else
    key, keep = POINTS[0]
    official = set(RECORDED[f"{method}_{key}_k{keep}_keys"].tolist())
    model = build_reference(config(method, key, keep))
    ours = {f"{k.split('.', 1)[1]}:{list(v.shape)}" for k, v in model.state_dict().items() if k.startswith(("vit.", "reduction."))}
    assert ours == official


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("key,keep", POINTS)
def test_reference_from_official_checkpoint_matches_official_logits(method, key, keep, tmp_path):
    ckpt = official_checkpoint(tmp_path / "official.pth", method, key, keep)
    with torch.no_grad():
        got = build_reference(config(method, key, keep, ckpt))(seeded_images(2, seed=2)).numpy()
    want = RECORDED[f"{method}_{key}_k{keep}_logits"]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    assert np.abs(want[0] - want[1]).max() > 1e-2  # the two images differ: not a constant output


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("key,keep", ONNX_POINTS)
def test_onnx_runtime_matches_official_logits(method, key, keep, tmp_path):
    ckpt = official_checkpoint(tmp_path / "official.pth", method, key, keep)
    out = tmp_path / "export"
    run_export(config(method, key, keep, ckpt), out)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: seeded_images(2, seed=2).numpy()})
    assert np.abs(got - RECORDED[f"{method}_{key}_k{keep}_logits"]).max() <= 1e-3


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize("method", LEARNED)
@pytest.mark.parametrize("key", MODELS)
@pytest.mark.parametrize("keep", [0.25, 0.5, 0.7, 0.9])
def test_token_counts_match_official(method, key, keep):
    s = build_reference(config(method, key, keep)).schedule
    mlp_tokens = [t - r for t, r in zip(s.tokens, s.effective_r, strict=True)]
    assert mlp_tokens == RECORDED[f"{method}_{key}_k{keep}_tokens"].tolist()


def test_learned_layers_reduce_at_keep_rate_one():
    # the study's models run their trained layers at every reduction block even when nothing is removed
    model = build_reference(config("patchmerger", "deit_tiny", 1.0))
    assert model.reduction.clusters[3] == 196 and model.schedule.tokens[4] == 197
    with torch.no_grad():
        x = seeded_images(1, seed=0)
        dense = torch.nn.functional.softmax(model.vit(x), -1)
        assert not torch.allclose(torch.nn.functional.softmax(model(x), -1), dense)


def test_random_init_is_seeded():
    a, b = (build_reference(config("sinkhorn", "deit_tiny", 0.5)) for _ in range(2))
    assert torch.equal(a.reduction.cluster_layers[1].v, b.reduction.cluster_layers[1].v)


def test_patchmerger_flops_count_its_own_layers():
    # block 3 = the block at 138 tokens + the merger: two [K, N, C] matmuls and a LayerNorm (fvcore: 5 per element)
    key, keep = POINTS[0]
    merger = count_flops(build_reference(config("patchmerger", key, keep)))
    plain = count_flops(build_reference(config("kmedoids", key, keep)))  # same tokens, no learned layer
    k, n, c = counts(keep)[0], 196, 384
    assert merger.per_block_gflops[3] - plain.per_block_gflops[3] == pytest.approx((2 * k * n * c + 5 * n * c) / 1e9, rel=1e-6)


def test_plain_checkpoint_is_refused_naming_the_learned_keys(tmp_path):
    path = tmp_path / "deit.pth"
    torch.save(timm.create_model("deit_tiny_patch16_224").state_dict(), path)
    with pytest.raises(DeploytkError) as err:
        build_reference(config("dynamicvit", "deit_tiny", 0.5, path))
    assert "missing from the checkpoint" in str(err.value) and "score_predictor.0.in_conv.0.bias" in str(err.value)
    assert "score_predictor.*" in err.value.hint


def test_checkpoint_for_another_keep_rate_is_refused_with_the_shapes(tmp_path):
    ckpt = official_checkpoint(tmp_path / "k50.pth", "patchmerger", "deit_tiny", 0.5)
    with pytest.raises(DeploytkError) as err:
        build_reference(config("patchmerger", "deit_tiny", 0.7, ckpt))
    assert "'cluster_layers.0.queries' has shape [98, 192] in the checkpoint but [137, 192]" in str(err.value)
    assert "keep_rate" in err.value.hint


def test_learned_checkpoint_with_a_training_free_method_is_refused(tmp_path):
    ckpt = official_checkpoint(tmp_path / "sit.pth", "sit", "deit_tiny", 0.5)
    with pytest.raises(DeploytkError) as err:
        build_reference(config("kmedoids", "deit_tiny", 0.5, ckpt))
    assert "unexpected parameter(s)" in str(err.value) and "cluster_layers.0" in str(err.value)
    assert "patchmerger, sinkhorn, sit" in err.value.hint


def test_dpcknn_equal_weight_refuses_a_learned_weight_checkpoint(tmp_path):
    ckpt = official_checkpoint(tmp_path / "dpcknn.pth", "dpcknn", "deit_tiny", 0.5)
    cfg = config_to_dict(config("dpcknn", "deit_tiny", 0.5, ckpt))
    cfg["merge"]["options"]["equal_weight"] = True
    with pytest.raises(DeploytkError) as err:
        build_reference(config_from_dict(cfg))
    assert "unexpected parameter(s)" in str(err.value) and "cluster_layers.0.score" in str(err.value)
    assert "equal_weight: false" in err.value.hint


def test_dpcknn_learned_weights_change_the_merge():
    # the learned score weights the cluster means: with the same seeded ViT, equal and learned weights differ
    x = seeded_images(1, seed=0)
    learned = build_reference(config("dpcknn", "deit_tiny", 0.5))
    cfg = config_to_dict(config("dpcknn", "deit_tiny", 0.5))
    cfg["merge"]["options"]["equal_weight"] = True
    equal = build_reference(config_from_dict(cfg), vit=learned.vit)
    with torch.no_grad():
        assert (learned(x) - equal(x)).abs().max() > 1e-3
