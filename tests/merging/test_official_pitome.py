"""PiToMe against outputs recorded from the official code (scripts/record_pitome_official.py, hchautran/PiToMe 550b5de).

The op on its own against the official ``pitome_vision`` + ``merge_wavg`` (both variants, seeded metrics), the
reference and the exported graph on ONNX Runtime against the official blocks on seeded DeiT-T/S, and the token
counts of the official schedule.
"""

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import timm
import torch

from deploytk.merging.merged_vit import build_merged
from deploytk.reducers import get_method

from helpers import assert_every_deploytk_node_builds_as_a_plugin, export_config, seeded_images, seeded_init

RECORDED = np.load(Path(__file__).parent.parent / "data" / "pitome_official.npz")
MODELS = {"deit_tiny": "deit_tiny_patch16_224", "deit_small": "deit_small_patch16_224"}
ops = torch.ops.deploytk


@pytest.mark.parametrize("variant,protect", [("bsm", False), ("protected", True)])
@pytest.mark.parametrize("case", [0, 1, 2])
def test_op_merges_as_the_official_functions(variant, protect, case):
    key = f"match_{variant}_{case}_"
    metric, x, size = (torch.from_numpy(RECORDED[key + name]) for name in ("metric", "x", "size"))
    r, margin = int(RECORDED[key + "r"]), float(RECORDED[key + "margin"])
    dest = ops.pitome_match(metric, r, 1, margin, 1.0, protect)
    n_out = metric.shape[1] - r
    # same tokens in the same order: the official merge's cat([cls, unmerged or protected, destinations])
    torch.testing.assert_close(
        ops.token_aggregate(x, size, dest, n_out, True), torch.from_numpy(RECORDED[key + "out_x"]), rtol=0, atol=1e-5
    )
    torch.testing.assert_close(
        ops.token_aggregate(size, torch.ones_like(size), dest, n_out, False), torch.from_numpy(RECORDED[key + "out_size"]), rtol=0, atol=0
    )


def build(name: str, keep: float, seeded: bool = True):
    method = get_method("pitome")
    vit = timm.create_model(name)
    vit = seeded_init(vit, seed=1) if seeded else vit
    return build_merged(method, vit, 0, False, method.parse_options({"keep_rate": keep})).eval()


@pytest.mark.parametrize("key", MODELS)
@pytest.mark.parametrize("keep", [0.9, 0.925])
def test_reference_matches_official_logits_and_token_counts(key, keep):
    model = build(MODELS[key], keep)
    assert model.schedule.tokens == RECORDED[f"{key}_ratio{keep}_tokens"].tolist()
    with torch.no_grad():
        got = model(seeded_images(2, seed=2)).numpy()
    np.testing.assert_allclose(got, RECORDED[f"{key}_ratio{keep}_logits"], rtol=0, atol=1e-4)


def test_the_official_schedule():
    model = build(MODELS["deit_tiny"], 0.9, seeded=False)
    reduction = model.reduction
    assert reduction.margins == [0.75 - 0.75 * (i / 12) for i in range(12)] and reduction.margins[6] == 0.375
    assert reduction.bipartite_blocks == 6  # ceil(12 / 2): pitome_bsm in blocks 0-5, the protected variant after


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_onnx_runtime_matches_official_logits(tmp_path):
    weights = tmp_path / "seeded.pth"
    torch.save(seeded_init(timm.create_model(MODELS["deit_tiny"]), seed=1).state_dict(), weights)
    out = export_config("deit_tiny_pitome_k90", tmp_path / "pitome", checkpoint=str(weights))
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: seeded_images(2, seed=2).numpy()})
    assert np.abs(got - RECORDED["deit_tiny_ratio0.9_logits"]).max() <= 1e-3
    # what the method-config tests check of every default-suite config (this one's export is this test's)
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["custom_ops"]) == {"PiToMeMatch", "TokenAggregate"} and manifest["gflops"] < manifest["dense_gflops"]
    assert_every_deploytk_node_builds_as_a_plugin(onnx.load(str(out / "model.onnx")))
