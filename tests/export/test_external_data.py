"""Models past protobuf's 2 GiB limit: weights in an external data file beside the ONNX, written with the export, hashed
in the manifest, read by every backend, copied by `package`. The default suite lowers the limit so that the digits ViT
takes that path; the slow test exports a real ViT-H (2.5 GB of fp32 weights)."""

import numpy as np
import pytest

from deploytk.backends import get_backend
from deploytk.errors import DeploytkError
from deploytk.exporter import onnx_io
from deploytk.exporter.artifacts import Artifact
from deploytk.exporter.baseline import baseline_onnx
from deploytk.exporter.pipeline import run_export
from deploytk.models import build_reference
from deploytk.package import package_triton
from deploytk.validate.validator import run_validation

from helpers import digits_config


@pytest.fixture
def large(monkeypatch):
    monkeypatch.setattr(onnx_io, "EXTERNAL_DATA_BYTES", 1024)  # every weight tensor of the digits ViT goes external


def test_an_export_past_the_limit_keeps_its_weights_beside_it_and_every_backend_reads_them(large, tmp_path):
    out = tmp_path / "a"
    manifest = run_export(digits_config("digits_vit_tome_r4"), out, fmt="onnx-inlined")
    assert manifest["onnx"]["external_data"]["file"] == "model.onnx.data"
    assert manifest["onnx_inlined"]["external_data"]["file"] == "model.inlined.onnx.data"
    data = out / "model.onnx.data"
    assert data.stat().st_size > 10 * (out / "model.onnx").stat().st_size  # the graph stays, the weights (5.4 MB) moved
    assert data.stat().st_mode & 0o777 == (out / "model.onnx").stat().st_mode & 0o777
    x = np.random.default_rng(0).standard_normal((8, 3, 32, 32)).astype(np.float32)
    import torch

    with torch.no_grad():
        want = build_reference(digits_config("digits_vit_tome_r4"))(torch.from_numpy(x)).numpy()
    artifact = Artifact.open(out)
    for backend in ("ort", "openvino"):  # each inlines or reads the graph through a temporary external-data copy
        got = next(iter(get_backend(backend).load(artifact, [8]).run(x).values()))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    report, _ = run_validation(out, "ort", num_samples=8, batch_size=8)  # the graph with probe outputs, too
    assert report.passed, report.to_dict()
    baseline = baseline_onnx(artifact)  # profile's unmerged baseline, cached with its own data file
    assert (baseline.parent / f"{baseline.name}.data").is_file()
    merged, dense = get_backend("ort").load_for_timing(artifact, [8])
    assert next(iter(dense.run(x).values())).shape == want.shape
    repo = package_triton(out, tmp_path / "repo")
    assert sorted(p.name for p in (tmp_path / "repo" / repo["name"] / "1").iterdir()) == ["model.onnx", "model.onnx.data"]


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_a_changed_or_missing_data_file_is_refused(large, tmp_path):
    out = tmp_path / "a"
    run_export(digits_config("digits_vit_tome_r4"), out)
    data = out / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(DeploytkError, match=r"model.onnx.data does not match its manifest .*changed or removed after export"):
        Artifact.open(out)
    data.unlink()
    with pytest.raises(DeploytkError, match=r"model.onnx.data does not match its manifest \(sha256 \(missing\)"):
        Artifact.open(out)


@pytest.mark.slow
def test_a_real_vit_h_past_two_gib_exports_and_runs(tmp_path):
    """ViT-H/14 in fp32: 632 M parameters, 2.5 GB of weights (about 5 min and 12 GB of memory on a 2-core CPU)."""
    import torch

    from deploytk.config import config_from_dict

    cfg = config_from_dict({"model": "vit_huge_patch14_224", "export": {"batch_size": 1}, "merge": {"method": "tome", "r": 8}})
    manifest = run_export(cfg, tmp_path / "h")
    assert (tmp_path / "h" / "model.onnx.data").stat().st_size > 2**31 > (tmp_path / "h" / "model.onnx").stat().st_size
    assert manifest["onnx"]["external_data"]["file"] == "model.onnx.data"
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    got = next(iter(get_backend("ort").load(Artifact.open(tmp_path / "h"), [1]).run(x).values()))
    with torch.no_grad():
        want = build_reference(cfg)(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
    for backend in ("ort", "openvino"):  # probes and inlining work on the graph without its weights: protobuf's limit
        report, _ = run_validation(tmp_path / "h", backend, num_samples=2, batch_size=1)
        assert report.passed, (backend, report.to_dict())
