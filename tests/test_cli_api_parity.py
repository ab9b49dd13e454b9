"""Issue 42, item 3: the CLI is a thin layer over the Python API. For each command, `deploytk COMMAND ... --json` prints
what the API call with the same inputs returns as ``to_dict()``.

Each test runs both on the tiny digits ViT and compares the two objects after dropping only what legitimately differs
between two runs, listed per command in ``DROPPED`` (``a.b``: key b of a; ``a.*.b``: key b of every item of list a):
timestamps (``created``) and the manifest's seal over them (``content_sha256``), durations (``export_seconds``,
``seconds``), measured latencies and what is computed from them. Every dropped key must be present in both objects
(``drop`` raises otherwise), so a key that goes missing still fails. The two runs write into their own folders,
``TMP/cli`` and ``TMP/api``; each folder's path is replaced by ``OUT`` wherever it appears before the comparison.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import deploytk
from deploytk.cli import app
from deploytk.errors import DeploytkError
from deploytk.optional import tensorrt_version

from helpers import ROOT
from helpers.configs import CONFIGS, DIGITS_TOME_R4

runner = CliRunner()
#: what two runs of the same command legitimately differ in (see the module docstring), per command
DROPPED = {
    "export": ("created", "content_sha256", "onnx.export_seconds"),
    "quantize": ("created", "content_sha256", "quantization.seconds"),
    "validate": (),
    "profile": (
        "results.*.latency_ms",
        "results.*.throughput",
        "results.*.speedup_vs_dense",
        "results.*.dense.latency_ms",
        "results.*.dense.throughput",
        "warnings",
    ),
    "inspect": (),
    "visualize": (),
    "methods": (),
    "families": (),
    "configs": (),
    "calibrate": ("created",),
    # the message quotes the measured latencies (its start is compared in the test); the command that reproduces the run
    # is the shell command from the CLI and the Python call from the API (each checked in the test)
    "tune": ("dense_latency_ms", "measured.*.latency_ms", "measured.*.runs_ms", "measured.*.dense_latency_ms", "message", "command"),
    "package": (),
    "eval": ("seconds",),
    "doctor": (),
    "clean": (),
    "selftest": ("cases.*.seconds",),
}


def drop(report: dict, paths) -> dict:
    """A copy of ``report`` without ``paths``; a path that is not there raises KeyError (the list must stay true)."""
    report = copy.deepcopy(report)
    for path in paths:
        _drop(report, path.split("."), path)
    return report


def _drop(node, keys: list[str], path: str) -> None:
    head, rest = keys[0], keys[1:]
    if head == "*":
        assert isinstance(node, list) and node, f"{path}: no list to drop from"
        for item in node:
            _drop(item, rest, path)
    elif not rest:
        del node[head]  # KeyError: the key is gone from the report
    else:
        _drop(node[head], rest, path)


def cli_json(*args, exit_code: int = 0) -> dict:
    """`deploytk ARGS --json` through typer's runner: the one JSON object on stdout, after checking the exit code."""
    result = runner.invoke(app, [*map(str, args), "--json"])
    assert result.exit_code == exit_code, result.output
    return json.loads(result.stdout)


def assert_same(command: str, printed: dict, returned: dict, tmp_path=None) -> None:
    """Equal but for DROPPED[command], and, with ``tmp_path``, the paths of the CLI's and the API's own folders."""
    if tmp_path is not None:
        printed, returned = in_out(printed, tmp_path / "cli"), in_out(returned, tmp_path / "api")
    assert drop(printed, DROPPED[command]) == drop(returned, DROPPED[command])


def in_out(report: dict, folder) -> dict:
    """``report`` with the path of the run's own output folder written OUT."""
    return json.loads(json.dumps(report).replace(str(folder), "OUT"))


@pytest.fixture
def in_root(monkeypatch):
    """The digits configs name their checkpoint relative to the repository root, as a user runs them from there."""
    monkeypatch.chdir(ROOT)


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_export(tmp_path, in_root):
    printed = cli_json("export", DIGITS_TOME_R4, "--output", tmp_path / "cli")
    returned = deploytk.export(DIGITS_TOME_R4, tmp_path / "api").to_dict()
    assert (printed["directory"], returned["directory"]) == (str(tmp_path / "cli"), str(tmp_path / "api"))
    assert printed["onnx"]["sha256"] == returned["onnx"]["sha256"]  # the same graph, byte for byte
    assert_same("export", printed, returned, tmp_path)


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_quantize(exported, tmp_path):
    source = exported("digits_vit_tome_r4")
    printed = cli_json("quantize", source, "--backend", "ort", "--synthetic", 8, "--output", tmp_path / "cli")
    returned = deploytk.load(source).quantize("ort", synthetic=8, output=tmp_path / "api").to_dict()
    # the richer shape of the two the CLI and the API had: the new artifact, {"directory": DIR, **manifest}, as export's
    assert printed == {"directory": str(tmp_path / "cli"), **json.loads((tmp_path / "cli" / "manifest.json").read_text())}
    assert_same("quantize", printed, returned, tmp_path)


