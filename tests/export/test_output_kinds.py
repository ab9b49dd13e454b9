"""``export.output`` through export, validate and package: patch_features and tokens on ONNX Runtime and OpenVINO.

With no reduction the exported outputs equal the plain model's own patch tokens / layer features (timm's
forward_features, transformers' last_hidden_state and hidden_states) within 1e-5 for DeiT, DINOv2 with registers
and CLIP; reduced, they validate with default settings; the manifest, inspect and the Triton config name and shape
every output.
"""

import json

import numpy as np
import pytest
import timm
import torch
import transformers
from typer.testing import CliRunner

from deploytk.backends import get_backend
from deploytk.cli import app
from deploytk.config import config_from_dict
from deploytk.exporter.artifacts import Artifact
from deploytk.exporter.pipeline import run_export
from deploytk.validate.validator import run_validation

from helpers import seeded_init

BACKENDS = ("ort", "openvino")


def x_batch(size=32, n=2):
    return np.random.default_rng(4).standard_normal((n, 3, size, size)).astype(np.float32)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (config's model entry, the model as users call it, its prefix tokens): 4 blocks, 32 px, random weights."""
    root = tmp_path_factory.mktemp("outputs")
    out = {}
    for name, config_class, extra, prefix in (
        ("Dinov2WithRegistersModel", "Dinov2WithRegistersConfig", {"mlp_ratio": 2, "num_register_tokens": 4}, 5),
        ("CLIPVisionModel", "CLIPVisionConfig", {"intermediate_size": 128}, 1),
    ):
        config = getattr(transformers, config_class)(
            hidden_size=64, num_hidden_layers=4, num_attention_heads=2, image_size=32, patch_size=4, **extra
        )
        model = seeded_init(getattr(transformers, name)(config), seed=2).eval()
        model.save_pretrained(root / name)
        out[name] = ({"model": f"hf:{root / name}"}, model, prefix)
    kwargs = {"depth": 4, "patch_size": 4}
    torch.manual_seed(0)  # deploytk builds random timm weights with seed 0 (models.RANDOM_INIT_SEED)
    deit = timm.create_model("deit_tiny_patch16_224", img_size=32, **kwargs).eval()
    out["deit"] = ({"model": "deit_tiny_patch16_224", "model_kwargs": kwargs}, deit, 1)
    return out


def own_features(model, x, layer):
    """The plain model's own features: its final patch tokens (layer None) or hidden_states[layer], all tokens."""
    t = torch.from_numpy(x)
    with torch.no_grad():
        if isinstance(model, timm.models.vision_transformer.VisionTransformer):
            if layer is None:
                return model.forward_features(t).numpy()
            h = model.norm_pre(model._pos_embed(model.patch_embed(t)))
            for blk in model.blocks[: len(model.blocks) + 1 + layer if layer < 0 else layer]:
                h = blk(h)
            return h.numpy()
        out = model(pixel_values=t, output_hidden_states=True)
        return (out.last_hidden_state if layer is None else out.hidden_states[layer]).numpy()


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize("name", ["deit", "Dinov2WithRegistersModel", "CLIPVisionModel"])
def test_no_reduction_outputs_equal_the_models_own_on_both_runtimes(name, models, tmp_path):
    entry, model, prefix = models[name]
    x = x_batch()
    for output, layer in (("patch_features", None), ("tokens", -2)):
        export = {"img_size": 32, "batch_size": 2, "output": output} | ({"feature_layer": layer} if layer else {})
        cfg = config_from_dict(entry | {"merge": {"method": "tome", "r": 0}, "export": export})
        out = tmp_path / f"{name}-{output}"
        manifest = run_export(cfg, out, fmt="onnx-inlined")
        want = own_features(model, x, layer)[:, prefix:]
        first = manifest["outputs"][0]
        assert first["name"] == output and first["shape"] == ["batch", *want.shape[1:]]
        for backend in BACKENDS:
            got = get_backend(backend).load(Artifact.open(out), [2]).run(x)
            np.testing.assert_allclose(got[output], want, rtol=0, atol=1e-5, err_msg=f"{name} {output} on {backend}")
            if output == "tokens":
                np.testing.assert_array_equal(got["token_sizes"], np.ones(want.shape[:2], np.float32))


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize(
    ("merge", "export"),
    [
        ({"method": "tome", "r": 2}, {"output": "patch_features"}),
        ({"method": "evit", "options": {"keep_rate": 0.5, "layers": [1, 2]}}, {"output": "tokens", "feature_layer": -2, "token_map": True}),
        ({"method": "kmedoids", "options": {"keep_rate": 0.5, "layers": [2]}}, {"output": "patch_features"}),
    ],
)
def test_reduced_outputs_validate_with_default_settings(merge, export, models, tmp_path):
    entry = models["deit"][0]
    cfg = config_from_dict(entry | {"merge": merge, "export": {"img_size": 32, "batch_size": 2} | export})
    run_export(cfg, tmp_path / "a", fmt="onnx-inlined")
    for backend in BACKENDS:
        report, _ = run_validation(tmp_path / "a", backend, num_samples=8, batch_size=4)
        assert report.passed, report.to_dict()
        assert report.output_kind == export["output"] and report.top1_agreement is None


def test_inspect_and_package_name_and_shape_every_output(models, tmp_path):
    entry = models["deit"][0]
    cfg = entry | {
        "merge": {"method": "evit", "options": {"keep_rate": 0.5, "layers": [1, 2]}},
        "export": {"img_size": 32, "batch_size": 2, "output": "tokens", "feature_layer": -2, "token_map": True},
    }
    (tmp_path / "c.yaml").write_text(json.dumps(cfg))
    runner = CliRunner()
    inspected = runner.invoke(app, ["inspect", str(tmp_path / "c.yaml"), "--json"])
    assert inspected.exit_code == 0, inspected.output
    output = json.loads(inspected.output)["output"]
    k = output.pop("tokens")
    assert output == {
        "kind": "tokens",
        "names": ["tokens", "token_sizes", "patch_to_token"],
        "feature_layer": -2,
        "blocks_run": 3,  # hidden_states[-2] of 4 blocks
        "keep_prefix_tokens": False,
        "token_map": True,
    }
    manifest = run_export(config_from_dict(cfg), tmp_path / "a")
    shapes = {o["name"]: o["shape"] for o in manifest["outputs"]}
    assert shapes == {"tokens": ["batch", k, 192], "token_sizes": ["batch", k], "patch_to_token": ["batch", 64]}  # K as inspect said
    assert k < 64
    result = runner.invoke(app, ["package", str(tmp_path / "a"), "--triton", str(tmp_path / "repo")])
    assert result.exit_code == 0, result.output
    pbtxt = (tmp_path / "repo" / "a" / "config.pbtxt").read_text()
    for name, dtype, dims in (("tokens", "FP32", f"{k}, 192"), ("token_sizes", "FP32", f"{k}"), ("patch_to_token", "INT64", "64")):
        assert f'name: "{name}"\n    data_type: TYPE_{dtype}\n    dims: [ {dims} ]' in pbtxt
