"""The TensorRT path end to end: build, validate, profile, refusal of a stale engine.

Needs TensorRT and a CUDA GPU (marked ``trt`` and ``gpu``; skipped with the reason
elsewhere). Uses the trained digits ViT with ToMe in fp16, built with the deploytk plugins
and with the native paths.
"""

import json
import shutil

import pytest

from deploytk.errors import DeploytkError

from helpers import export_config

pytestmark = [pytest.mark.trt, pytest.mark.gpu]


@pytest.fixture(scope="module")
def digits_fp16(tmp_path_factory):
    return export_config("digits_vit_tome_r4_fp16", tmp_path_factory.mktemp("trt") / "digits_fp16")


@pytest.mark.parametrize("merge_impl,attention_impl", [("plugin", "plugin"), ("native", "native")])
def test_engine_builds_validates_and_profiles(digits_fp16, merge_impl, attention_impl, tmp_path):
    from deploytk.build.builder import build_engine
    from deploytk.build.options import build_options
    from deploytk.profile.profiler import profile
    from deploytk.validate.validator import Tolerances, validate

    art = tmp_path / "art"
    shutil.copytree(digits_fp16, art)
    record = build_engine(art, build_options("1,8,16", merge_impl=merge_impl, attention_impl=attention_impl))
    assert (art / "model.engine").stat().st_size > 0 and (art / "baseline.engine").stat().st_size > 0
    assert record["plugin_ops"] == (["ProportionalAttention", "ToMeMatch", "TokenAggregate"] if merge_impl == "plugin" else [])
    report = validate(art, "trt", None, Tolerances.for_precision("fp16"))
    assert report.passed, report.to_dict()
    result = profile(art, "trt", [1, 16], warmup=5, iterations=20)
    assert [r["batch_size"] for r in result["results"]] == [1, 16]
    assert all(r["latency_ms"]["p50"] > 0 and r["speedup_vs_dense"] > 0 for r in result["results"])


def test_engine_for_another_onnx_is_refused(digits_fp16, tmp_path):
    from deploytk.build.builder import build_engine
    from deploytk.build.options import build_options
    from deploytk.validate.validator import Tolerances, validate

    art = tmp_path / "art"
    shutil.copytree(digits_fp16, art)
    build_engine(art, build_options("8", baseline=False))
    record = json.loads((art / "engine.json").read_text())
    record["onnx_sha256"] = "0" * 64
    (art / "engine.json").write_text(json.dumps(record))
    with pytest.raises(DeploytkError, match="built from a different model.onnx"):
        validate(art, "trt", None, Tolerances.for_precision("fp16"))
