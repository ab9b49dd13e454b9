"""Issue 55, item 3: one vocabulary for the CLI and the API (deploytk/vocabulary.py). Every command's parameters and
every API function's are names of the table; the renamed ones are gone from both and from every --help, yet their old
spellings still work for one release, with a note that says the new name."""

from __future__ import annotations

import inspect
import json

import click
import pytest
import typer
from typer.testing import CliRunner

import deploytk
import deploytk.api
from deploytk.api.artifact import Artifact, Runner
from deploytk.cli import app, renamed_args
from deploytk.errors import DeploytkError, DeploytkNotice
from deploytk.vocabulary import RENAMED, RENAMED_VALUES, TERMS, flag

runner = CliRunner()


def commands() -> dict[str, click.Command]:
    """Every command by its path (``plugins compile`` included)."""
    found = {}

    def walk(group: click.Group, prefix: str) -> None:
        for name, command in group.commands.items():
            if isinstance(command, click.Group):
                walk(command, f"{prefix}{name} ")
            else:
                found[prefix + name] = command

    walk(typer.main.get_command(app), "")
    return found


def api_callables() -> dict[str, object]:
    found = {name: getattr(deploytk.api, name) for name in deploytk.api.__all__ if inspect.isfunction(getattr(deploytk.api, name))}
    for cls in (Artifact, Runner):
        for name, member in vars(cls).items():
            if inspect.isfunction(member) and not name.startswith("_"):
                found[f"{cls.__name__}.{name}"] = member
    return found


def test_every_command_parameter_is_a_word_of_the_vocabulary():
    outside = {f"{path}: {p.name}" for path, command in commands().items() for p in command.params if p.name not in TERMS}
    assert not outside, sorted(outside)


def test_every_api_parameter_is_a_word_of_the_vocabulary():
    outside = set()
    for name, fn in api_callables().items():
        for p in inspect.signature(fn).parameters.values():
            if p.name not in {*TERMS, "self"}:
                outside.add(f"{name}: {p.name}")
    assert not outside, sorted(outside)


def test_no_renamed_name_is_left_and_no_help_shows_one():
    cmds = commands()
    for command, renamed in RENAMED.items():
        names = {p.name for p in cmds[command].params}
        assert not set(renamed) & names and set(renamed.values()) <= names, command
        shown = runner.invoke(app, [command, "--help"], terminal_width=200).output
        for old in renamed:
            assert f"{flag(old)} " not in shown, (command, old)
    api = {"validate": Artifact.validate, "calibrate": deploytk.calibrate, "quantize": Artifact.quantize, "package": Artifact.package}
    api |= {"eval": deploytk.evaluate, "tune": deploytk.tune, "build": Artifact.build}
    assert set(api) == set(RENAMED)
    for command, fn in api.items():
        parameters = set(inspect.signature(fn).parameters)
        assert not set(RENAMED[command]) & parameters and set(RENAMED[command].values()) <= parameters, command


def test_old_flags_and_values_are_rewritten_with_a_note(capsys):
    args = ["--verbose", "package", "x", "--triton", "r", "--runtime", "onnxruntime", "--images=d", "--name", "images"]
    assert renamed_args(args) == ["--verbose", "package", "x", "--triton", "r", "--backend", "ort", "--data=d", "--name", "images"]
    err = capsys.readouterr().err
    assert "--runtime is now --backend on `deploytk package`" in err and "--backend onnxruntime is now --backend ort" in err
    assert "--images is now --data" in err
    assert renamed_args(["export", "c.yaml", "--images", "x"]) == ["export", "c.yaml", "--images", "x"]  # not export's to rename
    assert RENAMED_VALUES[("package", "backend")] == {"onnxruntime": "ort", "tensorrt": "trt"}


def test_an_old_flag_still_runs_the_command(exported):
    art = exported("digits_vit_tome_r4")
    old = runner.invoke(app, ["validate", str(art), "--num-images", "2", "--batch-size", "2", "--json"])
    new = runner.invoke(app, ["validate", str(art), "--num-samples", "2", "--batch-size", "2", "--json"])
    assert old.exit_code == new.exit_code == 0, old.output
    assert json.loads(old.stdout)["reports"][0]["num_images"] == 2
    assert "--num-images is now --num-samples on `deploytk validate`" in old.stderr and "now" not in new.stderr


def test_an_old_keyword_still_works_with_a_notice(exported):
    artifact = deploytk.load(exported("digits_vit_tome_r4"))
    with pytest.warns(DeploytkNotice, match=r"`num_images=` is now `num_samples=`"):
        old = artifact.validate(num_images=2, batch_size=2)
    assert old.to_dict() == artifact.validate(num_samples=2, batch_size=2).to_dict()
    with pytest.raises(DeploytkError, match=r"`num_images=` and `num_samples=` are the same keyword"):
        artifact.validate(num_images=2, num_samples=2)


def test_the_cli_reference_prints_the_table():
    from helpers import ROOT

    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert "## Vocabulary" in page
    for name in ("num_samples", "data", "backend", "batch_sizes"):
        assert f"| `{flag(name)}` |" in page, name


#: the config overrides (deploytk.vocabulary): each command that builds a model from CONFIG takes all of them (inspect
#: no checkpoint: it counts with random weights)
OVERRIDES = {"model", "method", "r", "precision", "output_kind", "img_size", "feature_layer", "checkpoint"}


@pytest.mark.parametrize("command", ["export", "inspect", "eval", "visualize"])
def test_every_command_that_builds_from_a_config_takes_every_override(command):
    wanted = OVERRIDES - {"checkpoint"} if command == "inspect" else OVERRIDES
    assert wanted <= {p.name for p in commands()[command].params}


def test_the_overrides_reach_the_config():
    """--img-size (one side or H,W), --r and --output-kind land where the API's keywords do."""
    cli = runner.invoke(app, ["inspect", "digits_vit_tome_r4", "--img-size", "48,32", "--r", "2", "--output-kind", "embedding", "--json"])
    assert cli.exit_code == 0, cli.output
    printed = json.loads(cli.stdout)
    assert printed == deploytk.inspect("digits_vit_tome_r4", img_size=(48, 32), r=2, output_kind="embedding").to_dict()
    assert printed["input"]["shape"] == ["batch", 3, 48, 32] and printed["r"] == 2 and printed["output"]["kind"] == "embedding"
    bad = runner.invoke(app, ["inspect", "digits_vit_tome_r4", "--img-size", "48,32,3"])
    assert bad.exit_code == 2 and "--img-size '48,32,3' has 3 sides" in bad.output


def test_an_option_value_and_what_follows_double_dash_are_never_rewritten(capsys):
    """Found in review: `package DIR --name --runtime` renamed the model name, and `--` did not stop the rewriting."""
    takes = {"--name", "--triton", "--backend", "--data"}
    assert renamed_args(["package", "x", "--name", "--runtime"], takes) == ["package", "x", "--name", "--runtime"]
    assert renamed_args(["eval", "c.yaml", "--", "--limit"], takes) == ["eval", "c.yaml", "--", "--limit"]
    assert renamed_args(["package", "x", "--runtime", "tensorrt"], takes) == ["package", "x", "--backend", "trt"]
    capsys.readouterr()
    assert renamed_args(["validate", "x", "--images", "d"], {"--data"}, quiet=True) == ["validate", "x", "--data", "d"]
    assert capsys.readouterr().err == ""