def test_validate(exported):
    source = exported("digits_vit_tome_r4")
    printed = cli_json("validate", source, "--num-samples", 4, "--batch-size", 4)
    returned = deploytk.load(source).validate(num_samples=4, batch_size=4).to_dict()
    # one backend prints the same shape as several: passed, backends, one report each
    assert printed["backends"] == ["ort"] and len(printed["reports"]) == 1 and printed["passed"] is True
    assert_same("validate", printed, returned)


def test_validate_exits_1_where_the_api_says_failed(exported):
    source = exported("digits_vit_tome_r4")
    printed = cli_json("validate", source, "--num-samples", 4, "--batch-size", 4, "--atol", 0, "--rtol", 0, exit_code=1)
    returned = deploytk.load(source).validate(num_samples=4, batch_size=4, atol=0, rtol=0)
    assert printed["passed"] is False and returned.passed is False
    assert_same("validate", printed, returned.to_dict())


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_profile(exported):
    source = exported("digits_vit_tome_r4")
    printed = cli_json("profile", source, "--batch-sizes", 1, "--warmup", 0, "--iterations", 1)
    returned = deploytk.load(source).profile(batch_sizes=[1], warmup=0, iterations=1).to_dict()
    assert_same("profile", printed, returned)


def test_inspect():
    printed = cli_json("inspect", DIGITS_TOME_R4, "--r", "2")
    assert_same("inspect", printed, deploytk.inspect(DIGITS_TOME_R4, r=2).to_dict())
    assert printed["r"] == 2


def test_visualize(tmp_path, in_root):
    image = tmp_path / "digit.png"
    from PIL import Image

    Image.new("RGB", (32, 32), (200, 30, 90)).save(image)
    printed = cli_json("visualize", DIGITS_TOME_R4, "--image", image, "--output", tmp_path / "cli" / "merge.png")
    returned = deploytk.visualize(DIGITS_TOME_R4, image, output=tmp_path / "api" / "merge.png").to_dict()
    assert (printed["output"], returned["output"]) == (str(tmp_path / "cli" / "merge.png"), str(tmp_path / "api" / "merge.png"))
    assert printed["config"] == str(DIGITS_TOME_R4)  # the CLI's config object is named by its CONFIG path
    assert_same("visualize", printed, returned, tmp_path)


def test_methods():
    """`deploytk methods` prints deploytk/cli/methods.json (the registry imports torch; the command must not): the
    API's registry description, written by scripts/write_cli_methods.py."""
    assert_same("methods", cli_json("methods"), deploytk.methods().to_dict())


def test_families():
    assert_same("families", cli_json("families"), deploytk.families().to_dict())


def test_configs():
    assert_same("configs", cli_json("configs"), deploytk.configs().to_dict())
    assert_same("configs", cli_json("configs", "MCTF"), deploytk.configs("mctf").to_dict())


def test_calibrate(tmp_path, in_root):
    config = CONFIGS / "digits_vit_atm.yaml"
    printed = cli_json("calibrate", config, "--synthetic", 8, "--batch-size", 8, "--output", tmp_path / "cli" / "c.yaml")
    returned = deploytk.calibrate(config, synthetic=8, batch_size=8, output=tmp_path / "api" / "c.yaml").to_dict()
    assert (printed["output"], returned["output"]) == (str(tmp_path / "cli" / "c.yaml"), str(tmp_path / "api" / "c.yaml"))
    assert_same("calibrate", printed, returned, tmp_path)


def test_tune(tmp_path, in_root):
    """An impossible budget (one export, one run; exit 1 from the CLI, passed False from the API), both runs sharing
    the export cache: the JSON's shape and every value but the timings."""
    common = {"cache": tmp_path / "cache", "warmup": 0, "iterations": 1}
    flags = [f for k, v in common.items() for f in (f"--{k}", v)]
    printed = cli_json("tune", DIGITS_TOME_R4, "--budget-ms", 0.01, "--output", tmp_path / "cli" / "c.yaml", *flags, exit_code=1)
    returned = deploytk.tune(DIGITS_TOME_R4, 0.01, output=tmp_path / "api" / "c.yaml", **common)
    assert printed["outcome"] == "impossible" and not returned.passed
    assert printed["message"].startswith("no schedule meets 0.01 ms") and returned["message"].startswith("no schedule meets 0.01 ms")
    assert printed["command"].startswith(f"deploytk tune {DIGITS_TOME_R4} --budget-ms 0.01 ")
    assert returned["command"].startswith(f"deploytk.tune({str(DIGITS_TOME_R4)!r}, budget_ms=0.01, ")
    assert_same("tune", printed, returned.to_dict(), tmp_path)


