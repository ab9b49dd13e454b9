"""Atomic writes (every artifact goes through them) and the installed package layout."""

import subprocess
import sys

import pytest

from deploytk.files import atomic_directory, atomic_file, write_atomically


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


def test_atomic_directory_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "artifact"
    with pytest.raises(ValueError), atomic_directory(target) as tmp:
        (tmp / "model.onnx").write_text("x")
        raise ValueError
    assert list(tmp_path.iterdir()) == []
    with atomic_directory(target) as tmp:
        (tmp / "model.onnx").write_text("y")
    assert (target / "model.onnx").read_text() == "y" and [p.name for p in tmp_path.iterdir()] == ["artifact"]


def test_the_plugins_folder_installs_as_deploytk_plugins_not_as_a_generic_plugins_package(tmp_path):
    code = "import importlib.util as u, deploytk_plugins; print(u.find_spec('plugins') is None, deploytk_plugins.__name__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "deploytk_plugins"]


def test_written_files_and_directories_get_the_umask_modes_not_owner_only(tmp_path):
    import os
    import stat

    from deploytk.files import atomic_directory, write_atomically

    umask = os.umask(0o022)
    try:
        write_atomically(tmp_path / "a.json", "{}")
        with atomic_directory(tmp_path / "d") as d:
            (d / "x").write_text("x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o755
