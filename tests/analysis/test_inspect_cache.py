"""Issue 55, item 6: inspect answers again from disk (no torch imported), never with a stale answer, and takes several
schedules in one run with the unreduced model counted once."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import deploytk
from deploytk.analysis import inspect_cache
from deploytk.cli import app
from deploytk.errors import DeploytkError
from deploytk.files import CACHE_ENV

from helpers import ROOT

runner = CliRunner()
DIGITS = ROOT / "export_configs" / "digits_vit_tome_r4.yaml"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(folder))
    return folder / inspect_cache.SECTION


def inspected(*args: str) -> dict:
    result = runner.invoke(app, ["inspect", *map(str, args), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_second_answer_comes_from_disk_without_torch(cache, tmp_path):
    first = inspected(DIGITS, "--r", "2")
    assert len(list(cache.glob("*.json"))) == 1
    code = (
        "import json, sys; from deploytk.cli import app\n"
        f"try: app(['inspect', {str(DIGITS)!r}, '--r', '2', '--json'], prog_name='deploytk')\n"
        "except SystemExit: pass\n"
        "print(json.dumps(sorted(m for m in ('torch', 'timm', 'fvcore', 'onnx') if m in sys.modules)), file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env(cache.parent))
    assert json.loads(done.stdout) == first and json.loads(done.stderr.strip().splitlines()[-1]) == []


def _env(folder):
    import os

    return {**os.environ, CACHE_ENV: str(folder)}


def test_a_changed_config_or_override_is_a_new_answer(cache, tmp_path):
    config = tmp_path / "c.yaml"
    shutil.copy(DIGITS, config)
    before = inspected(config)
    config.write_text(config.read_text().replace("r: 4", "r: 2"))
    after = inspected(config)
    assert after["r"] == 2 and before["r"] == 4 and after["gflops"] > before["gflops"]
    assert inspected(config, "--r", "3")["r"] == 3
    assert len(list(cache.glob("*.json"))) == 3


def test_a_corrupt_entry_is_a_miss_and_is_rewritten(cache):
    first = inspected(DIGITS)
    (entry,) = cache.glob("*.json")
    entry.write_text("{not json")
    assert inspected(DIGITS) == first and json.loads(entry.read_text()) == first


def test_an_hf_models_architecture_is_part_of_the_key(tmp_path):
    folder = tmp_path / "vit"
    folder.mkdir()
    config = tmp_path / "c.yaml"
    config.write_text("model: hf:vit\nmerge: {method: tome, r: 2}\n")
    assert inspect_cache.key(config, {}) is None  # no config.json: not keyed
    (folder / "config.json").write_text('{"hidden_size": 32}')
    first = inspect_cache.key(config, {})
    (folder / "config.json").write_text('{"hidden_size": 64}')
    assert first is not None and inspect_cache.key(config, {}) not in (None, first)
    assert inspect_cache.key(config, {"checkpoint": "w.safetensors"}) == inspect_cache.key(config, {})  # weights do not count


def test_deploytks_own_code_is_part_of_the_key(tmp_path, monkeypatch):
    package = tmp_path / "deploytk"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(inspect_cache, "_PACKAGE", package)
    before = inspect_cache.key(DIGITS, {})
    (package / "a.py").write_text("x = 22\n")
    assert inspect_cache.key(DIGITS, {}) != before


def test_several_schedules_equal_one_at_a_time(cache):
    report = deploytk.inspect(DIGITS, schedules=[2, (4, -1.0)])
    assert [s["r"] for s in report["schedules"]] == [2, {"r": 4, "inflection": -1.0}]
    for got, r in zip(report["schedules"], [2, (4, -1.0)], strict=True):
        assert got == deploytk.inspect(DIGITS, r=r).to_dict()
    assert inspected(DIGITS, "--r", "2", "--r", "4:-1")["schedules"] == report["schedules"]
    table = runner.invoke(app, ["inspect", str(DIGITS), "--r", "2", "--r", "4:-1"]).output
    assert "r=2" in table and "r=4:-1" in table


@pytest.mark.parametrize(("given", "match"), [({"r": 2, "schedules": [4]}, "both given"), ({"schedules": []}, "names no schedule")])
def test_schedules_and_r_are_refused_together(cache, given, match):
    with pytest.raises(DeploytkError, match=match):
        deploytk.inspect(DIGITS, **given)


def test_a_tuple_r_and_a_list_r_are_two_answers(cache):
    """(4, 1) is r=4 with inflection 1, [4, 1] one r per block: plain JSON writes both as [4, 1] (found in review)."""
    by_inflection = deploytk.inspect(DIGITS, r=(4, 1.0))
    per_block = deploytk.inspect(DIGITS, r=[4, 1] + [0] * 10)
    assert by_inflection["requested_r"] != per_block["requested_r"] and per_block["requested_r"][:2] == [4, 1]
    assert inspect_cache.canonical({"r": (4, 1)}) != inspect_cache.canonical({"r": [4, 1]})


def test_a_folder_named_like_a_ready_made_config_is_not_that_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "digits_vit_tome_r4").mkdir()
    assert inspect_cache.key("digits_vit_tome_r4", {}) is None
