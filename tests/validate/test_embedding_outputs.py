"""Models without a head (num_classes=0: DINOv2, CLIP image towers) output pooled features: validate
compares the embeddings and reports top-1 as not applicable.

The case users hit: timm's DINOv2 with registers at 224 px, ToMe r=8, exported fine but validation
crashed in Polygraphy's comparator ("Input array to view() must be contiguous in memory": the head-less
model returns a strided view of its class-token row). LayerScale starts at 1e-5 in timm's DINOv2, which
leaves random-weight embeddings at the noise floor of the class token (max |x| 4e-3); init_values 1.0
gives embeddings of scale 1, where a wrong merge shows.
"""

import json

import pytest
import yaml
from typer.testing import CliRunner

from deploytk.cli import app

runner = CliRunner()
CONFIG = {
    "model": "vit_small_patch14_reg4_dinov2",
    "model_kwargs": {"init_values": 1.0},
    "merge": {"method": "tome", "r": 8},
    "export": {"batch_size": 2, "img_size": 224},
}


@pytest.fixture(scope="module")
def dinov2(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dinov2")
    (tmp / "dinov2.yaml").write_text(yaml.safe_dump(CONFIG))
    result = runner.invoke(app, ["export", str(tmp / "dinov2.yaml"), "--output", str(tmp / "art"), "--json"])
    assert result.exit_code == 0, result.output
    return tmp / "art", json.loads(result.stdout)


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_manifest_names_the_embedding_output(dinov2):
    _, manifest = dinov2
    assert manifest["model"]["num_classes"] == 0
    assert manifest["outputs"] == [
        {"name": "embedding", "dtype": "float32", "shape": ["batch", 384], "kind": "embedding"}
    ]  # timm: no name of its own


@pytest.mark.parametrize("backend", ["ort", pytest.param("openvino", marks=pytest.mark.slow)])  # the quick check: ort
def test_validate_compares_embeddings_without_top1(dinov2, backend):
    if backend == "openvino":
        pytest.importorskip("openvino", reason="the openvino extra is not installed")
    art, _ = dinov2
    result = runner.invoke(app, ["validate", str(art), "--backend", backend, "--num-samples", "8", "--batch-size", "4", "--json"])
    (report,) = json.loads(result.stdout)["reports"]
    assert result.exit_code == 0 and report["passed"], result.output
    assert report["output_kind"] == "embedding" and report["top1_agreement"] is None
    assert not any(check.startswith("top1") for check in report["checks"])
    assert report["cosine_similarity_min"] > 0.99999 and report["max_abs_diff"] < 1e-4
    text = runner.invoke(app, ["validate", str(art), "--backend", backend, "--num-samples", "4", "--batch-size", "4"]).output
    assert "n/a (embedding output" in text and "embedding diff" in text
