"""The digits configs for the tests of `deploytk eval` and the digits data (the digits tree, `digits_tree`, is in
tests/conftest.py: tests/test_cli_api_parity.py evaluates on it too)."""

import pytest

from helpers import ROOT
from helpers.configs import DIGITS_DENSE


@pytest.fixture(scope="module")
def digits_cfg():
    """The dense digits config with its checkpoint path made absolute (tests may run from anywhere)."""
    from deploytk.config import load_config

    def load(path=DIGITS_DENSE):
        cfg = load_config(path)
        return cfg.model_copy(update={"checkpoint": str(ROOT / cfg.checkpoint)})

    return load
