"""The serving tests' server: a real `tritonserver` (serving/tritonserver.py) on a repository `deploytk package` wrote.

Without the serving environment (.venv-serve, `make serve-env`) the tests skip, saying so; under `make test` (CI)
DEPLOYTK_REQUIRE_SERVER=1 turns that skip into a failure, so CI never passes without having served."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import export_config
from typer.testing import CliRunner

from deploytk.backends import Backend, LoadedModel
from deploytk.cli import app
from deploytk.progress import SILENT
from serving.tritonserver import ServeEnvironment, ServerError, TritonServer

grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc,http] (the `test` extra) is not installed")
httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[grpc,http] (the `test` extra) is not installed")

#: the models of the shared repository: name -> (export fixture, package options)
SERVED = {"digits": ("digits", []), "digits_ov": ("digits", ["--runtime", "openvino"]), "deit_s": ("deit", [])}


def package(directory: Path, repository: Path, name: str, *options) -> None:
    result = CliRunner().invoke(app, ["package", str(directory), "--triton", str(repository), "--name", name, *options])
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="session")
def serve_environment() -> ServeEnvironment:
    try:
        return ServeEnvironment.find()
    except ServerError as e:
        if os.environ.get("DEPLOYTK_REQUIRE_SERVER"):
            pytest.fail(f"the serving tests must run here (DEPLOYTK_REQUIRE_SERVER is set): {e}")
        pytest.skip(f"no serving environment: {e}")


@pytest.fixture(scope="session")
def exports(tmp_path_factory) -> dict[str, Path]:
    """The digits ToMe r=4 export (trained weights) and DeiT-S ToMe r=16 (random weights)."""
    root = tmp_path_factory.mktemp("serve-exports")
    return {"digits": export_config("digits_vit_tome_r4", root / "digits"), "deit": export_config("deit_small_tome_r16", root / "deit")}


@pytest.fixture(scope="session")
def repository(exports, tmp_path_factory) -> Path:
    """What `deploytk package` wrote for the three served models, unchanged."""
    repo = tmp_path_factory.mktemp("serve-repo")
    for name, (export, options) in SERVED.items():
        package(exports[export], repo, name, *options)
    return repo


class ServedModel(LoadedModel):
    """A model behind the server, run over gRPC: each batch one request, as a client sends it."""

    def __init__(self, url: str, model: str, input_name: str, output_names: list[str]):
        self.client = grpcclient.InferenceServerClient(url)
        self.model, self.input_name, self.output_names = model, input_name, output_names

    def run(self, batch):
        request = grpcclient.InferInput(self.input_name, list(batch.shape), "FP32")
        request.set_data_from_numpy(np.ascontiguousarray(batch, dtype=np.float32))
        result = self.client.infer(self.model, [request])
        return {name: result.as_numpy(name) for name in self.output_names}

    def timer(self, batch_size):
        raise NotImplementedError("the load benchmark times the server (benchmarks/triton_load.py)")

    def settings(self) -> dict:
        return {"served_by": "tritonserver", "model": self.model}


class ServedBackend(Backend):
    """The server as a deploytk Backend, so that `deploytk validate`'s own comparison judges what it serves."""

    name = "triton-server"
    display_name = "Triton Inference Server"
    runs_onnx = False  # no probes: every image must agree with the reference on its own

    def __init__(self, url: str, model: str):
        self.url, self.model = url, model

    def device(self) -> str:
        return "cpu"

    def load(self, artifact, batch_sizes, graph=None, progress=SILENT):
        return ServedModel(self.url, self.model, artifact.manifest["inputs"][0]["name"], artifact.output_names)

    def load_for_timing(self, artifact, batch_sizes, progress=SILENT):
        raise NotImplementedError


@pytest.fixture
def fresh_copy(tmp_path):
    """A copy of a repository folder that a test may damage or serve alone."""

    def copy(source: Path, *names: str) -> Path:
        target = tmp_path / "repo"
        target.mkdir()
        for name in names:
            shutil.copytree(source / name, target / name)
        return target

    return copy


def start(repository: Path, environment: ServeEnvironment) -> TritonServer:
    return TritonServer(repository, environment).start()
