"""One writer per output (deploytk.files): a second writer is refused at once and loses nothing; what a killed writer
left is removed by the next write and by `deploytk clean`. Real processes: the CLI in subprocesses, paused with SIGSTOP
so that no verdict depends on how fast anything runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploytk.exporter.artifacts import EXPORT, Artifact
from deploytk.files import OutputLock, claim_directory, claim_file, lock_path, stale_entries

from helpers import snapshot
from helpers.configs import DIGITS_TOME_R4, ROOT

#: generous: a deadline that only a hang reaches (polling, never a verdict on speed)
DEADLINE_S = 600


def cli(*args, cwd: Path | None = None) -> list[str]:
    return [sys.executable, "-m", "deploytk", *map(str, args)]


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def wait_for(predicate, what: str, process: subprocess.Popen | None = None):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        if process is not None and process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"the writer ended (exit {process.returncode}) before {what}: {err[-2000:]}")
        time.sleep(0.05)
    pytest.fail(f"waited {DEADLINE_S} s for {what}")


def export_command(out: Path, r: int) -> list[str]:
    return cli("export", DIGITS_TOME_R4, "--output", out, "--r", r, "--json")


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_a_second_writer_is_refused_at_once_and_the_first_one_s_result_survives(tmp_path):
    out = tmp_path / "same"
    first = subprocess.Popen(export_command(out, 2), env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # the first writer holds the lock while it works: pause it there, mid-write
        wait_for(lambda: list(tmp_path.glob(".same.tmp-*")), "the first writer's temporary folder", first)
        os.kill(first.pid, signal.SIGSTOP)
        before = snapshot(tmp_path)
        second = subprocess.run(export_command(out, 4), env=env(), capture_output=True, text=True, timeout=DEADLINE_S)
        assert second.returncode == 2, second.stderr
        text = " ".join(second.stderr.split())
        assert f"--output {out} is being written by another deploytk process (pid {first.pid} " in text
        assert "refused before any work and nothing was changed" in text and "Traceback" not in text
        assert second.stdout == ""  # --json: nothing on stdout for a refusal
        assert snapshot(tmp_path) == before
    finally:
        os.kill(first.pid, signal.SIGCONT)
    stdout, stderr = first.communicate(timeout=DEADLINE_S)
    assert first.returncode == 0, stderr
    manifest = Artifact.open(out).manifest
    assert manifest["config"]["merge"]["r"] == 2 and json.loads(stdout)["config"]["merge"]["r"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same"]  # no lock file, no temporary


def test_a_lock_held_by_another_process_refuses_every_kind_of_output(tmp_path):
    """The holder here is a plain process holding the lock (as a paused writer would)."""
    hold = "import pathlib, sys, time; from deploytk.files import OutputLock; OutputLock(pathlib.Path(sys.argv[1])).acquire(); "
    hold += "print('held', flush=True); time.sleep(600)"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path / "out")], env=env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for claim in (lambda: claim_directory(tmp_path / "out", EXPORT), lambda: claim_file(tmp_path / "out", "deploytk test")):
            with pytest.raises(Exception, match=rf"is being written by another deploytk process \(pid {holder.pid} "):
                claim()
        assert [e["state"].startswith(f"in use by pid {holder.pid}") for e in stale_entries(tmp_path)] == [True]
    finally:
        holder.kill()
        holder.wait()
    with claim_directory(tmp_path / "out", EXPORT) as claim:  # the holder is gone: its lock went with it
        assert claim.lock.held
    assert list(tmp_path.iterdir()) == []  # a claim given up leaves nothing, not even its lock file


def test_the_lock_is_released_on_every_exit_path(tmp_path):
    target = tmp_path / "a" / "b" / "out"
    with pytest.raises(RuntimeError), claim_directory(target, EXPORT):
        assert lock_path(target).is_file()
        raise RuntimeError("the export failed")
    assert list(tmp_path.iterdir()) == []  # the folders the claim made went too
    claim = claim_directory(target, EXPORT)
    with claim.write() as tmp:
        (tmp / "manifest.json").write_text("{}")
    assert not claim.lock and sorted(p.name for p in target.parent.iterdir()) == ["out"]
    with pytest.raises(RuntimeError, match="was released"), claim.write():
        pass


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_what_a_killed_writer_left_is_removed_by_the_next_write_and_said(tmp_path):
    out = tmp_path / "art"
    first = subprocess.Popen(export_command(out, 2), env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    leftovers = wait_for(lambda: list(tmp_path.glob(".art.tmp-*")), "the writer's temporary folder", first)
    first.kill()  # SIGKILL: no cleanup runs
    first.communicate()
    assert all(p.exists() for p in leftovers) and lock_path(out).exists()

    listed = subprocess.run(cli("clean", tmp_path, "--dry-run", "--json"), env=env(), capture_output=True, text=True, timeout=DEADLINE_S)
    assert listed.returncode == 0, listed.stderr
    entries = json.loads(listed.stdout)["entries"]
    assert {(Path(e["path"]).name, e["kind"], e["state"]) for e in entries} == {
        *((p.name, "temporary", "stale") for p in leftovers),
        (lock_path(out).name, "lock file", "stale"),
    }
    assert all(p.exists() for p in leftovers)  # --dry-run removes nothing

    second = subprocess.run(export_command(out, 4), env=env(), capture_output=True, text=True, timeout=DEADLINE_S)
    assert second.returncode == 0, second.stderr
    text = " ".join(second.stderr.split())
    assert f"note: removed 1 temporary beside {out} left by an interrupted write ({leftovers[0].name})" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"] and Artifact.open(out).manifest["config"]["merge"]["r"] == 4


def test_clean_removes_only_what_no_live_writer_owns(tmp_path):
    (tmp_path / "sub").mkdir()
    stale_dir = tmp_path / "sub" / ".art.tmp-0123456789abcdef"
    stale_dir.mkdir()
    (stale_dir / "model.onnx").write_bytes(b"x" * 1000)
    stale_file = tmp_path / ".tuned.tmp-fedcba9876543210.yaml"
    stale_file.write_text("half")
    users = [tmp_path / ".art.tmp-notours", tmp_path / "art.tmp-0123456789abcdef", tmp_path / "notes.txt"]  # not deploytk's pattern
    for path in users:
        path.write_text("mine")
    live = OutputLock(tmp_path / "busy")
    assert live.acquire() is None
    busy = tmp_path / ".busy.tmp-00112233445566aa"
    busy.mkdir()
    try:
        entries = stale_entries(tmp_path, remove=True)
    finally:
        live.release()
    states = {Path(e["path"]).name: (e["kind"], e["state"], e["bytes"]) for e in entries}
    assert states[stale_dir.name] == ("temporary", "removed", 1000)
    assert states[stale_file.name] == ("temporary", "removed", 4)
    assert states[busy.name][1].startswith(f"in use by pid {os.getpid()} ")
    assert not stale_dir.exists() and not stale_file.exists() and busy.exists()
    assert all(p.read_text() == "mine" for p in users)


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_clean_refuses_what_is_not_a_folder(tmp_path):
    result = subprocess.run(cli("clean", tmp_path / "nope"), env=env(), capture_output=True, text=True, timeout=DEADLINE_S)
    assert result.returncode == 2 and f"{tmp_path / 'nope'} does not exist" in " ".join(result.stderr.split())
