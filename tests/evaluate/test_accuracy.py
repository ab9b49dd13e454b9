"""The harness against an independent computation, the shipped checkpoint's accuracy, and input checks."""

import json
import tempfile

import numpy as np
import pytest
import torch

from deploytk.errors import DeploytkError
from deploytk.evaluation.accuracy import _topk_correct, evaluate, scan_image_folder

from helpers.configs import DIGITS_DENSE as DENSE
from helpers.configs import DIGITS_TOME_R4 as TOME_R4


@pytest.fixture(scope="module")
def r4_artifacts(exported):
    return exported("digits_vit_tome_r4")


def test_scan_orders_classes_sorted_and_interleaves(digits_tree):
    root, _ = digits_tree
    folder = scan_image_folder(root / "val", num_samples=25)
    assert folder.classes == [str(d) for d in range(10)]
    assert [c for _, c in folder.samples] == [i % 10 for i in range(25)]
    assert all(p.parent.name == folder.classes[c] for p, c in folder.samples)
    assert scan_image_folder(root / "val").num_images == 450


def test_topk_is_counted_per_row():
    logits = np.array([[0.1, 0.9, 0.0], [0.8, 0.1, 0.3], [0.2, 0.3, 0.5]], np.float32)
    labels = np.array([1, 2, 0])
    top1, top2, preds = _topk_correct(logits, labels, 2)
    assert (top1, top2, preds.tolist()) == (1, 2, [1, 0, 2])
    assert _topk_correct(logits, labels, 3)[1] == 3


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_harness_matches_direct_forward(digits_tree, digits_cfg, r4_artifacts):
    from deploytk.adapters import adapt
    from deploytk.data import load_samples
    from deploytk.models import build_reference, create_vit

    root, _ = digits_tree
    cfg = digits_cfg(TOME_R4)
    report = evaluate(cfg, root / "val", artifacts=r4_artifacts, batch_size=7, num_samples=40, config_name=str(TOME_R4))

    # independent: the same 40 files, preprocessed once, one forward pass per model
    folder = scan_image_folder(root / "val", num_samples=40)
    files, labels = [f for f, _ in folder.samples], torch.tensor([c for _, c in folder.samples])
    dense = create_vit(cfg)
    x = torch.from_numpy(load_samples(files, adapt(dense).eval_transform(), adapt(dense).input_kind))
    assert x.shape == (40, 3, 32, 32)
    with torch.no_grad():
        dense_pred = dense(x).argmax(-1)
        ref_logits = build_reference(cfg)(x)
    from deploytk.backends.ort import ort_session

    ort_pred = ort_session(r4_artifacts / "model.onnx").run(None, {"input": x.numpy()})[0].argmax(-1)
    assert report["num_images"] == 40 and report["batch_size"] == 7 and report["topk"] == 5
    assert report["dense"]["top1"] == pytest.approx((dense_pred == labels).float().mean().item())
    assert report["reference"]["top1"] == pytest.approx((ref_logits.argmax(-1) == labels).float().mean().item())
    top5 = (ref_logits.topk(5, -1).indices == labels[:, None]).any(-1).float().mean().item()
    assert report["reference"]["top5"] == pytest.approx(top5)
    assert report["exported"]["top1"] == pytest.approx(float((ort_pred == labels.numpy()).mean()))
    assert report["agreement"] == pytest.approx(float((ort_pred == ref_logits.argmax(-1).numpy()).mean()))
    manifest = json.loads((r4_artifacts / "manifest.json").read_text())
    assert report["gflops"] == manifest["gflops"] < report["dense_gflops"] == manifest["dense_gflops"]
    assert report["tokens_per_layer"] == [65 - 4 * i for i in range(12)]
    json.dumps(report)  # JSON-serialisable as is


def test_temporary_export_is_removed(digits_tree, digits_cfg, monkeypatch, tmp_path):
    root, _ = digits_tree
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    report = evaluate(digits_cfg(TOME_R4), root / "val", batch_size=16, num_samples=16)
    assert report["artifacts"] is None and report["seconds"]["export"] > 0
    assert 0 <= report["exported"]["top1"] <= 1 and report["agreement"] >= 0.9
    assert list(tmp_path.iterdir()) == []


def test_shipped_checkpoint_reaches_95_percent(digits_tree, digits_cfg):
    """The dense config loads assets/digits_vit and classifies the whole val split (450 images)."""
    from deploytk.adapters import adapt
    from deploytk.data import load_samples
    from deploytk.models import create_vit

    root, _ = digits_tree
    vit = create_vit(digits_cfg(DENSE))
    assert next(vit.parameters()).dtype == torch.float32  # fp16 file, cast on load
    folder = scan_image_folder(root / "val")
    x = torch.from_numpy(load_samples([f for f, _ in folder.samples], adapt(vit).eval_transform(), adapt(vit).input_kind))
    labels = torch.tensor([c for _, c in folder.samples])
    with torch.no_grad():
        top1 = (vit(x).argmax(-1) == labels).float().mean().item()
    assert top1 >= 0.95, f"val top-1 {top1:.4f}"


def test_artifacts_from_another_config_are_refused(digits_tree, digits_cfg, r4_artifacts):
    root, _ = digits_tree
    with pytest.raises(DeploytkError, match=r"was not exported from dense.yaml: `merge.r` is 4 there but 0 in dense.yaml"):
        evaluate(digits_cfg(DENSE), root / "val", artifacts=r4_artifacts, num_samples=4, config_name="dense.yaml")
    random_init = digits_cfg(TOME_R4).model_copy(update={"checkpoint": None})
    with pytest.raises(DeploytkError, match="the weights differ"):
        evaluate(random_init, root / "val", artifacts=r4_artifacts, num_samples=4)
