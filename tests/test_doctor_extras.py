"""`deploytk doctor` reports the pip extras (`deploytk[gpu]`, `[tensorrt]`, `[openvino]`, `[serve]`, ...): installed or not, versions."""

import json
import re
from importlib import metadata
from pathlib import Path

import pytest
from rich.table import Table
from rich.text import Text
from typer.testing import CliRunner

from deploytk import diagnostics as doctor  # deploytk.doctor is the API's verb
from deploytk.cli import app, render

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _name(requirement: str) -> str:
    """'tritonclient[grpc,http]>=2.73' -> 'tritonclient' (PEP 503 normalised)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group()).lower()


def test_doctors_extras_are_pyprojects():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {extra: [_name(r) for r in reqs] for extra, reqs in extras.items()} == {
        extra: list(packages) for extra, (packages, _) in doctor.EXTRAS.items()
    }
    assert {"gpu", "tensorrt", "openvino", "serve"} <= set(extras)


def test_doctor_json_says_which_extras_are_installed_with_versions():
    result = runner.invoke(app, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    extras = json.loads(result.stdout)["extras"]
    assert set(extras) == set(doctor.EXTRAS)
    for extra, info in extras.items():
        for name, version in info["packages"].items():
            try:
                expected = metadata.version(name)
            except metadata.PackageNotFoundError:
                expected = None
            if expected is not None or name != "tensorrt":  # tensorrt may be present as tensorrt-cu12/13 only
                assert version == expected, (extra, name)
        assert info["installed"] == all(info["packages"].values())
        assert info["install"] == f"pip install 'deploytk[{extra}]'"
    assert extras["openvino"]["installed"]  # the test extra brings openvino and tritonclient
    assert extras["serve"]["installed"] and extras["serve"]["packages"]["tritonclient"]


def test_missing_packages_are_named_with_the_install_command(monkeypatch):
    present = {"onnxruntime": "1.32.0", "onnxruntime-gpu": "1.31.1", "polygraphy": "0.53.6"}
    monkeypatch.setattr(doctor, "distribution_version", lambda name: present.get(name))
    report = doctor.extras_report()
    assert report["extras"]["gpu"] == {
        "installed": False,
        "packages": {"onnxruntime-gpu": "1.31.1", "triton": None},
        "for": doctor.EXTRAS["gpu"][1],
        "install": "pip install 'deploytk[gpu]'",
    }
    assert report["extras"]["tensorrt"]["packages"] == {"tensorrt": None, "polygraphy": "0.53.6"}
    assert "both installed" in report["extras_hint"]  # onnxruntime and onnxruntime-gpu share one module

    table = Table()
    table.add_column("what")
    table.add_column("value")
    render.doctor_extras(table, report)
    cells = zip(*(column._cells for column in table.columns), strict=True)
    rows = {Text.from_markup(what).plain: Text.from_markup(value).plain for what, value in cells}
    tensorrt = "not installed (pip install 'deploytk[tensorrt]'): tensorrt missing, polygraphy 0.53.6; for deploytk build"
    assert rows["deploytk[tensorrt]"].startswith(tensorrt)
    assert rows["deploytk[gpu]"].startswith("not installed (pip install 'deploytk[gpu]'): onnxruntime-gpu 1.31.1, triton missing")
    assert "onnxruntime and onnxruntime-gpu are both installed" in rows[""]


def test_tensorrt_installed_per_cuda_version_counts(monkeypatch):
    def version(name):
        if name == "tensorrt-cu12":
            return "10.13.0.35"
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(doctor.metadata, "version", version)
    assert doctor.distribution_version("tensorrt") == "10.13.0.35 (tensorrt-cu12)"
    assert doctor.distribution_version("openvino") is None
