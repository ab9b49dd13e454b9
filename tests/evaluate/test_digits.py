"""The digits ImageFolder writer: split sizes, class counts, image format, determinism, atomicity."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from deploytk.errors import DeploytkError
from deploytk.evaluation.digits import MARKER, digits_split, write_digits_imagefolder


def files_of(root):
    return sorted(p.relative_to(root) for p in root.rglob("*.png"))


def test_split_sizes_and_class_counts(digits_tree):
    root, counts = digits_tree
    assert counts["num_train"] == 1347 and counts["num_val"] == 450
    _, labels, train, val = digits_split()
    assert not set(train) & set(val) and len(train) + len(val) == len(labels) == 1797
    for split, idx in (("train", train), ("val", val)):
        expected = np.bincount(labels[idx], minlength=10)
        assert [counts[split][str(d)] for d in range(10)] == expected.tolist()
        on_disk = [len(list((root / split / str(d)).glob("*.png"))) for d in range(10)]
        assert on_disk == expected.tolist()
    # stratified: every class has (about) a quarter of its images in val
    total = np.bincount(labels, minlength=10)
    assert np.all(np.abs(np.bincount(labels[val], minlength=10) - total * 0.25) <= 1)
    assert (root / MARKER).is_file()


def test_images_are_rgb_upsampled_and_scaled(digits_tree):
    root, _ = digits_tree
    images, labels, _, val = digits_split()
    i = int(val[0])
    path = root / "val" / str(labels[i]) / f"{i:04d}.png"
    with Image.open(path) as img:
        assert img.mode == "RGB" and img.size == (32, 32)
        arr = np.asarray(img)
    assert arr.max() > 200 and arr.min() == 0
    assert np.array_equal(arr[..., 0], arr[..., 2])
    # the 8x8 original (0..16 -> 0..255) is what a 4x4-block average of the upsampled image approximates
    blocks = arr[..., 0].astype(float).reshape(8, 4, 8, 4).mean(axis=(1, 3))
    assert np.corrcoef(blocks.ravel(), images[i].ravel())[0, 1] > 0.95


def test_deterministic_and_replaces_its_own_tree_keeping_other_files_only_with_force(tmp_path, digits_tree):
    root, _ = digits_tree
    again = tmp_path / "again"
    write_digits_imagefolder(again, img_size=32)
    assert files_of(again) == files_of(root)
    for rel in files_of(root)[::50]:
        assert (again / rel).read_bytes() == (root / rel).read_bytes()
    write_digits_imagefolder(again, img_size=16)  # an earlier digits tree is replaced as a whole
    with Image.open(next((again / "val" / "0").glob("*.png"))) as img:
        assert img.size == (16, 16)
    (again / "train" / "0" / "extra.png").write_bytes(b"mine")
    with pytest.raises(DeploytkError, match=r"is an earlier digits tree but also holds files deploytk did not write \(train/0/extra.png\)"):
        write_digits_imagefolder(again, img_size=32)
    write_digits_imagefolder(again, img_size=32, force=True)
    assert (again / "train" / "0" / "extra.png").read_bytes() == b"mine"  # kept, not deleted
    assert sorted(files_of(again)) == sorted([*files_of(root), Path("train/0/extra.png")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again"], "no temp dirs left behind"


def test_refuses_to_overwrite_a_foreign_directory(tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "keep.txt").write_text("x")
    for force in (False, True):
        with pytest.raises(DeploytkError, match=r"is a folder holding files deploytk did not write \(keep.txt\); it is not a digits tree"):
            write_digits_imagefolder(target, force=force)
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
