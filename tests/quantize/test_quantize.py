"""`deploytk quantize`: int8 artifacts for ONNX Runtime, TensorRT's Q/DQ rules and OpenVINO (NNCF), their validation,
the Q/DQ placement rules, a broken quantization that validation catches, and bad input that writes nothing."""

import json
import re
import shutil

import numpy as np
import onnx
import pytest

from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import Artifact, write_manifest
from deploytk.exporter.manifest import sha256_file
from deploytk.exporter.probes import choice_inputs_quantized
from deploytk.quantize import run_quantize
from deploytk.quantize.qdq import trt_rule_violations, weight_ops
from deploytk.validate.validator import Tolerances, validate

from helpers import snapshot

pytest.importorskip("onnxruntime.quantization")


@pytest.fixture(scope="module")
def digits(tmp_path_factory, exported):
    """The digits images and, as ``tome``, a copy of the shared digits ToMe export (quantize adds its dense baseline to
    the source, and the refusals here compare the source before and after)."""
    from deploytk.evaluation.digits import write_digits_imagefolder

    root = tmp_path_factory.mktemp("int8")
    write_digits_imagefolder(root / "digits", img_size=32)
    exported.copy("digits_vit_tome_r4", root / "tome")
    return root


@pytest.fixture(scope="module")
def ort_int8(digits):
    run_quantize(digits / "tome", "ort", data=digits / "digits" / "train", num_samples=64, output=digits / "tome-ort")
    return digits / "tome-ort"


@pytest.fixture(scope="module")
def trt_int8(digits):
    run_quantize(digits / "tome", "trt", data=digits / "digits" / "train", num_samples=64, output=digits / "tome-trt")
    return digits / "tome-trt"


def val_batches(digits, n=128):
    from deploytk.data import folder_batches
    from deploytk.models import build_reference

    family = build_reference(Artifact.open(digits / "tome").config).family
    return folder_batches(digits / "digits" / "val", n, 8, family.eval_transform(), family.input_kind)


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_ort_int8_validates_on_held_out_digits_and_records_its_provenance(digits, ort_int8):
    report = validate(ort_int8, "ort", val_batches(digits), Tolerances.for_precision("int8"))
    assert report.passed, report.checks
    assert report.precision == "int8"
    assert report.cosine_similarity_mean >= 0.95 and report.top1_agreement >= 0.9
    # int8 moves the metric, so merges differ from the fp32 reference's, and every one is still the op's own choice
    assert report.choices["images_with_other_choices"] > 0
    assert report.choices["unreproduced"] == [] and report.choices["quantized_inputs"] == []
    q = Artifact.open(ort_int8).quantization
    assert q["runtime"] == "ort" and q["calibration"]["images"] == 64 and q["calibration"]["source"].endswith("train")
    assert q["source"]["onnx_sha256"] == sha256_file(digits / "tome" / "model.onnx")
    assert q["quantized_ops"] == {"Conv": 1, "MatMul": 48, "Gemm": 1}  # 12 blocks x (qkv, proj, fc1, fc2), patch embedding, head
    graph = onnx.load(str(ort_int8 / "model.onnx"))
    assert {n.op_type for n in graph.graph.node if n.domain == "deploytk"} == {"ToMeMatch", "TokenAggregate", "ProportionalAttention"}
    dense = list((ort_int8 / ".baseline").glob("dense-*.onnx"))
    assert len(dense) == 1 and any(n.op_type == "DequantizeLinear" for n in onnx.load(str(dense[0])).graph.node)


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_trt_graph_keeps_tensorrt_explicit_quantization_rules(trt_int8):
    graph = onnx.load(str(trt_int8 / "model.onnx"))
    assert trt_rule_violations(graph) == []
    producer = {o: n for n in graph.graph.node for o in n.output}
    inits = {i.name: i for i in graph.graph.initializer}
    for name in weight_ops(graph):
        node = next(n for n in graph.graph.node if n.name == name)
        dqs = [producer[i] for i in node.input[:2]]
        assert [d.op_type for d in dqs] == ["DequantizeLinear"] * 2, name  # both inputs int8: TensorRT fuses them into the kernel
        weight = inits[dqs[1].input[0]]
        assert weight.data_type == onnx.TensorProto.INT8
        scale = onnx.numpy_helper.to_array(inits[dqs[1].input[1]])
        assert scale.size == weight.dims[0 if node.op_type == "Conv" or (node.op_type == "Gemm") else 1]  # per output channel
    zero_points = [onnx.numpy_helper.to_array(inits[n.input[2]]) for n in graph.graph.node if n.op_type == "QuantizeLinear"]
    assert zero_points and all(z.dtype == np.int8 and not z.any() for z in zero_points)
    assert validate(trt_int8, "ort", None, Tolerances.for_precision("int8")).choices["unreproduced"] == []


