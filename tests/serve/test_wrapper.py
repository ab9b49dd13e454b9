"""`deploytk-triton` (serving/tritonserver.py's ``main``) with a real server: SIGTERM and SIGINT stop the server's whole
process group and leave no process, scratch folder or shared memory, and the command runs from any folder.

Each wrapper runs with its own TMPDIR, so its scratch folder is the only thing there; its serving line names its process
group and shared-memory prefix, and each is checked to be there before the signal, so the checks after it can fail.
Every wait is bounded; none decides a verdict."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from serving.tritonserver import ROOT, SERVE_VENV_VARIABLE, START_TIMEOUT_S

from helpers.serving import SERVED_EXPORTS, package

SERVING = re.compile(
    r"HTTP (?P<http>127\.0\.0\.1:\d+), gRPC \S+ \(server process group (?P<pgid>\d+), scratch (?P<scratch>\S+), "
    r"shared memory /dev/shm/(?P<shm>\S+)\*"
)
#: how long a stopped wrapper may take to exit (its stop: SIGTERM, 15 s, SIGKILL, then the stragglers): a bound, not a verdict
EXIT_BOUND_S = 60.0


def live_members(pgid: int) -> list[str]:
    """'pid state command' of every process of group ``pgid`` that has not exited (read from /proc, independently of
    the wrapper's own check)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        command, rest = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        if int(rest[2]) == pgid and rest[0] != "Z":
            found.append(f"{stat.parent.name} {rest[0]} {command}")
    return found


def regions(prefix: str) -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(f"{prefix}*"))


