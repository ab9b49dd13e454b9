"""Fixtures shared by the tests in this folder: the digits ImageFolder tree and the digits configs.

A plain module, not a conftest.py: a second ``conftest`` module would shadow
``tests/conftest.py`` for the tests that ``from conftest import ...``. Test modules import
the fixtures by name (each module writes its own tree, ~1 s).
"""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DENSE = ROOT / "export_configs" / "digits_vit_dense.yaml"
TOME_R4 = ROOT / "export_configs" / "digits_vit_tome_r4.yaml"


@pytest.fixture(scope="module")
def digits_tree(tmp_path_factory):
    from deploytk.evaluate.digits import write_digits_imagefolder

    root = tmp_path_factory.mktemp("digits") / "digits"
    counts = write_digits_imagefolder(root, img_size=32)
    return root, counts


@pytest.fixture(scope="module")
def digits_cfg():
    """The dense digits config with its checkpoint path made absolute (tests may run from anywhere)."""
    from deploytk.config import load_config

    def load(path=DENSE):
        cfg = load_config(path)
        return cfg.model_copy(update={"checkpoint": str(ROOT / cfg.checkpoint)})

    return load
