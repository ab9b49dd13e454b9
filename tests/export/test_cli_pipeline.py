"""End to end through the CLI: export DeiT-S ToMe r=16, inspect the graph, validate, profile, inspect GFLOPs."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from deploytk.cli import app
from deploytk.ops import PLUGIN_ATTRIBUTES

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "export_configs" / "deit_small_tome_r16.yaml"
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def deit_s(tmp_path_factory):
    out = tmp_path_factory.mktemp("art") / "deit_s"
    result = invoke("export", CONFIG, "--output", out, "--json")
    assert result.exit_code == 0, result.output
    return out, json.loads(result.stdout)


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_export_writes_model_and_manifest(deit_s):
    out, manifest = deit_s
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "model.onnx"]
    assert manifest["schedule"]["tokens_per_layer"] == [197 - 16 * i for i in range(12)]
    assert manifest["schedule"]["effective_r"] == [16] * 11 + [10]
    assert manifest["custom_ops"] == {"ToMeMatch": 12, "TokenAggregate": 23, "ProportionalAttention": 12}  # last sizes unused
    assert manifest["onnx"]["export_seconds"] > 0  # recorded; not a verdict on the machine's speed
    assert manifest["inputs"][0]["shape"] == ["batch", 3, 224, 224]
    assert manifest["versions"]["torch"]


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_graph_has_one_custom_op_per_block_with_function_and_plugin_attributes(deit_s):
    out, _ = deit_s
    model = onnx.load(str(out / "model.onnx"))
    assert model.ir_version == 10
    onnx.checker.check_model(model, full_check=True)
    functions = {(f.domain, f.name) for f in model.functions}
    custom = [n for n in model.graph.node if n.domain == "deploytk"]
    assert sorted({n.op_type for n in custom}) == ["ProportionalAttention", "ToMeMatch", "TokenAggregate"]
    assert sum(n.op_type == "ToMeMatch" for n in custom) == 12
    assert sum(n.op_type == "ProportionalAttention" for n in custom) == 12
    for node in custom:
        assert ("deploytk", node.op_type) in functions
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        for key, value in PLUGIN_ATTRIBUTES.items():
            assert attrs[key] == value.encode()
    merge_r = [onnx.helper.get_attribute_value(a) for n in custom if n.op_type == "ToMeMatch" for a in n.attribute if a.name == "r"]
    assert merge_r == [16] * 11 + [10]
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


def test_dynamic_batch_runs(deit_s):
    from deploytk.backends.ort import ort_session

    out, _ = deit_s
    sess = ort_session(out / "model.onnx")
    for b in (1, 3):
        logits = sess.run(None, {"input": np.zeros((b, 3, 224, 224), np.float32)})[0]
        assert logits.shape == (b, 1000)


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_validate_passes_on_64_images(deit_s):
    out, _ = deit_s
    result = invoke("validate", out, "--json")
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed["passed"] and printed["backends"] == ["ort"]
    (report,) = printed["reports"]  # one backend: one report, as with several
    assert report["passed"] and report["num_images"] == 64
    assert report["max_abs_diff"] <= 1e-4
    assert report["top1_agreement"] == 1.0


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_validate_fails_with_exit_1_when_tolerance_is_impossible(deit_s):
    out, _ = deit_s
    result = invoke("validate", out, "--json", "--atol", "0", "--rtol", "0", "--num-samples", "8")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["passed"] is False


def test_validate_refuses_a_modified_model(deit_s, tmp_path):
    import shutil

    out, _ = deit_s
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    with open(copy / "model.onnx", "ab") as f:
        f.write(b"\0")
    result = invoke("validate", copy)
    assert result.exit_code == 2
    assert "does not match its manifest" in result.output


def test_profile_json_has_contract_keys(deit_s):
    out, _ = deit_s
    result = invoke("profile", out, "--backend", "ort", "--batch-sizes", "1", "--warmup", "1", "--iterations", "2", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    row = data["results"][0]
    assert row["batch_size"] == 1
    assert set(row["latency_ms"]) == {"p50", "mean", "max", "samples"}  # 2 runs back no p90 or p99
    assert row["throughput"] > 0 and row["speedup_vs_dense"] > 0
    assert not (out / ".baseline").exists()  # the dense baseline goes to deploytk's cache folder, never into the artifact
    from deploytk.exporter.artifacts import Artifact
    from deploytk.exporter.baseline import baseline_name
    from deploytk.files import cache_root

    assert (cache_root() / "baselines" / baseline_name(Artifact.open(out))).is_file()


def test_profile_torch_backend(deit_s):
    out, _ = deit_s
    result = invoke("profile", out, "--backend", "torch", "--batch-sizes", "2", "--warmup", "0", "--iterations", "1", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["results"][0]["batch_size"] == 2


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize(
    "model,r,published",
    [
        ("deit_small_patch16_224", 0, 4.6),
        ("deit_small_patch16_224", 8, 3.4),
        ("deit_small_patch16_224", 13, 2.7),
        ("deit_small_patch16_224", 16, 2.3),
        ("deit_tiny_patch16_224", 0, 1.3),
        ("deit_tiny_patch16_224", 8, 0.9),
        ("deit_tiny_patch16_224", 12, 0.8),
        ("deit_tiny_patch16_224", 16, 0.6),
    ],
)
def test_inspect_reproduces_published_gflops(model, r, published):
    # ToMe paper (off-the-shelf DeiT): DeiT-S 4.6 / 3.4 / 2.7 / 2.3, DeiT-T 1.3 / 0.9 / 0.8 / 0.6
    result = invoke("inspect", CONFIG, "--model", model, "--r", r, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert round(report["gflops"], 1) == published
    assert len(report["tokens_per_layer"]) == 12


def test_inspect_json_only_json_on_stdout():
    result = invoke("inspect", CONFIG, "--r", "16:-1", "--json")
    report = json.loads(result.stdout)
    assert report["requested_r"][0] == 32 and report["requested_r"][-1] == 0


def test_doctor_reports_tensorrt_absent():
    result = invoke("doctor", "--json")
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert report["packages"]["onnxruntime"]
    assert "CPUExecutionProvider" in report["onnxruntime_providers"]
    if report["tensorrt"] is None:
        assert "TensorRT" in report["tensorrt_hint"]


def test_doctor_flags_a_tensorrt_without_aot_plugins(monkeypatch):
    from deploytk import diagnostics as doctor

    monkeypatch.setattr(doctor, "tensorrt_version", lambda: "10.8.0.43")
    report = doctor.environment_report()
    assert report["tensorrt"] == "10.8.0.43" and "need TensorRT >= 10.9" in report["tensorrt_hint"]


def test_tail_percentiles_only_where_enough_runs_back_them():
    from deploytk.profile.profiler import latency_stats

    few = latency_stats([0.010 + 0.001 * i for i in range(20)], 1)["latency_ms"]
    assert few["max"] == 29.0 and few["samples"] == 20 and "p90" in few and "p99" not in few  # p99 of 20 runs is only the max
    many = latency_stats([0.001 * i for i in range(1, 101)], 1)["latency_ms"]
    assert many["p99"] == pytest.approx(99.01) and many["p90"] == pytest.approx(90.1)