def answers(http_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{http_url}/v2/health/live", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


class Wrapper:
    """One deploytk-triton process, its output in a file, its scratch folder under a TMPDIR of its own."""

    def __init__(self, command: list[str], repository: Path, folder: Path, cwd: Path, env: dict[str, str]):
        self.tmpdir = folder / "tmp"
        self.tmpdir.mkdir(parents=True)
        self.out = folder / "wrapper.out"
        self.info: dict | None = None
        with self.out.open("wb") as out:
            env = env | {"TMPDIR": str(self.tmpdir)}
            self.process = subprocess.Popen([*command, str(repository)], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def serving(self) -> dict:
        """The serving line's facts once it is printed (bounded by the start's own deadline and some)."""
        deadline = time.monotonic() + START_TIMEOUT_S + 30
        while (found := SERVING.search(self.output())) is None and self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        found = found or SERVING.search(self.output())
        assert found, f"the wrapper did not say it was serving (exit {self.process.poll()}):\n{self.output()}"
        self.info = found.groupdict() | {"pgid": int(found["pgid"])}
        return self.info

    def assert_something_to_leave(self) -> None:
        """The server, a stub, the shared memory and the scratch folder are there, and HTTP answers."""
        info = self.info
        assert len(live_members(info["pgid"])) >= 2, live_members(info["pgid"])  # tritonserver and at least one stub
        assert regions(info["shm"]), f"no /dev/shm/{info['shm']}* while serving"
        assert [p.name for p in self.tmpdir.iterdir()] == [Path(info["scratch"]).name]
        assert answers(info["http"])

    def assert_nothing_left(self) -> None:
        info = self.info
        assert live_members(info["pgid"]) == [], self.output()
        assert regions(info["shm"]) == []
        assert list(self.tmpdir.iterdir()) == []
        assert not answers(info["http"])

    def wait(self) -> int:
        try:
            return self.process.wait(EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the wrapper had not exited {EXIT_BOUND_S:.0f} s after it was stopped:\n{self.output()}")

    def remove_leftovers(self) -> None:
        """After a failed test: the wrapper, its server's group (by its id) and its regions, so no server outlives the test."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.info:
            if live_members(self.info["pgid"]):
                os.killpg(self.info["pgid"], signal.SIGKILL)
            for name in regions(self.info["shm"]):
                (Path("/dev/shm") / name).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def digits_repository(serve_environment, exported, tmp_path_factory) -> Path:
    """One small model (the digits ToMe export), as `deploytk package` writes it: each server here starts in seconds."""
    repository = tmp_path_factory.mktemp("wrapper-repo")
    package(exported(SERVED_EXPORTS["digits"]), repository, "digits")
    return repository


@pytest.fixture
def wrapper(serve_environment, tmp_path):
    started: list[Wrapper] = []

    def start(command: list[str], repository: Path, cwd: Path = ROOT, env: dict | None = None) -> Wrapper:
        env = (env or dict(os.environ)) | {SERVE_VENV_VARIABLE: str(serve_environment.venv)}
        started.append(Wrapper(command, repository, tmp_path / f"wrapper{len(started)}", cwd, env))
        return started[-1]

    yield start
    for each in started:
        each.remove_leftovers()


@pytest.mark.parametrize("signum", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_whole_server_and_leaves_nothing(wrapper, digits_repository, signum):
    running = wrapper([sys.executable, "-m", "serving.tritonserver"], digits_repository)
    running.serving()
    running.assert_something_to_leave()
    running.process.send_signal(signum)
    assert running.wait() == -signum, running.output()  # it dies of the signal, as an unhandled one would kill it
    running.assert_nothing_left()
    assert f"stopped by {signum.name}: server process group {running.info['pgid']} ended" in running.output()


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_a_server_that_dies_takes_its_stubs_and_files_with_it(wrapper, digits_repository):
    """tritonserver killed on its own (SIGKILL to it alone, as an OOM kill would): its stubs are left without it; the
    wrapper stops them, removes the scratch folder and the shared memory, and exits 1 saying why."""
    running = wrapper([sys.executable, "-m", "serving.tritonserver"], digits_repository)
    running.serving()
    running.assert_something_to_leave()
    os.kill(running.info["pgid"], signal.SIGKILL)  # the group's leader is the server
    assert running.wait() == 1, running.output()
    running.assert_nothing_left()
    assert "error: tritonserver exited with code -9" in running.output()


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_the_installed_command_serves_from_a_folder_outside_the_repository(wrapper, digits_repository, tmp_path):
    """`deploytk-triton` (the console script pyproject.toml declares) run from an unrelated folder, with the checkout off
    PYTHONPATH: it serves, and SIGTERM still leaves nothing."""
    httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[grpc,http] (the `test` extra) is not installed")
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    script = shutil.which("deploytk-triton", path=search)
    if script is None:
        message = "deploytk-triton is not installed: `make install` (setup.py installs serving/ as deploytk_serving)"
        if os.environ.get("DEPLOYTK_REQUIRE_SERVER"):
            pytest.fail(message)
        pytest.skip(message)
    env = dict(os.environ)
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT]
    env["PYTHONPATH"] = os.pathsep.join(kept)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    running = wrapper([script], digits_repository, cwd=elsewhere, env=env)
    info = running.serving()
    running.assert_something_to_leave()
    batch = np.random.default_rng(0).standard_normal((2, 3, 32, 32), dtype=np.float32)
    request = httpclient.InferInput("input", list(batch.shape), "FP32")
    request.set_data_from_numpy(batch)
    logits = httpclient.InferenceServerClient(info["http"]).infer("digits", [request]).as_numpy("logits")
    assert logits.shape == (2, 10) and np.isfinite(logits).all()
    running.process.send_signal(signal.SIGTERM)
    assert running.wait() == -signal.SIGTERM, running.output()
    running.assert_nothing_left()
    assert list(elsewhere.iterdir()) == []  # it wrote nothing into the folder it ran from


def test_a_repository_that_is_not_there_is_refused_before_anything_is_made(tmp_path):
    """No server, no scratch folder: exit 2 naming the path (no serving environment needed to see it)."""
    (tmp_path / "tmp").mkdir()
    missing = tmp_path / "no-such-repo"
    done = subprocess.run(
        [sys.executable, "-m", "serving.tritonserver", str(missing)],
        cwd=ROOT,
        env=dict(os.environ) | {"TMPDIR": str(tmp_path / "tmp")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert f"error: {missing} is not a folder" in done.stderr
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_process_group_is_gone_only_when_its_last_member_is():
    """The wrapper's stop waits for the whole process group (what tritonserver starts included): a live member keeps it
    waiting to its timeout, a killed and reaped one does not."""
    from serving.tritonserver import _wait_until_gone, group_members

    child = subprocess.Popen(["sleep", "60"], start_new_session=True)  # its own group: pgid == pid
    try:
        assert group_members(child.pid) == [child.pid]
        assert not _wait_until_gone(child.pid, timeout=0.2)  # still there after the timeout
    finally:
        child.kill()
        child.wait()
    assert group_members(child.pid) == [] and _wait_until_gone(child.pid, timeout=5)
