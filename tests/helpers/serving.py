"""The serving tests' pieces: what `deploytk package` writes for the served models, the server as a deploytk Backend."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from deploytk.backends import Backend, LoadedModel
from deploytk.progress import SILENT
from serving.tritonserver import ServeEnvironment, TritonServer

#: the models of the shared repository: name -> (export, package options); videomae: a video model's pixel_values
#: [batch, frames, 3, H, W], ast: an audio model's input_values [batch, time, mel], through the same server
SERVED = {
    "digits": ("digits", []),
    "digits_ov": ("digits", ["--backend", "openvino"]),
    "deit_s": ("deit", []),
    "videomae": ("videomae", []),
    "ast": ("ast", []),
}
#: the exports behind them: key -> shipped config
SERVED_EXPORTS = {"digits": "digits_vit_tome_r4", "deit": "deit_small_tome_r16"}
#: the exports that are no shipped config: key -> helpers.media_models' tiny model (made from its config, ToMe r=4)
SERVED_TINY = {"videomae": "videomae", "ast": "ast"}


def package(directory: Path, repository: Path, name: str, *options) -> None:
    from deploytk.cli import app

    result = CliRunner().invoke(app, ["package", str(directory), "--triton", str(repository), "--name", name, *options])
    assert result.exit_code == 0, result.output


def start(repository: Path, environment: ServeEnvironment) -> TritonServer:
    return TritonServer(repository, environment).start()


class ServedModel(LoadedModel):
    """A model behind the server, run over gRPC: each batch one request, as a client sends it."""

    def __init__(self, url: str, model: str, input_name: str, output_names: list[str]):
        import tritonclient.grpc as grpcclient  # the `test` extra

        self.grpc = grpcclient
        self.client = grpcclient.InferenceServerClient(url)
        self.model, self.input_name, self.output_names = model, input_name, output_names

    def run(self, batch):
        request = self.grpc.InferInput(self.input_name, list(batch.shape), "FP32")
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
