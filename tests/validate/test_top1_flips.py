"""Top-1 flips are reported with the reference's logit margin, and judged against the logit tolerances."""

import numpy as np

from deploytk.validate.validator import Tolerances, compare_outputs, near_tied_logits

from helpers import DIGITS_INPUT


def test_top1_flips_carry_both_classes_and_the_reference_margin():
    ref = np.array([[1.0, 0.9, -2.0], [0.0, 3.0, 1.0], [5.0, 0.0, 0.0]], np.float32)
    out = np.array([[0.9, 1.0, -2.0], [0.0, 3.0, 1.0], [0.0, 5.0, 0.0]], np.float32)
    metrics = compare_outputs([ref], [out])
    assert metrics["top1_agreement"] == 1 / 3
    flips = metrics["top1_flips"]
    assert [(f["image"], f["reference_top1"], f["backend_top1"]) for f in flips] == [(0, 0, 1), (2, 0, 1)]
    assert np.allclose([f["reference_margin"] for f in flips], [0.1, 5.0]) and np.allclose(flips[0]["reference_logits"], [1.0, 0.9])
    assert compare_outputs([ref], [ref])["top1_flips"] == []


def test_near_tied_logits_uses_the_larger_of_atol_and_rtol_per_class():
    tol = Tolerances(atol=0.05, rtol=0.01)
    close = {"reference_logits": [1.0, 0.92], "reference_margin": 0.08}  # 0.05 + 0.05 allowed
    far = {"reference_logits": [1.0, 0.8], "reference_margin": 0.2}
    big = {"reference_logits": [20.0, 19.7], "reference_margin": 0.3}  # rtol: 0.2 + 0.197 allowed
    assert near_tied_logits(close, tol) and not near_tied_logits(far, tol) and near_tied_logits(big, tol)


def test_a_flip_within_tolerance_is_reported_but_not_counted():
    from deploytk.validate.validator import judge_top1_flips

    tol = Tolerances(atol=0.1, rtol=0.0)
    ref = np.array([[1.0, 0.95, -2.0], [0.0, 3.0, 1.0], [2.0, 0.0, 0.0]], np.float32)
    out = ref.copy()
    out[0, :2] = [0.96, 0.99]  # both logits moved 0.04 <= atol and the margin 0.05 <= 2 atol: noise within tolerance
    out[2, :2] = [0.0, 2.0]  # a real swap: both moved by 2.0
    metrics = compare_outputs([ref], [out])
    judge_top1_flips(metrics, [ref], [out], tol)
    assert [f["within_tolerance"] for f in metrics["top1_flips"]] == [True, False]
    assert metrics["top1_agreement"] == 1 / 3 and metrics["top1_flips_within_tolerance"] == 1
    assert metrics["top1_agreement_counted"] == 2 / 3


def test_a_near_tie_margin_with_one_logit_outside_tolerance_counts():
    from deploytk.validate.validator import judge_top1_flips

    ref = np.array([[1.0, 0.95, -2.0]], np.float32)
    out = np.array([[0.96, 0.99, -1.0]], np.float32)  # the flip is a near-tie, but logit 2 moved by 1.0
    metrics = compare_outputs([ref], [out])
    judge_top1_flips(metrics, [ref], [out], Tolerances(atol=0.1, rtol=0.0))
    assert metrics["top1_flips"][0]["within_tolerance"] is False and metrics["top1_agreement_counted"] == 0.0


def test_embedding_outputs_have_no_top1():
    ref = np.array([[1.0, 0.9], [0.0, 3.0]], np.float32)
    metrics = compare_outputs([ref], [ref[:, ::-1]], classes=False)
    assert metrics["top1_agreement"] is None and metrics["top1_flips"] == []
    assert metrics["cosine_similarity_min"] < 0.5  # the embeddings themselves are still compared


class _Shifted:
    """A backend wrapper that moves two logits of one image: the reference's top class down, the runner-up up."""

    def __init__(self, inner, image: int, shift: float):
        self.inner, self.image, self.shift = inner, image, shift
        self.name, self.runs_onnx, self.validates = "shifted-ort", inner.runs_onnx, True

    def graph(self, artifact):
        return self.inner.graph(artifact)

    def load(self, artifact, batch_sizes, graph=None, progress=None):
        loaded, image, shift = self.inner.load(artifact, batch_sizes, graph), self.image, self.shift
        run = loaded.run

        def shifted(batch):
            out = run(batch)
            if image < len(batch):  # the first batch holds the image
                logits = out["logits"].copy()
                top, second = np.argsort(logits[image])[::-1][:2]
                logits[image, top] -= shift
                logits[image, second] += shift
                out["logits"] = logits
            return out

        loaded.run = shifted
        return loaded


def _digit_margin(directory, image: int) -> float:
    import torch

    from deploytk.data import synthetic_batches
    from deploytk.exporter.artifacts import Artifact
    from deploytk.models import build_reference

    with torch.no_grad():
        logits = build_reference(Artifact.open(directory).config)(torch.from_numpy(synthetic_batches(8, 8, DIGITS_INPUT)[0])).numpy()
    top2 = np.sort(logits[image])[::-1][:2]
    return float(top2[0] - top2[1])


def test_validate_passes_a_tolerated_flip_and_fails_a_real_one(exported):
    from deploytk.backends import get_backend
    from deploytk.data import synthetic_batches
    from deploytk.validate.validator import TOP1_CHECK, validate

    art = exported("digits_vit_tome_r4")
    margin = _digit_margin(art, 0)
    batches = synthetic_batches(8, 8, DIGITS_INPUT)
    # atol = the margin: moving both logits by 0.6 margin flips the image, each logit within tolerance
    tol = Tolerances(atol=margin, rtol=0.0, min_cosine=0.9)
    near = validate(art, _Shifted(get_backend("ort"), 0, 0.6 * margin), batches, tol)
    assert near.top1_agreement == 7 / 8 and near.top1_flips_within_tolerance == 1
    assert near.top1_agreement_counted == 1.0 and near.checks[TOP1_CHECK] and near.passed, near.to_dict()
    # the same image moved by 3 margins: the logits leave the tolerance, the flip counts and validate fails
    real = validate(art, _Shifted(get_backend("ort"), 0, 3 * margin), batches, tol)
    assert real.top1_flips and not real.top1_flips[0]["within_tolerance"]
    assert real.top1_agreement_counted == 7 / 8 and not real.checks[TOP1_CHECK] and not real.passed