def test_package(exported, tmp_path):
    source = exported("digits_vit_tome_r4")
    printed = cli_json("package", source, "--triton", tmp_path / "cli", "--name", "digits")
    returned = deploytk.load(source).package(tmp_path / "api", name="digits").to_dict()
    assert printed["repository"] == str(tmp_path / "cli") and returned["repository"] == str(tmp_path / "api")
    assert_same("package", printed, returned, tmp_path)


def test_eval(digits_tree, exported, in_root):
    root, _ = digits_tree
    artifact = exported("digits_vit_tome_r4")
    args = {"artifacts": artifact, "num_samples": 8, "batch_size": 4}
    printed = cli_json(
        "eval", DIGITS_TOME_R4, "--data", root / "val", *[f for k, v in args.items() for f in (f"--{k.replace('_', '-')}", v)]
    )
    returned = deploytk.evaluate(DIGITS_TOME_R4, root / "val", **args).to_dict()
    assert printed["num_images"] == 8 and printed["config"] == str(DIGITS_TOME_R4)
    assert_same("eval", printed, returned)


def test_doctor():
    assert_same("doctor", cli_json("doctor"), deploytk.doctor().to_dict())


def test_clean(tmp_path):
    """A killed run's temporary under two identical folders: the dry run lists it in both, the clean removes it."""
    for side in ("cli", "api"):
        (tmp_path / side / ".model.onnx.tmp-0123456789abcdef").mkdir(parents=True)
        (tmp_path / side / ".model.onnx.tmp-0123456789abcdef" / "part").write_bytes(b"x" * 10)
    for dry in (True, False):
        printed = cli_json("clean", tmp_path / "cli", *(["--dry-run"] if dry else []))
        returned = deploytk.clean(tmp_path / "api", dry_run=dry).to_dict()
        assert [e["state"] for e in printed["entries"]] == ["stale" if dry else "removed"]
        assert_same("clean", printed, returned, tmp_path)
    assert not any((tmp_path / "cli").iterdir()) and not any((tmp_path / "api").iterdir())


@pytest.mark.slow
def test_selftest():
    """In Triton's interpreter, set before Triton loads: both in a new process (~35 s each on the 2-core machine)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"}
    run = lambda *args: subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600)  # noqa: E731
    cli = run("-m", "deploytk", "selftest", "--json")
    api = run("-c", "import json, deploytk; print(json.dumps(deploytk.selftest().to_dict()))")
    assert cli.returncode == 0 and api.returncode == 0, cli.stderr + api.stderr
    assert_same("selftest", json.loads(cli.stdout), json.loads(api.stdout))


@pytest.mark.skipif(tensorrt_version() is not None, reason="TensorRT is installed: build would run, not refuse")
def test_build_refuses_as_the_api_does(exported):
    """Without TensorRT the CLI prints the API's refusal, word for word, and exits 2; nothing is written."""
    source = exported("digits_vit_tome_r4")
    before = sorted(p.name for p in source.iterdir())
    with pytest.raises(DeploytkError) as refused:
        deploytk.load(source).build()
    result = runner.invoke(app, ["build", str(source)])
    assert result.exit_code == 2 and result.stdout == ""
    assert " ".join(result.stderr.split()) == " ".join(f"error: {refused.value}".split())
    assert sorted(p.name for p in source.iterdir()) == before


def test_every_command_has_a_parity_test():
    """A new command needs its entry in DROPPED and a test here; `plugins compile` stays on deploytk_plugins.aot (a
    package of its own, below deploytk), not on deploytk.api."""
    commands = {c.name or c.callback.__name__ for c in app.registered_commands}
    assert commands == set(DROPPED) | {"build"}
    assert {c.name for c in app.registered_groups[0].typer_instance.registered_commands} == {"compile"}


def test_every_api_name_is_the_api_not_a_submodule():
    """Importing a submodule sets it on its package: a deploytk/doctor.py made ``deploytk.doctor`` that module, not the
    API's verb, once deploytk.api had loaded it (hence deploytk/diagnostics.py)."""
    import types

    import deploytk.api  # noqa: F401 (loads every library module the API uses)

    modules = sorted(name for name in deploytk.API if isinstance(getattr(deploytk, name), types.ModuleType))
    assert modules == []
