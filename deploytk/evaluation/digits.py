"""scikit-learn's 8x8 digits as an ImageFolder tree: ``root/{train,val}/<digit>/<index>.png``.

The split is fixed (stratified, 25 % val, ``random_state=0``), so every call writes the same
files: 1347 train and 450 val images, RGB PNGs upsampled from 8x8 to ``img_size`` (PIL
bicubic) after scaling the 0..16 intensities to 0..255. File names are the index in
``load_digits()``. The tree is written to a temporary sibling directory and renamed into
place; ``root/DIGITS.json`` records what was written, and marks the folder as one a later call
may replace (deploytk.files: other files there are refused, or kept with ``force``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from deploytk.errors import DeploytkError
from deploytk.files import DirectoryKind, claim_directory

SPLIT_SEED = 0
VAL_FRACTION = 0.25
MARKER = "DIGITS.json"


def digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(images [N, 8, 8] in 0..16, labels [N], train indices, val indices): the fixed split."""
    digits = load_digits()
    index = np.arange(len(digits.target))
    train, val = train_test_split(index, test_size=VAL_FRACTION, random_state=SPLIT_SEED, stratify=digits.target)
    return digits.images, digits.target, np.sort(train), np.sort(val)


def digit_to_image(pixels: np.ndarray, img_size: int):
    """One 8x8 digit (0..16) as an RGB PIL image of img_size x img_size (bicubic upsampling)."""
    gray = np.clip(np.rint(pixels * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    img = Image.fromarray(gray)  # uint8 2-D: mode "L"
    if img_size != gray.shape[0]:
        img = img.resize((img_size, img_size), Image.Resampling.BICUBIC)
    return img.convert("RGB")


def _image_path(split: str, label: int, index: int) -> str:
    return f"{split}/{label}/{index:04d}.png"


def _digits_files(root: Path) -> set[str] | None:
    """The files a digits tree holds, if ``root`` is one (its DIGITS.json)."""
    if not (root / MARKER).is_file():
        return None
    _, labels, train, val = digits_split()
    return {MARKER} | {_image_path(split, int(labels[i]), int(i)) for split, indices in (("train", train), ("val", val)) for i in indices}


DIGITS_TREE = DirectoryKind("digits tree", MARKER, _digits_files)


def write_digits_imagefolder(root: Path, img_size: int = 32, force: bool = False) -> dict:
    """Write the digits ImageFolder tree at ``root`` (atomically) and return the counts.

    Returns ``{"root", "img_size", "train": {digit: count}, "val": {digit: count},
    "num_train", "num_val"}``. An existing ``root`` is replaced only if it is empty or was
    written by this function (other files in it: refused, or kept with ``force``); anything else
    is an error and nothing is overwritten.
    """
    root = Path(root)
    if not isinstance(img_size, int) or img_size < 8:
        raise DeploytkError(f"img_size = {img_size!r}: must be an int >= 8 (the digits are 8x8).")
    with claim_directory(root, DIGITS_TREE, option="digits root", force=force) as target:
        images, labels, train, val = digits_split()
        counts: dict[str, dict[str, int]] = {}
        with target.write() as tmp:
            for split, indices in (("train", train), ("val", val)):
                counts[split] = {str(d): 0 for d in range(10)}
                for d in range(10):
                    (tmp / split / str(d)).mkdir(parents=True)
                for i in indices:
                    label = str(int(labels[i]))
                    digit_to_image(images[i], img_size).save(tmp / _image_path(split, int(label), int(i)))
                    counts[split][label] += 1
            info = {
                "source": "sklearn.datasets.load_digits",
                "img_size": img_size,
                "split": {"test_size": VAL_FRACTION, "random_state": SPLIT_SEED, "stratify": "label"},
                "train": counts["train"],
                "val": counts["val"],
                "num_train": int(len(train)),
                "num_val": int(len(val)),
            }
            (tmp / MARKER).write_text(json.dumps(info, indent=2) + "\n")
        return {"root": str(root), **info}
