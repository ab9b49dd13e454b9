"""Bad input: one clear paragraph naming the field/value, exit 2, no traceback, nothing written."""

import hashlib
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from deploytk.cli import app

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "export_configs" / "deit_tiny_tome_r8.yaml"
runner = CliRunner()


def write_config(tmp_path, text):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def export_fails(tmp_path, *args, match):
    out = tmp_path / "out"
    result = runner.invoke(app, ["export", *[str(a) for a in args], "--output", str(out)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert match in " ".join(result.output.split()), result.output
    assert not out.exists(), "a failed export must leave no artifact"
    assert not any(p.name.startswith(".out") for p in tmp_path.iterdir()), "no temp dir left behind"
    return result.output


def test_unknown_config_key(tmp_path):
    cfg = write_config(tmp_path, "model: deit_tiny_patch16_224\nmerge:\n  method: tome\n  rr: 8\n")
    export_fails(tmp_path, cfg, match="unknown key `merge.rr` (allowed keys here: method, r, prop_attn, options)")


def test_yaml_syntax_error_names_the_line(tmp_path):
    cfg = write_config(tmp_path, "model: deit_tiny_patch16_224\nmerge:\n  r: [8, 8\n  method: tome\n")
    export_fails(tmp_path, cfg, match="is not valid YAML at line 4")


def test_unknown_timm_model(tmp_path):
    export_fails(
        tmp_path,
        CONFIG,
        "--model",
        "deit_smal_patch16_224",
        match="unknown timm model 'deit_smal_patch16_224' (`model`). Did you mean: deit_small_patch16_224",
    )


def test_non_vit_model(tmp_path):
    export_fails(tmp_path, CONFIG, "--model", "resnet18", match="'resnet18' is not a timm VisionTransformer")


def test_unknown_method(tmp_path):
    output = export_fails(tmp_path, CONFIG, "--method", "tomee", match="unknown merge method 'tomee' (`merge.method`); available: ")
    from deploytk.reducers import METHODS

    assert ", ".join(METHODS) in " ".join(output.split()) and "tome" in METHODS


def test_negative_r(tmp_path):
    cfg = write_config(tmp_path, "model: deit_tiny_patch16_224\nmerge:\n  r: -4\n")
    export_fails(tmp_path, cfg, match="`merge.r` = -4: r must not be negative")


def test_non_numeric_r(tmp_path):
    cfg = write_config(tmp_path, "model: deit_tiny_patch16_224\nmerge:\n  r: lots\n")
    export_fails(tmp_path, cfg, match="`merge.r` = 'lots'")
    export_fails(tmp_path, CONFIG, "--r", "abc", match="--r 'abc' is not a valid r spec")


def test_r_above_cap_is_legal_and_reported(tmp_path):
    result = runner.invoke(app, ["inspect", str(CONFIG), "--r", "500", "--json"])
    assert result.exit_code == 0, result.output
    import json

    report = json.loads(result.stdout)
    assert report["capped"] and report["effective_r"][0] == 98


def test_an_export_above_the_cap_records_the_capped_r_and_says_so(tmp_path):
    """Issue 53: `--r 200` ran capped per block while the manifest recorded r=200 (the CLI's note said so, the Python API
    nothing). The manifest's `merge.r` is now what runs, the export's summary says it was capped, and validate rebuilds
    the same schedule from the recorded config."""
    import json

    out = tmp_path / "capped"
    config = ROOT / "export_configs" / "digits_vit_tome_r4.yaml"  # 65 tokens, 12 blocks
    result = runner.invoke(app, ["export", str(config), "--r", "200", "--output", str(out)])
    assert result.exit_code == 0, result.output
    effective = [32, 16, 8, 4, 2, 1, 0, 0, 0, 0, 0, 0]
    printed = " ".join(result.stdout.split())
    assert f"(tome, r={effective})" in printed
    assert (
        f"note: r = 200 (`merge.r`) capped to {effective} per block: a block cannot merge away more than half of its tokens "
        "(ToMe's rule, protected tokens not counted); the manifest records the capped r, the schedule that runs"
    ) in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["merge"]["r"] == manifest["schedule"]["effective_r"] == effective
    assert manifest["schedule"]["configured_r"] == 200 and manifest["schedule"]["capped"] is True
    validated = runner.invoke(app, ["validate", str(out), "--num-samples", "4", "--batch-size", "4", "--json"])
    assert validated.exit_code == 0, validated.output
    assert json.loads(validated.stdout)["passed"] is True


def test_missing_checkpoint(tmp_path):
    export_fails(tmp_path, CONFIG, "--checkpoint", tmp_path / "nope.pth", match="nope.pth does not exist")


def test_corrupt_checkpoint(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    export_fails(tmp_path, CONFIG, "--checkpoint", bad, match="bad.safetensors could not be read")
    bad_pth = tmp_path / "bad.pth"
    bad_pth.write_bytes(b"garbage")
    export_fails(tmp_path, CONFIG, "--checkpoint", bad_pth, match="bad.pth could not be read")


def test_mismatched_checkpoint_names_parameter_and_shapes(tmp_path):
    import timm
    from safetensors.torch import save_file

    small = timm.create_model("deit_small_patch16_224", depth=1)
    ckpt = tmp_path / "small.safetensors"
    save_file(small.state_dict(), str(ckpt))
    out = export_fails(tmp_path, CONFIG, "--checkpoint", ckpt, match="does not match model VisionTransformer")
    assert "parameter 'cls_token' has shape [1, 1, 384] in the checkpoint but [1, 1, 192] in the model" in " ".join(out.split())


def test_checkpoint_round_trip_loads(tmp_path):
    """A correct checkpoint (torch.save state_dict) is accepted: the mismatch test can fail."""
    import timm

    from deploytk.config import config_from_dict
    from deploytk.models import create_vit

    tiny = timm.create_model("deit_tiny_patch16_224")
    with torch.no_grad():
        tiny.head.bias.fill_(0.5)
    path = tmp_path / "tiny.pth"
    torch.save(tiny.state_dict(), path)
    vit = create_vit(config_from_dict({"model": "deit_tiny_patch16_224", "checkpoint": str(path)}))
    assert torch.all(vit.head.bias == 0.5)


@pytest.mark.parametrize("command", ["validate", "profile"])
def test_missing_artifact_directory(tmp_path, command):
    result = runner.invoke(app, [command, str(tmp_path / "missing")])
    assert result.exit_code == 2
    assert "artifact directory" in result.output and "does not exist" in result.output
    assert "Traceback" not in result.output


def test_directory_without_model_is_not_an_artifact(tmp_path):
    result = runner.invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 2
    assert "model.onnx is missing" in result.output


def test_tensorrt_commands_fail_cleanly_without_tensorrt(tmp_path):
    from deploytk.optional import tensorrt_version

    if tensorrt_version() is not None:
        pytest.skip("TensorRT is installed here")
    from deploytk.exporter.artifacts import MANIFEST_FORMAT, write_manifest

    (tmp_path / "model.onnx").write_bytes(b"")
    # an artifact that passes the manifest's own checks and deploytk.load's (model.onnx's sha256), as `build` loads it first
    write_manifest(tmp_path, {"format": MANIFEST_FORMAT, "onnx": {"sha256": hashlib.sha256(b"").hexdigest()}})
    result = runner.invoke(app, ["build", str(tmp_path)])
    assert result.exit_code == 2
    assert "needs TensorRT, which is not installed" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "model.onnx"]  # nothing half-written
    result = runner.invoke(app, ["build", str(tmp_path), "--merge-impl", "fast"])  # options are checked first
    assert result.exit_code == 2 and "--merge-impl 'fast': Input should be 'plugin' or 'native'." in result.output, result.output


def test_validate_and_profile_on_tensorrt_fail_cleanly_without_tensorrt(tmp_path):
    from deploytk.optional import tensorrt_version

    if tensorrt_version() is not None:
        pytest.skip("TensorRT is installed here")
    art = tmp_path / "art"
    config = Path(__file__).resolve().parents[1] / "export_configs" / "digits_vit_dense.yaml"
    assert runner.invoke(app, ["export", str(config), "--output", str(art)]).exit_code == 0
    before = sorted(p.name for p in art.iterdir())
    for command in (["validate", str(art), "--backend", "trt"], ["profile", str(art), "--backend", "trt"]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, result.output
        assert f"{command[0]} --backend trt needs TensorRT, which is not installed" in result.output
        assert "pip install tensorrt" in result.output and "Traceback" not in result.output
    assert sorted(p.name for p in art.iterdir()) == before  # nothing written


def test_an_opset_deploytk_does_not_export_is_refused(tmp_path):
    cfg = write_config(tmp_path, "model: deit_tiny_patch16_224\nexport:\n  opset: 21\n")
    export_fails(tmp_path, cfg, match="`export.opset` = 21: Input should be 18; allowed: 18, the opset deploytk exports and tests")
