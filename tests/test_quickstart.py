"""The README's quickstart, first command verbatim: `make demo` in a fresh clone of this repository (issue 43).

The clone's `.venv` is this suite's own venv (a link), and the clone's install inputs (pyproject.toml, setup.py, the
Makefile) are dated before the venv's install stamp, so make finds the venv up to date and runs the demo's commands
as written: doctor, inspect, export, validate, profile. The venv's deploytk is the editable install of this checkout
(the same commit in CI's clean checkout). `make test`, the quickstart's second command, is this suite itself.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.docs import fenced_blocks, prose_pages

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(sys.prefix)
STAMP = VENV / "bin" / ".installed"  # what `make install` touches (Makefile)


def quickstart() -> list[str]:
    """The commands of the README's quickstart block, comments dropped."""
    readme = prose_pages()["README.md"]
    section = readme.split("## Quickstart", 1)[1]
    block = fenced_blocks(section, "README.md")[0]
    return [line.split("#", 1)[0].strip() for line in block.body.splitlines() if line.split("#", 1)[0].strip()]


def test_the_quickstart_is_make_demo_then_make_test():
    assert quickstart() == ["make demo", "make test"]


@pytest.mark.slow
@pytest.mark.skipif(not STAMP.exists(), reason=f"this venv was not made by `make install` (no {STAMP})")
@pytest.mark.skipif(shutil.which("git") is None or shutil.which("make") is None, reason="needs git and make")
@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="this checkout is not a git repository, so it cannot be cloned")
def test_make_demo_runs_verbatim_in_a_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    (clone / ".venv").symlink_to(VENV, target_is_directory=True)
    before = STAMP.stat().st_mtime - 60
    for name in ("pyproject.toml", "setup.py", "Makefile"):
        os.utime(clone / name, (before, before))
    stamp_before = STAMP.stat().st_mtime
    command = quickstart()[0]
    done = subprocess.run(command.split(), cwd=clone, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert STAMP.stat().st_mtime == stamp_before, "make reinstalled into the suite's venv"
    artifact = clone / "artifacts" / "deit_small_tome_r16"
    assert (artifact / "model.onnx").is_file() and (artifact / "manifest.json").is_file()
    assert re.search(r"^PASS$", done.stdout, re.M), done.stdout[-3000:]  # validate's verdict line
