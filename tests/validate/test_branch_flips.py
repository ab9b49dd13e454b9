"""The validator's near-tie diagnosis: a proven flip passes, a wrong choice does not.

Uses the trained digits ViT (small, fast) with MCTF r=4.
"""

import json

import numpy as np
import onnx
import pytest

from deploytk.exporter.artifacts import write_manifest
from deploytk.exporter.manifest import sha256_file
from deploytk.exporter.probes import with_matching_outputs
from deploytk.validate.branches import _run_reference
from deploytk.validate.validator import FLIPS_CHECK, Tolerances, failing_images, validate

from helpers import DIGITS_INPUT


@pytest.fixture(scope="module")
def digits_mctf(exported):
    return exported("digits_vit_mctf_r4")


def _digit_batches(n=32, batch=8):
    from deploytk.data import synthetic_batches

    return synthetic_batches(n, batch, DIGITS_INPUT)


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_probed_model_exposes_every_matching_node(digits_mctf):
    model, probes = with_matching_outputs(digits_mctf / "model.onnx")
    assert [p.op for p in probes] == ["MctfMatch"] * 11  # blocks 1..11
    outputs = {o.name for o in model.graph.output}
    assert all(p.dest in outputs and set(p.inputs) <= outputs for p in probes)


def test_a_matching_op_with_a_constant_input_is_probed_too():
    """In an ATS export, ATSSample's ``steps`` is an initializer, not a node output (``reduction.steps_3``): a presence
    check that missed initializers left ATS configs without their near-tie diagnosis."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("ATSSample", ["scores", "reduction.steps_3"], ["dest"], domain="deploytk")],
        "g",
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["B", 65])],
        [helper.make_tensor_value_info("dest", TensorProto.INT64, ["B", 65])],
        initializer=[helper.make_tensor("reduction.steps_3", TensorProto.FLOAT, [4], [0.1, 0.4, 0.6, 0.9])],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("deploytk", 1)]
    model, probes = with_matching_outputs(helper.make_model(graph, opset_imports=opsets))
    assert [(p.op, p.inputs, p.dest) for p in probes] == [("ATSSample", ["scores", "reduction.steps_3"], "dest")]
    assert {o.name for o in model.graph.output} == {"scores", "reduction.steps_3", "dest"}


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_reference_replayed_with_its_own_choices_is_unchanged(digits_mctf):
    from deploytk.config import config_from_dict
    from deploytk.models import build_reference

    manifest = json.loads((digits_mctf / "manifest.json").read_text())
    reference = build_reference(config_from_dict(manifest["config"]))
    batch = _digit_batches(8, 8)[0]
    logits, calls = _run_reference(reference, batch)
    replayed, _ = _run_reference(reference, batch, [dest.numpy() for _, _, dest in calls])
    np.testing.assert_array_equal(logits, replayed)
    assert len(calls) == 11 and reference.dest_hook is None


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_clean_export_passes_and_flips_carry_evidence(digits_mctf):
    report = validate(digits_mctf, "ort", _digit_batches(), Tolerances())
    assert report.passed, report.to_dict()
    for flip in report.branch_flips:
        assert flip["explained"] and flip["input_rel_diff"] <= 1e-4 and flip["replay_max_abs_diff"] <= 1e-4


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_a_backend_that_matches_differently_fails_with_unexplained_flips(digits_mctf, tmp_path):
    """Tamper with MctfMatch's tau_sim in the ONNX file: choices change for real, not at ties."""
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(digits_mctf, bad)
    model = onnx.load(str(bad / "model.onnx"))
    for node in model.graph.node:
        if node.op_type == "MctfMatch":
            for a in node.attribute:
                if a.name == "tau_sim":
                    a.f = 0.02
    onnx.save(model, str(bad / "model.onnx"))
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["onnx"]["sha256"] = sha256_file(bad / "model.onnx")
    write_manifest(bad, manifest)  # sealed again: the edit is what is tested

    report = validate(bad, "ort", _digit_batches(), Tolerances())
    assert not report.passed
    assert report.branch_flips and not any(f["explained"] for f in report.branch_flips)
    assert not report.checks[FLIPS_CHECK]
    assert all(f["op"] == "MctfMatch" and not f["op_reproduces_backend"] for f in report.branch_flips)


def test_failing_images_uses_polygraphys_rule():
    ref = [np.array([[1.0, 2.0], [10.0, 0.0]], np.float32)]
    out = [np.array([[1.0, 2.0005], [10.0005, 0.0]], np.float32)]  # row 1: abs 5e-4 but rel 5e-5
    assert failing_images(ref, out, Tolerances(atol=1e-4, rtol=1e-4)) == [0]


def test_distance_inputs_are_compared_squared():
    """A self-distance is sqrt(rounding) in torch.cdist's arithmetic: 1e-6 of rounding in the squares is a
    3e-3 difference after the sqrt, which must not count as a different input; a real change still does."""
    from deploytk.ops.spec import distances, floats
    from deploytk.validate.branches import _input_rel_diff

    sq = np.array([[1e-6, 4.0], [4.0, 2e-6]])  # the squares two runtimes computed, equal to rounding
    ref, out = np.sqrt(sq), np.sqrt(sq + np.array([[1e-6, 0.0], [0.0, -1e-6]]))
    assert _input_rel_diff(ref, out, floats("B M M")) > 1e-4  # as plain values: 2.9e-4 of the max
    assert _input_rel_diff(ref, out, distances("B M M")) <= 1e-6  # as squares: rounding
    assert _input_rel_diff(ref, ref * 1.01, distances("B M M")) > 1e-2  # a real change is still one


def test_a_graph_without_matching_nodes_has_nothing_to_probe():
    """A pruning method's graph (or a dense one) has no matching op: no probed copy, no probes."""
    from onnx import TensorProto, helper

    from deploytk.exporter.probes import with_matching_outputs

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    assert with_matching_outputs(helper.make_model(graph)) == (None, [])