def test_trt_rules_name_each_break(trt_int8, ort_int8):
    graph = onnx.load(str(trt_int8 / "model.onnx"))
    inits = {i.name: i for i in graph.graph.initializer}
    q = next(n for n in graph.graph.node if n.op_type == "QuantizeLinear")
    inits[q.input[2]].CopyFrom(onnx.numpy_helper.from_array(np.array(3, dtype=np.int8), q.input[2]))  # asymmetric
    problems = trt_rule_violations(graph)
    assert any(q.name in p and "zero point must be int8 zeros" in p for p in problems)
    # ONNX Runtime's own rules: uint8 activations with a zero point, which TensorRT refuses (the ort
    # graph was checked only when another test had made it first: the quick check's order decided the coverage)
    ort_problems = trt_rule_violations(onnx.load(str(ort_int8 / "model.onnx")))
    assert any("zero point must be int8 zeros" in p for p in ort_problems)


def _quantize_metric(graph: onnx.ModelProto) -> onnx.ModelProto:
    """The first ToMeMatch's metric through a coarse Q/DQ: a broken quantization (the choice made on int8 values)."""
    node = next(n for n in graph.graph.node if n.op_type == "ToMeMatch")
    metric = node.input[0]
    scale, zero = np.array(0.05, np.float32), np.array(0, np.int8)
    graph.graph.initializer.extend([onnx.numpy_helper.from_array(scale, "broken_scale"), onnx.numpy_helper.from_array(zero, "broken_zero")])
    q = onnx.helper.make_node("QuantizeLinear", [metric, "broken_scale", "broken_zero"], ["broken_q"], name="broken_Q")
    dq = onnx.helper.make_node("DequantizeLinear", ["broken_q", "broken_scale", "broken_zero"], ["broken_dq"], name="broken_DQ")
    node.input[0] = "broken_dq"
    index = list(graph.graph.node).index(node)
    graph.graph.node.insert(index, dq)
    graph.graph.node.insert(index, q)
    return graph


