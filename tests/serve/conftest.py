"""The serving tests' server: a real `tritonserver` (serving/tritonserver.py) on a repository `deploytk package` wrote.

Without the serving environment (.venv-serve, `make serve-env`) the tests skip, saying so; under `make test` (CI)
DEPLOYTK_REQUIRE_SERVER=1 turns that skip into a failure, so CI never passes without having served."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from serving.tritonserver import ServeEnvironment, ServerError

from helpers.serving import SERVED, SERVED_EXPORTS, SERVED_TINY, package


@pytest.fixture(scope="session")
def serve_environment() -> ServeEnvironment:
    try:
        return ServeEnvironment.find()
    except ServerError as e:
        if os.environ.get("DEPLOYTK_REQUIRE_SERVER"):
            pytest.fail(f"the serving tests must run here (DEPLOYTK_REQUIRE_SERVER is set): {e}")
        pytest.skip(f"no serving environment: {e}")


@pytest.fixture(scope="session")
def exports(exported) -> dict[str, Path]:
    """The digits ToMe r=4 export (trained weights), DeiT-S ToMe r=16 (random weights), and a tiny VideoMAE and a tiny
    AST classifier with ToMe r=4 (seeded random weights, a 4-frame 32x32 clip and a 100 x 48 spectrogram), the shared ones."""
    return {key: exported(stem) for key, stem in SERVED_EXPORTS.items()} | {key: exported.tiny(name) for key, name in SERVED_TINY.items()}


@pytest.fixture(scope="session")
def repository(exports, tmp_path_factory) -> Path:
    """What `deploytk package` wrote for the served models (SERVED), unchanged."""
    repo = tmp_path_factory.mktemp("serve-repo")
    for name, (export, options) in SERVED.items():
        package(exports[export], repo, name, *options)
    return repo


@pytest.fixture
def fresh_copy(tmp_path):
    """A copy of a repository folder that a test may damage or serve alone."""

    def copy(source: Path, *names: str) -> Path:
        target = tmp_path / "repo"
        target.mkdir()
        for name in names:
            shutil.copytree(source / name, target / name)
        return target

    return copy
