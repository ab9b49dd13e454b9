"""The digits ImageFolder tree and the digits configs, for the tests of `deploytk eval` and the digits data."""

import pytest

from helpers import ROOT
from helpers.configs import DIGITS_DENSE


@pytest.fixture(scope="module")
def digits_tree(tmp_path_factory):
    """The bundled digits written as an ImageFolder tree (each module writes its own, ~1 s)."""
    from deploytk.evaluation.digits import write_digits_imagefolder

    root = tmp_path_factory.mktemp("digits") / "digits"
    counts = write_digits_imagefolder(root, img_size=32)
    return root, counts


@pytest.fixture(scope="module")
def digits_cfg():
    """The dense digits config with its checkpoint path made absolute (tests may run from anywhere)."""
    from deploytk.config import load_config

    def load(path=DIGITS_DENSE):
        cfg = load_config(path)
        return cfg.model_copy(update={"checkpoint": str(ROOT / cfg.checkpoint)})

    return load
