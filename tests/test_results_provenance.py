"""Every published result says which command wrote it, and that command exists: no result file is made by hand.

A JSON under benchmarks/results/ carries ``command``: a script of this repository (``python benchmarks/x.py ...``,
``python scripts/y.py ...``) or a deploytk command (``deploytk tune ...``). Results written since the output rule also
carry deploytk's ``written_by`` mark, which lets a rerun of the same command replace them.
"""

import json
import shlex
from pathlib import Path

import pytest
import typer.main

from deploytk.cli import app

ROOT = Path(__file__).resolve().parents[1]
RESULTS = sorted((ROOT / "benchmarks" / "results").glob("*.json"))


@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_a_result_names_an_existing_command(path):
    data = json.loads(path.read_text())
    assert isinstance(data, dict) and data.get("command"), f"{path.name} does not say which command wrote it"
    words = shlex.split(data["command"])
    if words[0] == "deploytk":
        assert words[1] in typer.main.get_group(app).commands, f"{path.name}: `deploytk {words[1]}` is not a command"
    else:
        script = next((w for w in words if w.endswith(".py")), None)
        assert script and (ROOT / script).is_file(), f"{path.name}: {data['command']!r} names no script of this repository"


def test_the_results_folder_has_results():
    assert len(RESULTS) >= 4
