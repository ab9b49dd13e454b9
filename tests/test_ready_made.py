"""Issue 55, item 5: the ready-made configs resolve by name from any folder, are listed by `deploytk configs`, and ship
in the wheel with the digits models their checkpoints name (the wheel itself runs in scripts/extras_smoke.sh)."""

from __future__ import annotations

import fnmatch
import sys
from pathlib import Path

import pytest
import tomllib
import yaml
from typer.testing import CliRunner

import deploytk
from deploytk import ready_made
from deploytk.cli import app
from deploytk.config import DEFAULT_CONFIG, load_config
from deploytk.errors import DeploytkError

from helpers import ROOT

runner = CliRunner()


def test_the_listing_is_every_file_with_what_its_first_line_says():
    files = sorted((ROOT / "export_configs").glob("*.yaml"))
    report = deploytk.configs()
    assert report.names() == [f.stem for f in files] and len(files) > 100
    for entry, path in zip(report, files, strict=True):
        data = yaml.safe_load(path.read_text())
        assert entry["path"] == str(path) and entry["model"] == data["model"]
        assert entry["method"] == (data.get("merge") or {}).get("method", "tome")
        assert entry["description"] and path.read_text().startswith("# " + entry["description"][:20])


def test_contains_filters_by_name_model_or_method_in_any_case():
    assert deploytk.configs("PITOME").names() == [n for n in ready_made.names() if "pitome" in n]
    models = {p.stem: yaml.safe_load(p.read_text())["model"] for p in (ROOT / "export_configs").glob("*.yaml")}
    by_model = deploytk.configs("deit_base_patch16").names()
    assert by_model == sorted(n for n, m in models.items() if "deit_base_patch16" in m) and "deit_base_tome_r8" in by_model
    assert deploytk.configs("no such thing").names() == []


def test_no_ready_made_name_is_a_timm_model_name():
    """The API reads a bare string as a ready-made config's name before a timm name: the two sets must not meet."""
    import timm

    assert not set(ready_made.names()) & set(timm.list_models())


def test_a_name_loads_the_shipped_file_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    by_name = load_config("digits_vit_tome_r4")
    assert by_name == load_config(ROOT / "export_configs" / "digits_vit_tome_r4.yaml")
    assert Path(by_name.checkpoint) == ROOT / "assets" / "digits_vit" / "digits_vit.safetensors"  # relative to the file
    assert load_config(ready_made.DEFAULT_NAME) == load_config(DEFAULT_CONFIG)


def test_a_file_of_the_users_wins_over_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("deit_small_tome_r16").write_text("model: deit_tiny_patch16_224\nmerge: {method: tome, r: 2}\n")
    assert load_config("deit_small_tome_r16").model == "deit_tiny_patch16_224"
    assert deploytk.inspect("deit_small_tome_r16")["model"] == "deit_tiny_patch16_224"


@pytest.mark.parametrize("given", ["no_such_config", "sub/deit_small_tome_r16", "deit_small_tome_r16.yml"])
def test_what_is_not_a_name_says_how_to_find_one(tmp_path, monkeypatch, given):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DeploytkError, match=r"does not exist.*`deploytk configs` lists them"):
        load_config(given)
    result = runner.invoke(app, ["export", given, "--output", "x"])
    assert result.exit_code == 2 and "deploytk configs" in result.output and not Path("x").exists()


def test_the_api_takes_a_name_where_it_takes_a_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = deploytk.inspect("digits_vit_tome_r4")
    assert report.to_dict() == deploytk.inspect(ROOT / "export_configs" / "digits_vit_tome_r4.yaml").to_dict()


def test_the_cli_takes_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["inspect", "digits_vit_tome_r4", "--json"])
    assert result.exit_code == 0, result.output
    assert '"method": "tome"' in result.output


def test_the_wheel_holds_every_config_and_each_checkpoint_it_names():
    """pyproject's package-data puts export_configs/ and assets/ side by side in the package (setup.py maps them), so a
    config's `checkpoint: ../assets/...` resolves in an installed wheel as in the source tree."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data = project["tool"]["setuptools"]["package-data"]
    assert data["deploytk.export_configs"] == ["*.yaml"]
    for path in (ROOT / "export_configs").glob("*.yaml"):
        checkpoint = yaml.safe_load(path.read_text()).get("checkpoint")
        if checkpoint is None:
            continue
        target = (path.parent / checkpoint).resolve()
        inside = target.relative_to(ROOT / "assets").as_posix()  # raises for a checkpoint outside assets/
        assert target.is_file() and any(fnmatch.fnmatch(inside, pattern) for pattern in data["deploytk.assets"]), path


def test_the_folder_is_the_wheels_where_it_has_one(tmp_path, monkeypatch):
    """In a wheel, deploytk/export_configs/ is inside the package; the source tree's is beside it."""
    assert ready_made.FOLDER == ROOT / "export_configs"
    package = tmp_path / "deploytk"
    (package / "export_configs").mkdir(parents=True)
    (package / "export_configs" / "x.yaml").write_text("# X.\nmodel: deit_tiny_patch16_224\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    code = (ROOT / "deploytk" / "ready_made.py").read_text()
    namespace: dict = {"__file__": str(package / "ready_made.py"), "__name__": "ready_made_copy"}
    exec(compile(code, "ready_made_copy", "exec"), namespace)  # noqa: S102 (the module, as if installed at tmp_path)
    assert namespace["FOLDER"] == package / "export_configs" and namespace["names"]() == ["x"]