def test_a_quantized_metric_fails_validation(digits, ort_int8, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(ort_int8, broken)
    graph = _quantize_metric(onnx.load(str(broken / "model.onnx")))
    assert choice_inputs_quantized(graph)
    onnx.save(graph, str(broken / "model.onnx"))
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["onnx"]["sha256"] = sha256_file(broken / "model.onnx")
    write_manifest(broken, manifest)  # sealed again: the edit is what is tested
    report = validate(broken, "ort", val_batches(digits, 32), Tolerances.for_precision("int8"))
    assert not report.passed
    assert report.checks["int8: no matching op or input of one is quantized"] is False
    assert "ToMeMatch" in report.choices["quantized_inputs"][0]


def test_a_choice_that_is_not_the_ops_own_is_caught(digits, ort_int8):
    """The check behind "every choice is the op's own": a runtime whose matching op chose otherwise than the op does on
    the very inputs it was fed (a quantized similarity inside the op) is caught, image by image."""
    from deploytk.backends import get_backend
    from deploytk.exporter.probes import with_matching_outputs
    from deploytk.models import build_reference
    from deploytk.validate.branches import choices_reproduced

    artifact = Artifact.open(ort_int8)
    backend = get_backend("ort")
    proto, _ = backend.graph(artifact)
    probed, probes = with_matching_outputs(proto)
    loaded = backend.load(artifact, [8], probed)
    batches = val_batches(digits, 16)
    outputs = [loaded.run(b) for b in batches]
    reference = build_reference(artifact.config)
    assert choices_reproduced(reference, probes, batches, outputs)["unreproduced"] == []
    dest = outputs[1][probes[2].dest]
    dest[3, [0, 1]] = dest[3, [1, 0]] if dest[3, 0] != dest[3, 1] else dest[3, [0, 1]] + 1  # image 11, third matching call
    found = choices_reproduced(reference, probes, batches, outputs)["unreproduced"]
    assert [(u["image"], u["call"], u["op"]) for u in found] == [(11, 2, "ToMeMatch")]


def test_openvino_int8_validates_and_profiles_against_dense_int8(digits):
    pytest.importorskip("nncf")
    out = digits / "tome-ov"
    run_quantize(digits / "tome", "openvino", data=digits / "digits" / "train", num_samples=32, output=out)
    assert {p.name for p in out.iterdir()} >= {"model.xml", "model.bin", "model.onnx", "manifest.json"}
    report = validate(out, "openvino", val_batches(digits, 64), Tolerances.for_precision("int8"))
    assert report.passed, report.checks
    assert report.choices["unreproduced"] == [] and report.choices["quantized_inputs"] == []
    from deploytk.profile.profiler import profile

    result = profile(out, "openvino", [1], warmup=1, iterations=2)
    row = result["results"][0]
    assert row["latency_ms"]["p50"] > 0 and row["dense"]["latency_ms"]["p50"] > 0 and row["speedup_vs_dense"] > 0
    with pytest.raises(DeploytkError, match=r"quantized for openvino .* `backend=ort` does not run that graph"):
        validate(out, "ort", None, Tolerances.for_precision("int8"))
    from deploytk.package import package_triton

    repo = digits / "repo"
    with pytest.raises(DeploytkError, match=r"quantized for openvino .* package \(Triton's onnxruntime backend\) does not run"):
        package_triton(out, repo)
    assert not repo.exists()
    with pytest.raises(DeploytkError, match=r"fails validation .* judged on inputs like its calibration data: pass `data=`"):
        package_triton(out, repo, name="digits_int8", backend="openvino")  # synthetic noise is not what it was calibrated for
    assert not repo.exists()
    report = package_triton(out, repo, name="digits_int8", backend="openvino", data=digits / "digits" / "val")
    assert report["files"] == ["config.pbtxt", "1/model.xml", "1/model.bin", "README.md"]
    assert report["validation"]["passed"] and report["validation"]["stable_topk"] > 0
    readme = (repo / "digits_int8" / "README.md").read_text()
    assert re.search(r"int8 \(nncf [\d.]+ on openvino .*, openvino rules\), the rest fp32", readme)


def test_the_ort_int8_artifact_is_refused_by_openvino_and_tensorrt_builds(ort_int8, tmp_path):
    with pytest.raises(DeploytkError, match=r"quantized for ort .* `backend=openvino` does not run that graph"):
        validate(ort_int8, "openvino", None, Tolerances.for_precision("int8"))
    from deploytk.package import package_triton

    with pytest.raises(
        DeploytkError,
        match=r"for ort \(`deploytk quantize` with `backend=ort`\); package with `backend=openvino` \(Triton's openvino backend\) "
        r"does not run",
    ):
        package_triton(ort_int8, tmp_path / "repo", backend="openvino")
    assert not (tmp_path / "repo").exists()
    from deploytk.build.builder import build_engine
    from deploytk.build.options import build_options

    before = snapshot(ort_int8)
    with pytest.raises(DeploytkError, match=r"for ort .* build \(TensorRT\) does not run that graph.*quantize the fp32 export"):
        build_engine(ort_int8, build_options("1,8,8"))
    assert snapshot(ort_int8) == before


@pytest.mark.parametrize(
    "case, match",
    [
        ("no data", r"needs calibration data: pass exactly one of `data=IMAGES` .* and `synthetic=N`"),
        ("both", r"needs calibration data: pass exactly one of"),
        ("text files", r"holds no images"),
        ("corrupt image", r"image .*broken\.png could not be read"),
        ("already quantized", r"is already quantized \(int8 for ort, from "),
        ("bf16", r"is a bf16 graph; INT8 calibration starts from the fp32 graph"),
        ("runtime", r"`backend='tensorrt'` is not one of openvino, ort, trt"),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(digits, ort_int8, tmp_path, case, match):
    source, kwargs = digits / "tome", {"synthetic": 8}
    runtime = "ort"
    if case == "no data":
        kwargs = {}
    elif case == "both":
        kwargs = {"synthetic": 8, "data": digits / "digits" / "train"}
    elif case == "text files":
        (tmp_path / "imgs").mkdir()
        (tmp_path / "imgs" / "a.txt").write_text("not an image")
        kwargs = {"data": tmp_path / "imgs"}
    elif case == "corrupt image":
        (tmp_path / "imgs").mkdir()
        (tmp_path / "imgs" / "broken.png").write_bytes(b"\x89PNG not really")
        kwargs = {"data": tmp_path / "imgs"}
    elif case == "already quantized":
        source = ort_int8
    elif case == "bf16":
        source = tmp_path / "bf16"
        shutil.copytree(digits / "tome", source)
        manifest = json.loads((source / "manifest.json").read_text())
        manifest["config"]["export"]["precision"] = "bf16"
        write_manifest(source, manifest)  # sealed again: the edit is what is tested
    elif case == "runtime":
        runtime = "tensorrt"
    before = snapshot(source)
    out = tmp_path / "out"
    with pytest.raises(DeploytkError, match=match):
        run_quantize(source, runtime, output=out, **kwargs)
    assert not out.exists() and snapshot(source) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # no temporary left behind


@pytest.mark.slow
def test_openvino_with_the_similarity_quantized_fails_though_cosine_and_top1_pass(digits):
    """NNCF let loose on the matching ops' own similarity products: the logits still look fine (mean cosine and top-1
    pass the int8 defaults), and only the choice checks see that merges are decided on int8 values."""
    pytest.importorskip("nncf")
    out = digits / "tome-ov-broken"
    run_quantize(digits / "tome", "openvino", data=digits / "digits" / "train", num_samples=32, output=out, keep_choices_fp32=False)
    report = validate(out, "openvino", val_batches(digits, 64), Tolerances.for_precision("int8"))
    assert not report.passed
    assert report.checks["int8: no matching op or input of one is quantized"] is False
    assert report.checks["int8: every choice is the op's own on the runtime's inputs"] is False
    assert report.choices["unreproduced"] and all(u["op"] == "ToMeMatch" for u in report.choices["unreproduced"])


def test_cli_quantize_json_is_one_object_and_errors_exit_2(digits, tmp_path):
    from typer.testing import CliRunner

    from deploytk.cli import app

    runner = CliRunner()
    out = tmp_path / "cli-int8"
    result = runner.invoke(app, ["quantize", str(digits / "tome"), "--backend", "trt", "--synthetic", "8", "--output", str(out), "--json"])
    assert result.exit_code == 0, result.output
    manifest = json.loads(result.stdout)  # nothing else on stdout: the new artifact, {"directory": DIR, **manifest} as export's
    assert manifest == {"directory": str(out), **json.loads((out / "manifest.json").read_text())}
    assert manifest["quantization"]["runtime"] == "trt" and manifest["quantization"]["backend"] == "ort"
    assert manifest["quantization"]["calibration"] | {"sha256": None} == {
        "source": "synthetic",
        "images": 8,
        "seed": 1,
        "distribution": "standard normal",
        "sha256": None,
    }
    result = runner.invoke(app, ["quantize", str(digits / "tome"), "--backend", "trt", "--output", str(tmp_path / "none")])
    assert result.exit_code == 2 and "needs calibration data" in result.stderr
    assert not (tmp_path / "none").exists()


def test_openvino_refuses_a_graph_with_loops_naming_the_op(exported, tmp_path):
    """KMedoidsSelect's clustering rounds are an ONNX Loop, which NNCF's OpenVINO graph builder cannot take: refused
    with the op's name and the way out, nothing written."""
    pytest.importorskip("nncf")
    source = exported.copy("digits_vit_kmedoids_k70", tmp_path / "kmedoids")
    before = snapshot(source)
    with pytest.raises(DeploytkError, match=r"Loop ops \(KMedoidsSelect\).*`backend=ort`"):
        run_quantize(source, "openvino", synthetic=4, output=tmp_path / "out")
    assert not (tmp_path / "out").exists() and snapshot(source) == before
