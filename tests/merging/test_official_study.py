"""K-Medoids, DPC-KNN and ATS against outputs recorded from the study's own code (scripts/record_study_official.py).

The acceptance points of the issue: DeiT-S at keep rate 0.7 and DeiT-T at 0.5, on the same
(seeded) weights and images, through the PyTorch reference and through the exported ONNX on
ONNX Runtime; token counts at every keep rate; the ops on their own against the official
clustering functions.
"""

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import timm
import torch

from deploytk.merging.distances import pairwise_distances
from deploytk.merging.merged_vit import build_merged
from deploytk.ops.dpcknn_assign.reference import dpcknn_assign, dpcknn_centres
from deploytk.ops.kmedoids_select.reference import kmedoids_medoids
from deploytk.reducers import get_method

from helpers import export_config, seeded_images, seeded_init

RECORDED = np.load(Path(__file__).parent.parent / "data" / "study_official.npz")
MODELS = {"deit_small": "deit_small_patch16_224", "deit_tiny": "deit_tiny_patch16_224"}
POINTS = [("deit_small", 0.7), ("deit_tiny", 0.5)]
#: the ONNX Runtime points: DeiT-T in the default suite, DeiT-S (the same code on a larger model) in the slow tier
ONNX_POINTS = [pytest.param(*p, marks=pytest.mark.slow) if p[0] == "deit_small" else p for p in POINTS]


METHODS = ["kmedoids", "dpcknn", "ats"]


def official_logits(method: str, key: str, keep: float) -> np.ndarray:
    # DPC-KNN: the official forward with its 1e-6 density noise set to 0 (deploytk breaks ties by index);
    # ATS: with the step-to-CDF distances taken exactly (torch.cdist's difference mode)
    suffix = {"dpcknn": "_noiseless", "ats": "_exact"}.get(method, "")
    return RECORDED[f"{method}_{key}_k{keep}_logits{suffix}"]


def build(method: str, vit, keep: float):
    m = get_method(method)
    return build_merged(m, vit, 0, m.needs_prop_attn, m.parse_options({"keep_rate": keep})).eval()


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("key,keep", POINTS)
def test_reference_matches_official_logits(method, key, keep):
    model = build(method, seeded_init(timm.create_model(MODELS[key]), seed=1), keep)
    with torch.no_grad():
        got = model(seeded_images(2, seed=2)).numpy()
    np.testing.assert_allclose(got, official_logits(method, key, keep), rtol=0, atol=1e-4)


def test_official_dpcknn_noise_moves_its_own_logits():
    # why the comparison above is with the noiseless official run: the noise alone moves the official logits
    key, keep = POINTS[0]
    noisy, noiseless = RECORDED[f"dpcknn_{key}_k{keep}_logits"], official_logits("dpcknn", key, keep)
    assert np.abs(noisy - noiseless).max() > 1e-2


def mlp_tokens(model) -> list[int]:
    """Tokens each block's MLP gets (the clustering methods reduce before the block, ATS after attention)."""
    s = model.schedule
    return [t - r for t, r in zip(s.tokens, s.effective_r, strict=True)]


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize("method", ["kmedoids", "dpcknn"])
@pytest.mark.parametrize("key", MODELS)
@pytest.mark.parametrize("keep", [0.25, 0.5, 0.7, 0.9])
def test_token_counts_match_official(method, key, keep):
    model = build(method, timm.create_model(MODELS[key]), keep)
    assert mlp_tokens(model) == RECORDED[f"{method}_{key}_k{keep}_tokens"].tolist()


@pytest.mark.parametrize("key", MODELS)
@pytest.mark.parametrize("keep", [0.25, 0.5, 0.7, 0.9])
def test_ats_slots_are_the_official_bound(key, keep):
    # ATS keeps a batch-dependent count (the official code pads to the most any image kept); deploytk's
    # static slots are its bound: one per CDF step, int(keep^(s+1) * 196) + 1 - 1 of them (or one more,
    # when torch.arange's rounding keeps the last step)
    model = build("ats", timm.create_model(MODELS[key]), keep)
    official = RECORDED[f"ats_{key}_k{keep}_tokens"].tolist()
    steps = {i: getattr(model.reduction, f"steps_{i}").numel() for i in (3, 6, 9)}
    assert [1 + steps[i] for i in (3, 6, 9)] == [mlp_tokens(model)[i] for i in (3, 6, 9)]
    assert all(o <= d for o, d in zip(official, mlp_tokens(model), strict=True))
    if keep <= 0.5:
        assert official == mlp_tokens(model)  # no duplicate samples at these rates (recorded)


def test_ats_empty_slots_change_nothing():
    # DeiT-S at 0.7: the official run kept fewer tokens than deploytk has slots (duplicate samples), and the
    # logits still agree (test_reference_matches_official_logits): the size-0 slots are ignored exactly
    model = build("ats", timm.create_model(MODELS["deit_small"]), 0.7)
    assert sum(RECORDED["ats_deit_small_k0.7_tokens"]) < sum(mlp_tokens(model))


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("key,keep", ONNX_POINTS)
def test_onnx_runtime_matches_official_logits(method, key, keep, tmp_path):
    weights = tmp_path / "seeded.pth"
    torch.save(seeded_init(timm.create_model(MODELS[key]), seed=1).state_dict(), weights)
    stem = f"{key}_{method}_k{int(keep * 100)}"
    out = export_config(stem, tmp_path / stem, checkpoint=str(weights))
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: seeded_images(2, seed=2).numpy()})
    assert np.abs(got - official_logits(method, key, keep)).max() <= 1e-3


@pytest.mark.parametrize("shape", ["196x384_k137", "96x192_k48", "20x16_k6"])
def test_ops_choose_what_the_official_functions_choose(shape):
    base = f"kmedoids_fit_{shape}"
    x, weight = torch.from_numpy(RECORDED[f"{base}_x"]), torch.from_numpy(RECORDED[f"{base}_weight"])
    k = int(shape.rsplit("_k", 1)[1])
    assert torch.equal(kmedoids_medoids(pairwise_distances(x), weight, k, 3), torch.from_numpy(RECORDED[f"{base}_medoids"]))
    dist = pairwise_distances(x) / x.shape[-1] ** 0.5
    assert torch.equal(dpcknn_centres(dist, k, 5), torch.from_numpy(RECORDED[f"dpcknn_fit_{shape}_centres"]))
    assert torch.equal(dpcknn_assign(dist, k, 5), torch.from_numpy(RECORDED[f"dpcknn_fit_{shape}_assign"]))


def test_pairwise_distances_are_torch_cdist():
    g = torch.Generator().manual_seed(0)
    for m in (7, 25, 26, 196):
        x = torch.randn(2, m, 24, generator=g) * 3
        torch.testing.assert_close(pairwise_distances(x), torch.cdist(x, x), rtol=1e-6, atol=1e-5)
