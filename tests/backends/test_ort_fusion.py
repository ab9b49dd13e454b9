"""ONNX Runtime's fused copy (``fmt='onnx-ort'``: model.ort.onnx): the same numbers as model.onnx, in fused ops, run by
the ``ort`` backend for outputs and latency, against a dense baseline fused the same way; refused where it cannot help."""

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from typer.testing import CliRunner

import deploytk
from deploytk.backends.base import seeded_batch
from deploytk.cli import app
from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import Artifact
from deploytk.exporter.baseline import baseline_onnx, fused_baseline_onnx

from helpers import DIGITS_INPUT, snapshot

STEM = "digits_vit_tome_r4"
runner = CliRunner()


def outputs(path, batch):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": batch})


def op_counts(path) -> collections.Counter:
    return collections.Counter((n.domain or "ai.onnx", n.op_type) for n in onnx.load(str(path)).graph.node)


@pytest.fixture(scope="module")
def fused(exported):
    return exported(STEM, fmt="onnx-ort")


def test_the_fused_copy_computes_what_model_onnx_computes(fused):
    manifest = deploytk.load(fused).manifest
    batch = seeded_batch(4, DIGITS_INPUT)
    for plain, merged in zip(outputs(fused / "model.onnx", batch), outputs(fused / "model.ort.onnx", batch), strict=True):
        np.testing.assert_allclose(merged, plain, rtol=0, atol=1e-5)
    counts = op_counts(fused / "model.ort.onnx")
    assert not any(domain == "deploytk" for domain, _ in counts)  # everything inlined or rewritten
    # each ProportionalAttention is one standard Attention op; the optimizer's fusions are in the file as it says
    attention = manifest["custom_ops"]["ProportionalAttention"]
    assert counts[("ai.onnx", "Attention")] == attention == manifest["onnx_ort"]["fusions"]["Attention"]
    for op in ("SkipLayerNormalization", "BiasGelu"):
        assert counts[("com.microsoft", op)] == manifest["onnx_ort"]["fusions"][op] > 0, op
    assert manifest["onnx_ort"]["onnxruntime"] == ort.__version__


def test_the_ort_backend_validates_the_fused_copy(fused, exported):
    report = deploytk.load(fused).validate("ort", num_samples=16)
    assert report.passed and report.reports[0]["runtime_settings"]["graph"] == "model.ort.onnx"
    plain = deploytk.load(exported(STEM)).validate("ort", num_samples=16)
    assert plain.reports[0]["runtime_settings"]["graph"] == "model.onnx"


@pytest.mark.slow  # a second torch export (the dense baseline) and its fusion, four sessions
def test_profile_times_it_against_the_dense_baseline_fused_the_same_way(fused):
    report = deploytk.load(fused).profile("ort", batch_sizes=[1], warmup=0, iterations=1).to_dict()
    assert report["runtime_settings"]["graph"] == "model.ort.onnx"
    assert report["dense_runtime_settings"]["graph"].endswith(".ort.onnx")
    artifact = Artifact.open(fused)
    dense, dense_fused = baseline_onnx(artifact), fused_baseline_onnx(artifact)
    batch = seeded_batch(2, DIGITS_INPUT)
    np.testing.assert_allclose(outputs(dense_fused, batch)[0], outputs(dense, batch)[0], rtol=0, atol=1e-5)
    assert op_counts(dense_fused)[("com.microsoft", "SkipLayerNormalization")] > 0


def test_a_changed_fused_copy_is_refused(exported, tmp_path):
    folder = exported.copy(STEM, tmp_path / "art", fmt="onnx-ort")
    with open(folder / "model.ort.onnx", "ab") as f:
        f.write(b"\0")
    before = snapshot(folder)
    with pytest.raises(DeploytkError, match=r"model\.ort\.onnx is missing or does not match its manifest") as raised:
        deploytk.load(folder).validate("ort", num_samples=4)
    assert "fmt='onnx-ort'" in raised.value.hint
    assert snapshot(folder) == before


def test_bf16_with_the_fused_format_is_refused_before_any_work(tmp_path):
    from helpers import CONFIGS

    out = tmp_path / "art"
    args = ["export", str(CONFIGS / f"{STEM}.yaml"), "--output", str(out), "--precision", "bf16", "--format", "onnx-ort"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "no bf16 kernels" in result.output and "--precision fp32" in result.output and "--format 'onnx'" in result.output
    assert not out.exists()


def test_export_names_the_fused_copy(fused, capsys):
    """What `deploytk export --format onnx-ort` prints after the export (its renderer, on the shared export's report)."""
    from deploytk.cli import render

    render.export(deploytk.load(fused).to_dict(), json_out=False)
    printed = capsys.readouterr().out
    assert "ONNX Runtime's fused copy (Attention 12, BiasGelu 12" in printed and f"{fused}/model.ort.onnx" in printed
