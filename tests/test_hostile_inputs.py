"""Hostile inputs for every command: paths, files, images, configs.

Each refusal is checked for its text, exit code 2, and that the file system is unchanged (a
snapshot of the working folder, which holds the target and its parent, before and after).
Refusals of an output path must come before any work: the configs here name a checkpoint that
does not exist, so a command that started work would fail on the checkpoint instead.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from deploytk.cli import app

from helpers import snapshot

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "export_configs" / "digits_vit_tome_r4.yaml"
runner = CliRunner()


def config_text(stem: str = "digits_vit_tome_r4", **changes) -> str:
    data = yaml.safe_load((ROOT / "export_configs" / f"{stem}.yaml").read_text())
    data["checkpoint"] = str((ROOT / "export_configs" / data["checkpoint"]).resolve())  # relative to the config's folder
    for key, value in changes.items():
        data[key] = value
    return "# test config\n" + yaml.safe_dump(data)


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    """Configs outside the working folder: real weights, and ones whose checkpoint does not exist."""
    folder = tmp_path_factory.mktemp("configs")
    (folder / "digits.yaml").write_text(config_text())
    (folder / "no_weights.yaml").write_text(config_text(checkpoint="/nonexistent/weights.safetensors"))
    (folder / "atm_no_weights.yaml").write_text(config_text("digits_vit_atm", checkpoint="/nonexistent/weights.safetensors"))
    return folder


@pytest.fixture(scope="module")
def artifact(exported):
    """The digits ToMe export (configs/digits.yaml's config), the shared one: the commands here only read it."""
    return exported("digits_vit_tome_r4")


@pytest.fixture
def work(tmp_path, monkeypatch):
    """The working folder: a user's folder of files, a user's file, a file used as a parent."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mydata").mkdir()
    (tmp_path / "mydata" / "notes.txt").write_text("my notes")
    (tmp_path / "mydata" / "img1.jpg").write_bytes(b"\xff\xd8\xff")
    (tmp_path / "out_is_file").write_text("mine")
    (tmp_path / "afile").write_text("mine")
    return tmp_path


def refused(args, match: str, root: Path) -> str:
    before = snapshot(root)
    result = runner.invoke(app, [str(a) for a in args])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and match in text, result.output
    assert snapshot(root) == before, "a refused command changed the file system"
    return text


# every command that writes: (its arguments with the output path last or marked OUT, directory output?)
WRITERS = {
    "export": (lambda c, a: ["export", c / "no_weights.yaml", "--output", "OUT"], True),
    "export --force": (lambda c, a: ["export", c / "no_weights.yaml", "--output", "OUT", "--force"], True),
    "calibrate": (lambda c, a: ["calibrate", c / "atm_no_weights.yaml", "--synthetic", "4", "--output", "OUT"], False),
    "tune": (lambda c, a: ["tune", c / "no_weights.yaml", "--budget-ms", "5", "--output", "OUT"], False),
    "visualize": (lambda c, a: ["visualize", c / "no_weights.yaml", "--image", c / "missing.png", "--output", "OUT"], False),
    "package": (lambda c, a: ["package", a, "--triton", "OUT", "--name", "m"], True),
    "package --force": (lambda c, a: ["package", a, "--triton", "OUT", "--name", "m", "--force"], True),
    "plugins compile": (lambda c, a: ["plugins", "compile", "--arch", "sm_90", "--output", "OUT"], True),
}


def writer_args(name, configs, artifact, out: str) -> list:
    args, _ = WRITERS[name]
    return [out if a == "OUT" else a for a in args(configs, artifact)]


def file_name(name: str, target: str) -> str:
    """File-writing commands get the name with their suffix where the test is not about the name itself."""
    suffix = {"calibrate": ".yaml", "tune": ".yaml", "visualize": ".png"}.get(name)
    return target if suffix is None or target in (".", "..", "/") else target + suffix


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_folder_of_the_user_s_files_is_refused(name, work, configs, artifact):
    is_dir = WRITERS[name][1]
    if name.startswith("package"):  # the model folder is REPO/NAME: the user's folder is the model folder
        (work / "repo" / "m").mkdir(parents=True)
        (work / "repo" / "m" / "notes.txt").write_text("mine")
        refused(writer_args(name, configs, artifact, "repo"), "is a folder holding files deploytk did not write (notes.txt)", work)
        return
    match = "is a folder holding files deploytk did not write (img1.jpg, notes.txt)" if is_dir else "is a folder; deploytk"
    refused(writer_args(name, configs, artifact, "mydata"), match, work)


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_user_s_file_at_the_output_path_is_refused(name, work, configs, artifact):
    is_dir = WRITERS[name][1]
    if name.startswith("package"):
        refused(writer_args(name, configs, artifact, "out_is_file"), "out_is_file is a file, not a folder", work)  # REPO is a file
        return
    target = file_name(name, "out_is_file")
    if not is_dir:
        (work / target).write_text("mine")
    match = "is a file, not a deploytk" if is_dir else "exists and was not written by deploytk; it was left as it is"
    refused(writer_args(name, configs, artifact, target), match, work)


PATHS = [
    (".", "names the working folder or one of its parents"),
    ("..", "names the working folder or one of its parents"),
    ("/", "names the root folder"),
    ("afile/sub", "afile is a file, not a folder, so nothing can be written under it"),
    ("/proc/deploytk-out/x", "cannot write in /proc"),
]


@pytest.mark.parametrize(
    "name, target, match",
    # package writes REPO/NAME, a folder of its own under any repository folder, "." included
    [(n, t, m) for n in WRITERS for t, m in PATHS if not (n.startswith("package") and t in (".", "..", "/"))],
)
def test_paths_no_output_may_take_are_refused_before_any_work(name, target, match, work, configs, artifact):
    refused(writer_args(name, configs, artifact, file_name(name, target)), match, work)


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_export_over_an_earlier_export_replaces_only_its_own_files(work, configs, artifact):
    """A plain rerun over an earlier export, and the in-place replace, are held on the library level (tests/test_files.py)."""
    from deploytk.exporter.artifacts import Artifact

    out = work / "art"
    shutil.copytree(artifact, out)  # an earlier export of the same config
    (out / ".baseline").mkdir(exist_ok=True)
    (out / ".baseline" / "dense-0123456789abcdef.onnx").write_text("profile's cache of the earlier export")  # deploytk's
    (out / "notes.txt").write_text("mine")
    refused(
        ["export", configs / "digits.yaml", "--output", out],
        "is an earlier deploytk export but also holds files deploytk did not write (notes.txt); it was left as it is",
        work,
    )
    assert runner.invoke(app, ["export", str(configs / "digits.yaml"), "--output", str(out), "--force"]).exit_code == 0
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "model.onnx", "notes.txt"]  # the stale cache is gone
    Artifact.open(out)  # a whole export: model.onnx matches its manifest
    assert sorted(p.name for p in work.iterdir()) == ["afile", "art", "mydata", "out_is_file"], "no temp folders left"


def test_reading_commands_refuse_a_folder_that_is_not_an_export_without_advice_that_would_wipe_it(work):
    for command in (["validate", "mydata"], ["profile", "mydata"], ["package", "mydata", "--triton", "repo"]):
        text = refused(command, "mydata is not a deploytk artifact directory: model.onnx is missing", work)
        assert "Export again into a new folder with `deploytk export` and pass that folder." in text


def test_an_unreadable_image_is_named_and_nothing_is_written(work, artifact, configs):
    images = work / "images"
    images.mkdir()
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(images / "a.png")
    (images / "b.png").write_text("not an image")
    refused(["validate", artifact, "--data", images], f"image {images / 'b.png'} could not be read", work)
    # eval, calibrate and tune --data read through the same reader (deploytk.data.read_rgb, tests/test_images.py)


def test_validate_reads_a_16_bit_image_faithfully(work, artifact):
    """The 16-bit PNG goes through the same reader as every other command (tests/test_images.py compares the pixels)."""
    images = work / "images16"
    images.mkdir()
    Image.fromarray(np.random.default_rng(0).integers(0, 65536, (32, 32), dtype=np.uint16)).save(images / "a.png")
    result = runner.invoke(app, ["validate", str(artifact), "--data", str(images), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["reports"][0]["num_images"] == 1


@pytest.mark.parametrize("text", ["", "# only a comment\n"], ids=["empty", "comments only"])
def test_an_empty_config_is_an_error_not_the_defaults(text, work):
    (work / "empty.yaml").write_text(text)
    for command in ("export", "inspect"):
        refused([command, work / "empty.yaml"], f"config {work / 'empty.yaml'} is empty: it names no model or merge method", work)


@pytest.mark.parametrize("command", ["export", "inspect"])
@pytest.mark.parametrize("given", [15, 11], ids=["longer", "shorter"])
def test_an_r_list_that_does_not_fit_the_blocks_is_refused_naming_both_counts(command, given, work):
    """Export dropped the extra entries of a longer list (its manifest counted them) and inspect died in zip(); a shorter one
    was padded with zeros. Both commands go through one check (``parse_r``)."""
    (work / "r.yaml").write_text(config_text(merge={"method": "tome", "r": [4] * given}))
    args = [command, work / "r.yaml"] + (["--output", work / "art"] if command == "export" else [])
    refused(
        args,
        f"`merge.r` lists {given} values, one per block, but vit_tiny_patch16_224 has 12 blocks; a per-block r list must "
        "have exactly 12. Write 12 values (0 for a block that does not reduce), or one int for every block.",
        work,
    )


def test_a_config_that_is_not_utf8_text_is_refused(work):
    (work / "binary.yaml").write_bytes(b"model: \xac\xed\x00\x05 binary\n")
    for command in ("export", "inspect"):
        refused([command, work / "binary.yaml"], f"config {work / 'binary.yaml'} is not UTF-8 text (byte 0xac at offset 7)", work)


def test_a_directory_given_as_config_image_or_checkpoint_is_called_a_directory(work, configs):
    (work / "cfg.yaml").mkdir()
    for command in ("export", "inspect"):
        refused([command, work / "cfg.yaml"], f"config file {work / 'cfg.yaml'} is a directory, not a file.", work)
    refused(
        ["visualize", configs / "digits.yaml", "--image", work / "mydata", "--output", work / "v.png"],
        f"image {work / 'mydata'} is a directory, not an image file (--image)",
        work,
    )
    refused(
        ["export", configs / "digits.yaml", "--checkpoint", work / "mydata", "--output", work / "art"],
        f"checkpoint {work / 'mydata'} is a directory, not a weights file",
        work,
    )


def test_a_folder_named_like_an_image_inside_an_image_folder_is_called_a_directory(work, artifact):
    images = work / "mydata"
    (images / "img1.jpg").unlink()
    (images / "sub.png").mkdir()  # picked up by its suffix
    refused(["validate", artifact, "--data", images], f"image {images / 'sub.png'} is a directory, not an image file", work)


@pytest.mark.parametrize(
    "text, line",
    [
        (
            "model: vit_tiny_patch16_224\nmerge:\n  method: tome\n  r: 4\n  r: 8\n",
            "line 5, column 3: duplicate key `r` (first given at line 4)",
        ),
        (
            "model: vit_tiny_patch16_224\nmerge: {method: tome, r: 4, r: 8}\n",
            "line 2, column 29: duplicate key `r` (first given at line 2)",
        ),
        (
            "model: vit_tiny_patch16_224\nmerge: {method: tome}\nmodel: deit_tiny_patch16_224\n",
            "line 3, column 1: duplicate key `model` (first given at line 1)",
        ),
    ],
    ids=["block", "flow", "top level"],
)
def test_a_duplicate_yaml_key_is_refused_naming_the_key_and_line(text, line, work):
    (work / "dup.yaml").write_text(text)
    for command in ("export", "inspect"):
        refused([command, work / "dup.yaml"], f"config {work / 'dup.yaml'} is not valid YAML at {line}; give each key once.", work)


def test_a_yaml_merge_key_may_still_be_overridden(work):
    """``<<: *anchor`` then a key of the mapping's own is YAML's override, not a duplicate."""
    from deploytk.config import _UniqueKeyLoader

    text = "base: &b {method: tome, r: 4}\nmerge:\n  <<: *b\n  r: 2\n"
    assert yaml.load(text, Loader=_UniqueKeyLoader)["merge"] == {"method": "tome", "r": 2}


@pytest.mark.parametrize("value", [-5, "ten", True])
def test_a_negative_or_non_integer_num_classes_is_refused(value, work):
    """timm builds no head for num_classes <= 0, and -5 was reported as a logits model; 0 stays the headless model."""
    data = yaml.safe_load(config_text())
    data["model_kwargs"]["num_classes"] = value
    (work / "classes.yaml").write_text(yaml.safe_dump(data))
    for command in ("export", "inspect"):
        refused(
            [command, work / "classes.yaml"],
            f"`model_kwargs.num_classes` = {value!r}; allowed: an int >= 1 (the classes of the head: a logits model) or 0 "
            "(no head: the model outputs its pooled embedding).",
            work,
        )


def test_an_image_size_that_is_not_a_multiple_of_the_patch_is_refused(work, configs):
    (work / "odd.yaml").write_text("model: deit_tiny_patch16_224\nmerge: {method: tome, r: 8}\nexport: {img_size: 250}\n")
    refused(
        ["inspect", work / "odd.yaml"],
        "`export.img_size` = 250 is not a multiple of deit_tiny_patch16_224's patch size 16: timm's patch embedding "
        "(a Conv2d with stride 16, no padding) would drop the last 10 pixel rows and columns of every image without a word. "
        "Use 240 or 256.",
        work,
    )


def test_the_default_config_is_found_beside_the_package_from_any_folder(work):
    result = runner.invoke(app, ["inspect", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["gflops"] > 0
    assert "no CONFIG given: using the default" in result.stderr and "deit_small_tome_r16.yaml" in result.stderr


def test_offline_pretrained_fails_fast_with_the_hint(work, monkeypatch):
    import deploytk.adapters.timm_vit as timm_family

    monkeypatch.setattr(timm_family, "hub_reachable", lambda timeout_s=3.0: False)  # as on a machine without network
    (work / "pre.yaml").write_text("model: deit_tiny_patch16_224\npretrained: true\nmerge: {method: tome, r: 8}\n")
    refused(
        ["export", work / "pre.yaml", "--output", work / "pre_out"],
        "the Hugging Face Hub cannot be reached from this machine and they are not in the local cache. Offline, pass the "
        "weights with --checkpoint",
        work,
    )


def test_help_texts_keep_every_word_and_show_the_per_precision_defaults():
    import typer.main

    from deploytk.validate.validator import PRECISION_TOLERANCES

    result = runner.invoke(app, ["validate", "--help"], env={"COLUMNS": "200"})
    text = " ".join(result.output.split())
    expected = ", ".join(f"{p} {t.atol:g}" for p, t in PRECISION_TOLERANCES.items())
    assert f"Absolute tolerance on logits [default: {expected}]" in text
    group = typer.main.get_group(app)
    for name, command in {**group.commands, **group.commands["plugins"].commands}.items():
        if name == "plugins":
            continue
        args = ["plugins", name, "--help"] if name in group.commands["plugins"].commands else [name, "--help"]
        shown = "".join(runner.invoke(app, args, env={"COLUMNS": "200"}).output.split())  # click wraps after a hyphen too
        for param in command.params:
            if param.help:
                assert "".join(param.help.split()) in shown, f"{name} {param.name}: help text not shown whole"


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["Ctrl-C (also in test_files)", "kill"])
def test_an_interrupted_export_leaves_nothing_behind(tmp_path, sig):
    """The export of DeiT-Ti takes seconds while its temporary folder exists; interrupted then, nothing may stay. If the
    export finished before the signal (a fast machine), it must have finished whole: the verdict does not hang on timing."""
    out = tmp_path / "art"
    cli = Path(sys.executable).with_name("deploytk")
    proc = subprocess.Popen([str(cli), "export", str(ROOT / "export_configs" / "deit_tiny_tome_r8.yaml"), "--output", str(out)])
    while proc.poll() is None and not any(p.name.startswith(".art.tmp-") for p in tmp_path.iterdir()):
        time.sleep(0.01)
    if proc.poll() is None:
        os.kill(proc.pid, sig)
    code = proc.wait(timeout=600)
    if code == 0:
        assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "model.onnx"]
    else:
        assert code == 130, code
        assert list(tmp_path.iterdir()) == [], "an interrupted export left files behind"


def test_no_warning_comes_from_deploytk_s_own_code(artifact):
    """The CLI filters only third-party warnings (cli/quiet.py, by module: a blanket filter hid a user's real problems);
    deploytk itself raises none, e.g. by calling a deprecated API (Polygraphy's CompareFunc.simple did)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert runner.invoke(app, ["validate", str(artifact), "--num-samples", "8"]).exit_code == 0
    ours = [f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}" for w in caught if "/deploytk/" in w.filename]
    assert not ours, "\n".join(ours)
