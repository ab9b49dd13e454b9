"""The output rule (deploytk.files): claims refuse what deploytk did not write, writes are atomic, nothing is left behind."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import EXPORT, MANIFEST_FORMAT
from deploytk.files import DirectoryKind, atomic_file, claim_directory, claim_file, claim_yaml, write_atomically, written_by_deploytk

from helpers import snapshot


def _toy_files(folder: Path) -> set[str] | None:
    """A kind whose marker lists its files (as kernels.json does)."""
    try:
        return {"index.json", *json.loads((folder / "index.json").read_text())["files"]}
    except (OSError, ValueError, KeyError):
        return None


TOY = DirectoryKind("toy output", "index.json", _toy_files)


def write_toy(claim, files: dict[str, str]) -> None:
    with claim.write() as tmp:
        for name, text in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text)
        (tmp / "index.json").write_text(json.dumps({"files": sorted(files)}))


def test_atomic_file_replaces_only_on_success(tmp_path):
    target = tmp_path / "out" / "model.engine"
    write_atomically(target, b"first")
    with pytest.raises(RuntimeError), atomic_file(target) as tmp:
        tmp.write_bytes(b"half")
        assert tmp.suffix == ".engine" and tmp.parent == target.parent
        raise RuntimeError("interrupted")
    assert target.read_bytes() == b"first" and sorted(p.name for p in target.parent.iterdir()) == ["model.engine"]
    write_atomically(target, "second")
    assert target.read_text() == "second"


@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_a_failed_directory_write_leaves_nothing_not_even_the_parents_it_made(tmp_path, error):
    target = tmp_path / "new" / "deeper" / "artifact"
    with pytest.raises(error), claim_directory(target, TOY).write() as tmp:
        (tmp / "model.onnx").write_text("x")
        raise error
    assert list(tmp_path.iterdir()) == []
    write_toy(claim_directory(target, TOY), {"a.txt": "y"})
    assert (target / "a.txt").read_text() == "y" and [p.name for p in tmp_path.iterdir()] == ["new"]


def test_an_interrupt_the_moment_the_temporary_appears_leaves_nothing(tmp_path, monkeypatch):
    """A Ctrl-C or kill lands right after the temporary folder or file is made, before the call that made it returns (the
    moment a watcher sees it: a clean clone's run of test_hostile_inputs hit it): cleanup must still find it."""
    real_mkdir, real_open = os.mkdir, os.open

    def mkdir_then_interrupt(path, *args, **kwargs):
        real_mkdir(path, *args, **kwargs)
        if ".tmp-" in os.fspath(path):
            raise KeyboardInterrupt

    def open_then_interrupt(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        if ".tmp-" in os.fspath(path) and flags & os.O_CREAT:  # the creation, not a cleanup's reading
            os.close(fd)
            raise KeyboardInterrupt
        return fd

    monkeypatch.setattr(os, "mkdir", mkdir_then_interrupt)
    monkeypatch.setattr(os, "open", open_then_interrupt)
    with pytest.raises(KeyboardInterrupt), claim_directory(tmp_path / "new" / "artifact", TOY).write():
        pass
    with pytest.raises(KeyboardInterrupt), atomic_file(tmp_path / "made" / "model.engine"):
        pass
    assert list(tmp_path.iterdir()) == []


def test_an_earlier_output_is_replaced_as_a_whole_when_it_holds_only_deploytk_files(tmp_path):
    target = tmp_path / "out"
    write_toy(claim_directory(target, TOY), {"a.txt": "1", "sub/b.txt": "2"})
    write_toy(claim_directory(target, TOY), {"a.txt": "3"})
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == ["a.txt", "index.json"]
    assert (target / "a.txt").read_text() == "3" and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_an_empty_folder_the_user_made_is_filled_in_place(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    inode = target.stat().st_ino
    write_toy(claim_directory(target, TOY), {"a.txt": "1"})
    assert target.stat().st_ino == inode and sorted(p.name for p in target.iterdir()) == ["a.txt", "index.json"]


def test_a_folder_of_user_files_is_refused_even_with_force(tmp_path):
    target = tmp_path / "mydata"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    (target / "img1.jpg").write_bytes(b"\xff\xd8")
    before = snapshot(tmp_path)
    for force in (False, True):
        with pytest.raises(DeploytkError) as err:
            claim_directory(target, EXPORT, force=force)
        text = str(err.value)
        assert f"`output={target}` is a folder holding files deploytk did not write (img1.jpg, notes.txt)" in text
        assert "it is not a deploytk export" in text and "`force=True` never deletes other files" in text
    assert snapshot(tmp_path) == before


def test_an_earlier_output_with_user_files_needs_force_which_keeps_them(tmp_path):
    target = tmp_path / "out"
    write_toy(claim_directory(target, TOY), {"a.txt": "1", "old/b.txt": "2"})
    (target / "notes.txt").write_text("mine")
    (target / "old" / "mine.txt").write_text("mine too")
    before = snapshot(tmp_path)
    with pytest.raises(
        DeploytkError, match=r"is an earlier toy output but also holds files deploytk did not write \(notes.txt, old/mine.txt\)"
    ):
        claim_directory(target, TOY)
    assert snapshot(tmp_path) == before
    write_toy(claim_directory(target, TOY, force=True), {"a.txt": "3", "c.txt": "4"})
    files = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert files == ["a.txt", "c.txt", "index.json", "notes.txt", "old/mine.txt"]  # old/b.txt (deploytk's, stale) is gone
    assert (target / "notes.txt").read_text() == "mine" and (target / "a.txt").read_text() == "3"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_the_export_kind_knows_its_files_from_the_manifest(tmp_path):
    target = tmp_path / "art"
    (target / ".baseline").mkdir(parents=True)
    (target / "manifest.json").write_text(json.dumps({"format": MANIFEST_FORMAT}))
    for name in ("model.onnx", "model.engine", "engine.json", ".baseline/dense-0123.onnx"):
        (target / name).write_text("x")
    claim_directory(target, EXPORT)  # all deploytk's
    (target / "notes.txt").write_text("mine")
    with pytest.raises(DeploytkError, match=r"is an earlier deploytk export but also holds files deploytk did not write \(notes.txt\)"):
        claim_directory(target, EXPORT)
    (target / "manifest.json").write_text(json.dumps({"format": "someone-else/1"}))
    with pytest.raises(DeploytkError, match="it is not a deploytk export"):
        claim_directory(target, EXPORT, force=True)


@pytest.mark.parametrize("force", [False, True])
def test_a_regular_file_is_never_replaced_by_a_folder(tmp_path, force):
    target = tmp_path / "out_is_file"
    target.write_text("mine")
    before = snapshot(tmp_path)
    with pytest.raises(DeploytkError, match=r"is a file, not a deploytk export folder; deploytk never overwrites a file it did not write"):
        claim_directory(target, EXPORT, force=force)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "path, message",
    [
        (".", "names the working folder or one of its parents"),
        ("..", "names the working folder or one of its parents"),
        ("/", "names the root folder"),
        ("work/..", "names the working folder or one of its parents"),
        ("afile/sub", "afile is a file, not a folder, so nothing can be written under it"),
        ("/proc/deploytk-test/out", "cannot write in /proc"),
    ],
)
def test_paths_no_output_may_take_are_refused_before_anything_is_made(tmp_path, monkeypatch, path, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work").mkdir()
    (tmp_path / "afile").write_text("x")
    before = snapshot(tmp_path)
    for claim in (lambda: claim_directory(Path(path), EXPORT), lambda: claim_file(Path(path), "deploytk test")):
        with pytest.raises(DeploytkError, match=message.replace("(", r"\(")):
            claim()
    assert snapshot(tmp_path) == before


def test_a_link_is_not_written_through(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(DeploytkError, match="is a symbolic link; deploytk does not write through or replace links"):
        claim_directory(tmp_path / "link", EXPORT)


def test_a_file_is_replaced_only_when_it_carries_deploytk_s_mark(tmp_path):
    out = tmp_path / "report.json"
    out.write_text('{"mine": 1}')
    before = snapshot(tmp_path)
    with pytest.raises(DeploytkError, match=r"exists and was not written by deploytk; it was left as it is"):
        claim_file(out, "deploytk test")
    assert snapshot(tmp_path) == before
    out.unlink()
    claim_file(out, "deploytk test").write_json({"a": 1})
    assert json.loads(out.read_text()) == {"written_by": "deploytk test", "a": 1} and written_by_deploytk(out)
    claim_file(out, "deploytk test").write_json({"a": 2})  # a rerun replaces it
    assert json.loads(out.read_text())["a"] == 2
    config = tmp_path / "tuned.yaml"
    claim_yaml(config, "deploytk test").write_yaml("# Tuned by `deploytk tune x`.\nmodel: m\n")
    assert written_by_deploytk(config)
    config.write_text("model: m\n")  # the user's own config of that name
    with pytest.raises(DeploytkError, match="was not written by deploytk"):
        claim_yaml(config, "deploytk test")
    with pytest.raises(DeploytkError, match="writes a YAML config; give a file name ending in .yaml or .yml"):
        claim_yaml(tmp_path / "tuned.json", "deploytk test")
    with pytest.raises(DeploytkError, match="is a folder; deploytk test writes a file here"):
        claim_file(tmp_path, "deploytk test")


def test_a_png_is_marked_by_its_software_text(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    fig, _ = plt.subplots()
    out = tmp_path / "plot.png"
    claim_file(out, "deploytk test").save_figure(fig)
    with Image.open(out) as png:
        assert png.info["Software"] == "deploytk test"
    plain = tmp_path / "plain.png"
    fig.savefig(plain)  # matplotlib's own mark is not deploytk's
    plt.close(fig)
    assert written_by_deploytk(out) and not written_by_deploytk(plain)


def test_the_plugins_folder_installs_as_deploytk_plugins_not_as_a_generic_plugins_package(tmp_path):
    code = "import importlib.util as u, deploytk_plugins; print(u.find_spec('plugins') is None, deploytk_plugins.__name__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "deploytk_plugins"]


def test_written_files_and_directories_get_the_umask_modes_not_owner_only(tmp_path):
    umask = os.umask(0o022)
    try:
        claim_file(tmp_path / "a.json", "deploytk test").write_json({})
        write_toy(claim_directory(tmp_path / "d", TOY), {"x": "x"})
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o755


def test_a_cache_entry_that_changed_or_has_no_record_is_rebuilt_and_said(tmp_path, monkeypatch):
    """deploytk's cache (the dense baselines) checks each entry against the sha256 recorded when it was made: a flipped
    byte, a truncated file or an entry without its record is made again, with a notice; a sound one is read as it is.
    (The slow tier does the same with a real baseline under `deploytk profile`: tests/test_artifact_trust.py.)"""
    from deploytk.files import cached_file

    monkeypatch.setenv("DEPLOYTK_CACHE", str(tmp_path / "cache"))
    made = []

    def make(tmp: Path, name: str) -> None:
        made.append(name)
        tmp.write_bytes(b"baseline " * 100)

    entry = cached_file("baselines", "dense.onnx", make, "dense baseline of art")
    good = entry.read_bytes()
    assert cached_file("baselines", "dense.onnx", make, "dense baseline of art") == entry and made == ["dense.onnx"]
    flipped = bytearray(good)
    flipped[len(flipped) // 2] ^= 0xFF
    for damaged in (bytes(flipped), good[: len(good) // 3]):
        entry.write_bytes(damaged)
        with pytest.warns(
            UserWarning, match=r"the cached dense baseline of art \(.*dense.onnx\) did not match its recorded sha256; rebuilt it"
        ):
            assert cached_file("baselines", "dense.onnx", make, "dense baseline of art").read_bytes() == good
    entry.with_name("dense.onnx.json").unlink()
    with pytest.warns(UserWarning, match="had no record of its sha256; rebuilt it"):
        assert cached_file("baselines", "dense.onnx", make, "dense baseline of art").read_bytes() == good
    assert len(made) == 4
