"""VisionZip against outputs recorded from the official tower (scripts/record_visionzip_official.py,
dvlab-research/VisionZip 3151f6d): a seeded CLIP tower with LLaVA-1.5's geometry (336 px, patch 14: 576 patches),
at LLaVA-1.5's budgets 64 / 128 / 192 tokens, through the reference and the exported graph on ONNX Runtime.
"""

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers

from deploytk.config import config_from_dict
from deploytk.errors import DeploytkError
from deploytk.exporter.pipeline import run_export
from deploytk.merging.merged_vit import build_merged
from deploytk.merging.outputs import OutputSpec
from deploytk.reducers import get_method

from helpers import VISIONZIP_BUDGETS as BUDGETS
from helpers import VISIONZIP_TOWER as TOWER
from helpers import seeded_init

RECORDED = np.load(Path(__file__).parent.parent / "data" / "visionzip_official.npz")
LLAVA_TOKENS = OutputSpec("tokens", feature_layer=-2, keep_prefix_tokens=True)
ops = torch.ops.deploytk


@pytest.fixture(scope="module")
def tower():
    config = transformers.CLIPVisionConfig(**TOWER)
    return seeded_init(transformers.CLIPVisionModel._from_config(config, attn_implementation="eager"), seed=3).eval()


def visionzip(model, dominant, contextual, output=LLAVA_TOKENS, **options):
    method = get_method("visionzip")
    return build_merged(method, model, 0, False, method.parse_options({"dominant": dominant, "contextual": contextual, **options}), output)


@pytest.mark.parametrize("k", BUDGETS)
def test_reference_equals_the_official_tower(tower, k):
    model = visionzip(tower, *BUDGETS[k]).eval()
    assert model.output_tokens == k
    with torch.no_grad():
        tokens, sizes = model(torch.from_numpy(RECORDED["images"]))
    np.testing.assert_allclose(tokens.numpy(), RECORDED[f"tokens_{k}"], rtol=0, atol=1e-4)
    dominant = BUDGETS[k][0]
    assert sizes[:, :dominant].eq(1).all() and sizes.sum(1).eq(577).all()  # every patch (and the class token) in one token
    assert (sizes[:, dominant:] >= 1).all()


def test_the_dominant_tokens_are_the_official_indices(tower):
    model = visionzip(tower, *BUDGETS[64])
    calls = []
    model.dest_hook = lambda op, args, dest: calls.append(dest) or dest
    with torch.no_grad():
        model(torch.from_numpy(RECORDED["images"]))
    (dest,) = calls
    for row, official in zip(dest, RECORDED["indices_64"], strict=True):
        assert torch.nonzero(row < 54).flatten().tolist() == sorted(official.tolist())  # class token + 53 patches, index order


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_exported_tower_on_onnx_runtime_equals_the_official(tower, tmp_path):
    tower.save_pretrained(tmp_path / "tower")
    dominant, contextual = BUDGETS[64]
    cfg = config_from_dict(
        {
            "model": f"hf:{tmp_path / 'tower'}",
            "merge": {"method": "visionzip", "prop_attn": False, "options": {"dominant": dominant, "contextual": contextual}},
            "export": {"img_size": None, "batch_size": 2, "output": "tokens", "feature_layer": -2, "keep_prefix_tokens": True},
        }
    )
    run_export(cfg, tmp_path / "out")
    session = ort.InferenceSession(str(tmp_path / "out" / "model.onnx"), providers=["CPUExecutionProvider"])
    tokens, sizes = session.run(["tokens", "token_sizes"], {"input": RECORDED["images"]})
    assert np.abs(tokens - RECORDED["tokens_64"]).max() <= 1e-3
    assert sizes.sum(1).tolist() == [577.0, 577.0]


def test_visionzip_select_hand_case():
    # cls + 6 tokens; the class token attends to t2 most: dominant = [cls, t2]. Remaining t1, t3, t4, t5, t6 (M = 5),
    # 2 contextual: step 2, targets t1 (rank 0) and t4 (rank 2); t3 is like t4, t5 and t6 like t1
    scores = torch.tensor([[0.0, 0.1, 0.9, 0.2, 0.1, 0.3, 0.0]])
    e = torch.eye(3)
    metric = torch.stack([e[0], e[1], e[0], e[2], e[2] + 0.1 * e[1], e[1] + 0.2 * e[2], e[1]])[None]
    dest = ops.visionzip_select(scores, metric, 1, 2, 1)
    assert dest.tolist() == [[0, 2, 1, 3, 3, 2, 2]]


def test_visionzip_refuses_what_it_cannot_do(tower):
    with pytest.raises(DeploytkError, match=r"do not fit this model's 576 patches and 1 prefix tokens: dominant must be in \[2, 576\]"):
        visionzip(tower, 570, 10)
    with pytest.raises(DeploytkError, match=r"`merge.options.layer` = 0: VisionZip selects on a block's attention"):
        visionzip(tower, 54, 10, layer=0)
    with pytest.raises(DeploytkError, match=r"contextual=7 is not allowed with 5 tokens left"):
        ops.visionzip_select(torch.rand(1, 10), torch.randn(1, 10, 4), 4, 7, 1)
    siglip = transformers.SiglipVisionModel._from_config(
        transformers.SiglipVisionConfig(
            image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
        )
    )
    with pytest.raises(DeploytkError, match="no class token"):
        visionzip(siglip, 5, 3, OutputSpec("tokens"))
