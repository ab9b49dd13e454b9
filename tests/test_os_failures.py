"""OS failures (disk full, read-only, permissions) are one paragraph with exit 2, like bad input, in every output mode;
nothing half-written stays. Any other OSError is a bug and keeps its traceback.

Disk full and read-only are real: a small tmpfs, a read-only bind mount (root and a system that permits mounts; the
tests skip with the reason elsewhere). Permission denied cannot be made by chmod as root (root reads and writes
anyway), so it is raised by a patched ``onnx.save_model``, where the export writes its model.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from pathlib import Path

import onnx
import pytest
import yaml
from typer.testing import CliRunner

from deploytk.cli import app
from deploytk.config import config_to_dict

from helpers import digits_config, snapshot

runner = CliRunner()


@contextlib.contextmanager
def mounted(folder: Path, *args: str):
    """``mount ARGS folder``, unmounted on the way out; skips the test where mounting is not permitted."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; this test runs as an ordinary user")
    done = subprocess.run(["mount", *args, str(folder)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"this system does not permit mounts here (mount {' '.join(args)}: {done.stderr.strip()})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def files(root: Path) -> dict:
    """What is under ``root``: names, kinds and bytes (a folder's mtime changes with the temporary made and removed)."""
    return {k: (kind, data) for k, (kind, _mode, _mtime, data) in snapshot(root).items() if k != "."}


@pytest.fixture
def config(tmp_path):
    """The digits ToMe config as a file of its own folder (real weights, absolute checkpoint path): its export is 5.7 MB."""
    path = tmp_path / "config" / "digits.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(config_to_dict(digits_config("digits_vit_tome_r4"))))
    return path


def fails(args, match: str, *roots: Path, json_out: bool = False):
    """The command exits 2 with one paragraph holding ``match``, no traceback, and leaves every root as it was."""
    before = [files(root) for root in roots]
    result = runner.invoke(app, [str(a) for a in args] + (["--json"] if json_out else []))
    text = " ".join(result.stderr.split())
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and match in text, result.output
    assert text.startswith("error: ") and text.count("error: ") == 1, result.stderr
    if json_out:
        assert result.stdout == "", "--json prints nothing on stdout when the command fails"
    assert [files(root) for root in roots] == before, "a failed command left files behind"
    return text


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_export_to_a_full_disk_is_one_paragraph_and_leaves_nothing(tmp_path, config, json_out):
    with mounted(tmp_path / "small", "-t", "tmpfs", "-o", "size=1m", "tmpfs") as small:
        fails(
            ["export", config, "--output", small / "art"],
            f"No space left on device (ENOSPC) writing --output {small / 'art'}; the command stopped and left nothing "
            "half-written. Free space on that disk, or write to another one.",
            small,
            config.parent,
            json_out=json_out,
        )
        assert list(small.iterdir()) == []


def test_package_to_a_full_disk_is_one_paragraph_and_leaves_nothing(tmp_path, exported):
    artifact = exported("digits_vit_tome_r4")
    with mounted(tmp_path / "small", "-t", "tmpfs", "-o", "size=1m", "tmpfs") as small:
        fails(
            ["package", artifact, "--triton", small / "repo", "--name", "m"],
            f"No space left on device (ENOSPC) writing --triton {small / 'repo'}; the command stopped",
            small,
        )
        assert list(small.iterdir()) == []


def test_a_cache_folder_on_a_read_only_file_system_is_one_paragraph(tmp_path, exported, monkeypatch):
    """profile exports its dense baseline into deploytk's cache folder (never the artifact: a read-only model store
    profiles, tests/test_artifact_trust.py); a cache folder that cannot be written is named with the way out."""
    art = exported("digits_vit_tome_r4")
    with mounted(tmp_path / "ro", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs") as ro:
        monkeypatch.setenv("DEPLOYTK_CACHE", str(ro / "cache"))
        fails(
            ["profile", art, "--batch-sizes", "1", "--warmup", "0", "--iterations", "1"],
            f"dense baseline of {art} is kept in deploytk's cache folder, which cannot be written",
            art,
            ro,
            json_out=True,
        )


def test_an_output_on_a_read_only_file_system_is_refused_before_any_work(tmp_path, config):
    with mounted(tmp_path / "ro", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs") as ro:
        fails(["export", config, "--output", ro / "art"], f"--output {ro / 'art'}: cannot write in {ro} (Read-only file system).", ro)


def test_permission_denied_while_writing_is_one_paragraph_and_leaves_nothing(tmp_path, config, monkeypatch):
    def denied(proto, path, *args, **kwargs):
        Path(path).write_bytes(b"half")  # what a failing writer may leave: the export's temporary folder must go with it
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(onnx, "save_model", denied)
    out = tmp_path / "out"
    out.mkdir()
    text = fails(["export", config, "--output", out / "art"], "Permission denied (EACCES) at ", out, config.parent, json_out=True)
    assert f"model.onnx (writing --output {out / 'art'}); the command stopped and left nothing half-written. Choose a path" in text
    assert list(out.iterdir()) == []


def test_an_unreadable_config_is_named(tmp_path, config, monkeypatch):
    read_text = Path.read_text

    def denied(self, *args, **kwargs):
        if self == config:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", denied)
    fails(["inspect", config], f"config {config} cannot be read: Permission denied.", config.parent)


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_any_other_os_error_keeps_its_traceback(tmp_path, config, monkeypatch):
    """A bug is not dressed up as the user's problem: an OSError outside disk full / read-only / permissions propagates."""

    def broken(proto, path, *args, **kwargs):
        raise OSError(errno.EBADF, "Bad file descriptor")

    monkeypatch.setattr(onnx, "save_model", broken)
    result = runner.invoke(app, ["export", str(config), "--output", str(tmp_path / "art")])
    assert result.exit_code == 1 and isinstance(result.exception, OSError) and result.exception.errno == errno.EBADF
    assert not (tmp_path / "art").exists()
