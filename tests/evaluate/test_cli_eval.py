"""`deploytk eval` through the CLI: one JSON object with --json, and bad input -> exit 2, nothing written."""

import json

import pytest
from PIL import Image
from typer.testing import CliRunner

from deploytk.cli import app

from helpers import ROOT
from helpers.configs import DIGITS_DENSE as DENSE
from helpers.configs import DIGITS_TOME_R4 as TOME_R4

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, ["eval", *[str(a) for a in args]])


def listing(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def eval_fails(tmp_path, *args, match):
    before = listing(tmp_path)
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert match in " ".join(result.output.split()), result.output
    assert listing(tmp_path) == before, "a failed eval must write nothing"
    return result.output


def image(path, size=32):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (size, size)).save(path)


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_json_is_one_object_with_the_keys(digits_tree, monkeypatch):
    root, _ = digits_tree
    monkeypatch.chdir(ROOT)  # the config's checkpoint path is relative to the repository root
    result = invoke(TOME_R4, "--data", root / "val", "--num-samples", 12, "--batch-size", 5, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["num_images"] == 12 and report["method"] == "tome" and report["r"] == 4
    for name in ("dense", "reference", "exported"):
        assert set(report[name]) == {"top1", "top5"}
    assert 0 < report["gflops"] < report["dense_gflops"]
    assert 0 <= report["agreement"] <= 1


def test_missing_data_dir(tmp_path):
    eval_fails(tmp_path, DENSE, "--data", tmp_path / "nope", match=f"data directory {tmp_path / 'nope'} does not exist")


def test_no_class_subfolders(tmp_path):
    image(tmp_path / "data" / "a.png")
    eval_fails(tmp_path, DENSE, "--data", tmp_path / "data", match="has 1 loose image(s) but no class subfolders (--data)")


def test_class_folders_without_images(tmp_path):
    (tmp_path / "data" / "cat").mkdir(parents=True)
    (tmp_path / "data" / "dog").mkdir()
    (tmp_path / "data" / "dog" / "notes.txt").write_text("x")
    eval_fails(tmp_path, DENSE, "--data", tmp_path / "data", match="has 2 class subfolder(s) but no images in them")


def test_class_count_mismatch(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    for c in ("a", "b", "c"):
        image(tmp_path / "data" / c / "0.png")
    eval_fails(
        tmp_path,
        DENSE,
        "--data",
        tmp_path / "data",
        match="has 3 class folder(s) (a, b, c) but model vit_tiny_patch16_224 has num_classes=10",
    )


def test_dataset_root_instead_of_split_gets_a_hint(tmp_path, digits_tree, monkeypatch):
    root, _ = digits_tree
    monkeypatch.chdir(ROOT)
    eval_fails(tmp_path, DENSE, "--data", root, match=f"pass its split, e.g. --data {root / 'val'}")


@pytest.mark.parametrize(
    "option,value,match",
    [("--num-samples", 0, "--num-samples 0: must be an int >= 1"), ("--batch-size", 0, "--batch-size 0: must be an int >= 1")],
)
def test_bad_numbers(tmp_path, digits_tree, option, value, match):
    root, _ = digits_tree
    eval_fails(tmp_path, DENSE, "--data", root / "val", option, value, match=match)


def test_artifacts_that_are_not_an_export(tmp_path, digits_tree, monkeypatch):
    root, _ = digits_tree
    monkeypatch.chdir(ROOT)
    (tmp_path / "art").mkdir()
    eval_fails(
        tmp_path,
        DENSE,
        "--data",
        root / "val",
        "--artifacts",
        tmp_path / "art",
        match="is not a deploytk artifact directory: model.onnx is missing",
    )


def test_missing_config(tmp_path, digits_tree):
    root, _ = digits_tree
    eval_fails(tmp_path, tmp_path / "none.yaml", "--data", root / "val", match="does not exist")


def test_an_export_folder_is_evaluated_as_its_config_with_artifacts(digits_tree, exported, tmp_path):
    """Issue 55, item 3: the artifact is positional on eval too; it evaluates its own graph against its reference,
    exactly as CONFIG --artifacts DIR does, and refuses what would change it."""
    root, _ = digits_tree
    art = exported("digits_vit_tome_r4")
    by_folder = invoke(art, "--data", root / "val", "--num-samples", 8, "--batch-size", 8, "--json")
    by_config = invoke(TOME_R4, "--data", root / "val", "--artifacts", art, "--num-samples", 8, "--batch-size", 8, "--json")
    assert by_folder.exit_code == by_config.exit_code == 0, by_folder.output
    first, second = json.loads(by_folder.stdout), json.loads(by_config.stdout)
    for key in ("num_images", "dense", "reference", "exported", "agreement", "gflops", "backend"):
        assert first[key] == second[key], key
    eval_fails(tmp_path, art, "--data", root / "val", "--r", "2", match="is an export, whose model, weights and schedule were fixed")
