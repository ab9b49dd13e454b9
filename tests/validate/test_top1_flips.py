"""Top-1 flips are reported with the reference's logit margin, and judged against the logit tolerances."""

import numpy as np

from deploytk.validate.validator import Tolerances, compare_outputs, near_tied_logits


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
