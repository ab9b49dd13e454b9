"""Start and stop the `tritonserver` that the `nvidia-pytriton` wheel bundles, on 127.0.0.1, with stand-in backends.

The wheel has the server and its Python backend but not Triton's C++ onnxruntime and openvino backends, and no
package provides those. Triton's "Python-based backends" fill the gap: a folder ``backends/<name>/model.py`` is
loaded for every model whose config says ``backend: "<name>"``, so a repository `deploytk package` wrote loads
unchanged. ``serving/backends/`` holds one stand-in per backend (ONNX Runtime's and OpenVINO's Python APIs).

What this module knows, each learned the hard way:
- the Python backend's stub must match the serving environment's Python version and find that Python's
  ``libpython`` and the wheel's bundled libraries (``LD_LIBRARY_PATH``); it finds its environment through ``PATH``;
- the backend library and the stub must be real files inside the backend folder (a symlink "escapes the backend
  directory");
- a server whose stub cannot start may hang instead of exiting, so every start has its own deadline, and the
  process (its whole session) is stopped by id;
- the server runs in a session of its own, so a signal to whoever started it never reaches it: `main` (the
  ``deploytk-triton`` command) turns SIGTERM, SIGINT and SIGHUP into a stop of that whole process group and the removal
  of its scratch folder and shared memory, or the server and its stubs outlive it, still serving.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the serving environment `make serve-env` makes from serving/requirements.txt
SERVE_VENV = ROOT / ".venv-serve"
STANDINS = Path(__file__).resolve().parent / "backends"
#: the Triton backends a stand-in replaces (folder names under serving/backends/)
STANDIN_BACKENDS = ("onnxruntime", "openvino")
#: the stand-ins' variable for TritonServer(hold_loads=...) (serving/backends/standin_common.py reads it)
HOLD_LOADS = "DEPLOYTK_STANDIN_HOLD_LOADS"
#: how long a start may take before the server is stopped and the start fails with its log
START_TIMEOUT_S = 120.0
#: the serving venv for `deploytk-triton` when --serve-venv is not given (an installed, not editable, copy has no
#: repository beside it)
SERVE_VENV_VARIABLE = "DEPLOYTK_SERVE_VENV"
#: what stops `deploytk-triton`: the whole server, then its scratch folder and shared memory
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class ServerError(RuntimeError):
    """The server could not be found, did not start, or exited; the message carries the end of its log."""


@dataclass(frozen=True)
class ServeEnvironment:
    """The serving venv: its interpreter's version and libpython folder, and the wheel's server tree."""

    venv: Path
    python_version: str  # "3.11": which stub to use
    libdir: Path  # where libpython lives
    server_root: Path  # .../site-packages/pytriton/tritonserver
    bundled_libs: Path  # .../site-packages/nvidia_pytriton.libs

    @property
    def binary(self) -> Path:
        return self.server_root / "bin" / "tritonserver"

    @classmethod
    def find(cls, venv: Path = SERVE_VENV) -> ServeEnvironment:
        python = venv / "bin" / "python"
        if not python.exists():
            raise ServerError(f"{venv} does not exist: it is the serving environment. Make it with `make serve-env`.")
        probe = (
            "import json, sys, sysconfig, pathlib, pytriton;"
            "print(json.dumps([f'{sys.version_info[0]}.{sys.version_info[1]}', sysconfig.get_config_var('LIBDIR'),"
            " str(pathlib.Path(pytriton.__file__).parent)]))"
        )
        done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
        if done.returncode != 0:
            raise ServerError(f"{venv} has no nvidia-pytriton ({done.stderr.strip().splitlines()[-1:]}). Run `make serve-env`.")
        version, libdir, package = json.loads(done.stdout)
        environment = cls(venv, version, Path(libdir), Path(package) / "tritonserver", Path(package).parent / "nvidia_pytriton.libs")
        if not environment.binary.is_file():
            raise ServerError(f"{environment.binary} is missing: the nvidia-pytriton wheel in {venv} has no server.")
        return environment

    def backend_directory(self, where: Path) -> Path:
        """A backend folder: the Python backend (library, its utils and the stub for this Python) and the stand-ins."""
        where.mkdir(parents=True, exist_ok=True)
        python = where / "python"
        shutil.copytree(self.server_root / "backends" / "python", python, ignore=shutil.ignore_patterns("__pycache__"))
        stub = self.server_root / "python_backend_stubs" / self.python_version / "triton_python_backend_stub"
        if not stub.is_file():
            raise ServerError(f"the wheel has no Python backend stub for Python {self.python_version} ({stub}).")
        shutil.copy2(stub, python / stub.name)
        for name in STANDIN_BACKENDS:  # model.py plus what the stand-ins share, beside it (the folder is on sys.path)
            (where / name).mkdir()
            shutil.copy2(STANDINS / name / "model.py", where / name / "model.py")
            shutil.copy2(STANDINS / "standin_common.py", where / name / "standin_common.py")
        return where

    def environ(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(self.libdir), str(self.bundled_libs), env.get("LD_LIBRARY_PATH")]))
        env.pop("PYTHONPATH", None)  # the stub's imports come from the serving venv only
        env.setdefault("OMP_NUM_THREADS", "2")
        return env


def settled_statistics(read, inference_count: int, timeout: float = 10.0) -> dict:
    """A model's statistics (``read()``: one model_stats entry as JSON) once they count ``inference_count`` inferences:
    the backend may record a batch's statistics just after it has sent the responses."""
    deadline = time.monotonic() + timeout
    while True:
        stats = read()
        if int(stats.get("inference_count", 0)) >= inference_count or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def group_members(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` that still run (a zombie has exited: it waits to be reaped, holds nothing)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        except (OSError, IndexError):  # it exited while we looked
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def _wait_until_gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:  # the last member went in between
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TritonServer:
    """One `tritonserver` process on a model repository, listening on 127.0.0.1 only (HTTP, gRPC; no metrics port).

    Every model in the repository is loaded at start; a model that fails to load leaves the others serving
    (``--exit-on-error=false``, readiness not strict), its reason in the repository index."""

    def __init__(self, repository: Path, environment: ServeEnvironment | None = None, hold_loads: Path | None = None):
        """``hold_loads``: a folder; while it holds a file named ``hold``, every stand-in model's load waits after writing
        ``<model>.loading`` there (serving/backends/standin_common.py), so a test can stop the server mid-load."""
        self.repository = Path(repository)
        self.environment = environment or ServeEnvironment.find()
        self.hold_loads = hold_loads
        self._scratch = Path(tempfile.mkdtemp(prefix="deploytk-triton-"))
        #: the Python backend's shared-memory regions (/dev/shm/<prefix>*), removed by close() even after a SIGKILL
        self.shm_prefix = f"deploytk_{self._scratch.name.rsplit('-', 1)[-1]}_"
        self.log_path = self._scratch / "server.log"
        self.process: subprocess.Popen | None = None
        self.http_port = self.grpc_port = None
        try:
            self.backends = self.environment.backend_directory(self._scratch / "backends")
        except BaseException:
            self.close()
            raise

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def command(self) -> list[str]:
        return [
            str(self.environment.binary),
            f"--model-repository={self.repository}",
            f"--backend-directory={self.backends}",
            "--http-address=127.0.0.1",
            f"--http-port={self.http_port}",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={self.grpc_port}",
            "--allow-metrics=false",
            "--exit-on-error=false",
            "--strict-readiness=false",
            "--model-control-mode=none",
            "--exit-timeout-secs=5",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
        ]

    def launch(self) -> TritonServer:
        """Start the process and return at once (``start`` also waits until it is live)."""
        self.http_port, self.grpc_port = free_port(), free_port()
        # a temporary folder inside the scratch folder, removed with it: the stubs' ONNX Runtime (its telemetry) writes
        # $TMPDIR/.ses on import, and nothing the server or its stubs put there is left in the user's
        (self._scratch / "tmp").mkdir(exist_ok=True)
        with self.log_path.open("wb") as log:
            env = self.environment.environ() | {"TMPDIR": str(self._scratch / "tmp")}
            env |= {HOLD_LOADS: str(self.hold_loads)} if self.hold_loads else {}
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return self

    def start(self, timeout: float = START_TIMEOUT_S) -> TritonServer:
        """Start the server and wait until its HTTP endpoint is live (in mode none, after every model's load was tried).
        A start that fails stops the server and removes everything it made (close) before raising."""
        self.launch()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise ServerError(f"tritonserver exited with code {self.process.returncode} while starting:\n{self.log_tail()}")
                if self._live():
                    return self
                time.sleep(0.2)
            raise ServerError(f"tritonserver was not live after {timeout:.0f} s and was stopped:\n{self.log_tail()}")
        except BaseException:
            self.close()
            raise

    def _live(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/live", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill would: no shutdown of any kind."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM to the server's process group (server and stubs), SIGKILL after ``timeout``; then SIGKILL to any
        member still running once the server has gone (a stub of a server that was killed or died), and wait until
        none is left (bounded)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        # The group outlives its leader while a member runs; its id cannot be reused until the last one has gone.
        if not _wait_until_gone(self.process.pid, 2.0):
            _signal_group(self.process.pid, signal.SIGKILL)
            _wait_until_gone(self.process.pid, 10.0)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:  # not started, or closed
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def close(self) -> None:
        """Stop the server, remove its scratch folder and its shared-memory regions (a killed server leaves them)."""
        self.stop()
        shutil.rmtree(self._scratch, ignore_errors=True)
        for region in Path("/dev/shm").glob(f"{self.shm_prefix}*"):
            region.unlink(missing_ok=True)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    """``deploytk-triton REPO`` (or ``python -m deploytk_serving``; ``python -m serving.tritonserver`` from the repository
    root): serve a repository until SIGTERM, SIGINT (Ctrl-C) or SIGHUP, or until the server exits.

    A signal is only recorded by its handler and acted on between steps, never in the middle of starting the process or
    of cleaning up, so every way out goes through ``close()``: the server's whole process group stopped (SIGTERM, then
    SIGKILL after a bounded wait), its scratch folder and its shared-memory regions removed. Stopped by a signal, it then
    dies of that signal, as a process that does not handle it would (exit status 128 + its number in a shell); a server
    that exits on its own is an error (1); a repository or serving environment that is not there, bad input (2)."""
    parser = argparse.ArgumentParser(
        prog="deploytk-triton",
        description="Serve a Triton model repository (deploytk package --triton) with the local tritonserver on 127.0.0.1 "
        "until SIGTERM, SIGINT (Ctrl-C) or SIGHUP, which stop the server and its stubs and remove its scratch folder "
        "and shared memory.",
    )
    parser.add_argument("repository", type=Path, help="the model repository folder")
    parser.add_argument(
        "--serve-venv",
        type=Path,
        default=Path(os.environ.get(SERVE_VENV_VARIABLE) or SERVE_VENV),
        help=f"the serving environment (make serve-env); default ${SERVE_VENV_VARIABLE}, else {SERVE_VENV}",
    )
    parser.add_argument("--start-timeout", type=float, default=START_TIMEOUT_S, help="seconds the server has to become live")
    args = parser.parse_args(argv)

    received: list[int] = []

    def record(signum, frame):  # acted on by the loops in _serve
        received.append(signum)

    for signum in STOP_SIGNALS:
        # SIGHUP ignored by whoever started us (nohup) stays ignored; SIGTERM and SIGINT always stop the server
        if signum != signal.SIGHUP or signal.getsignal(signum) != signal.SIG_IGN:
            signal.signal(signum, record)
    code = _serve(args.repository, args.serve_venv, args.start_timeout, received)
    if received:
        signum = received[0]
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # die of it; only reached past here if it is blocked
        return 128 + signum
    return code


def _serve(repository: Path, venv: Path, start_timeout: float, received: list[int]) -> int:
    if not repository.is_dir():
        print(f"error: {repository} is not a folder: give the model repository `deploytk package --triton` wrote.", file=sys.stderr)
        return 2
    try:
        environment = ServeEnvironment.find(venv)
    except ServerError as e:
        print(
            f"error: {e} An installed deploytk-triton outside a checkout: name it with --serve-venv or ${SERVE_VENV_VARIABLE}.",
            file=sys.stderr,
        )
        return 2
    try:
        server = TritonServer(repository, environment)  # its scratch folder: removed again if this fails
    except ServerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        if not received:
            server.launch()
        deadline = time.monotonic() + start_timeout
        while not received and not server._live():
            if server.process.poll() is not None:
                print(
                    f"error: tritonserver exited with code {server.process.returncode} while starting:\n{server.log_tail()}",
                    file=sys.stderr,
                )
                return 1
            if time.monotonic() > deadline:
                print(
                    f"error: tritonserver was not live after {start_timeout:.0f} s and was stopped:\n{server.log_tail()}", file=sys.stderr
                )
                return 1
            time.sleep(0.2)
        if not received:
            print(
                f"serving {repository}: HTTP {server.http_url}, gRPC {server.grpc_url} (server process group {server.process.pid}, "
                f"scratch {server._scratch}, shared memory /dev/shm/{server.shm_prefix}*; SIGTERM or Ctrl-C stops it)",
                flush=True,
            )
        while not received and server.process.poll() is None:
            time.sleep(0.2)
        if not received:
            print(f"error: tritonserver exited with code {server.process.returncode}:\n{server.log_tail()}", file=sys.stderr)
            return 1
    finally:
        server.close()
    name = signal.Signals(received[0]).name
    print(
        f"stopped by {name}: server process group {server.process.pid if server.process else '-'} ended, {server._scratch} and "
        f"/dev/shm/{server.shm_prefix}* removed",
        flush=True,
    )
    return 0


if __name__ == "__main__":  # python -m serving.tritonserver REPO, from the repository root
    sys.exit(main())
