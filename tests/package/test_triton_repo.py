"""`deploytk package --triton`: the repository's config parsed with Triton's own ModelConfig protobuf, the README's
client example run against the config, the TensorRT branch on a stand-in engine, and every refusal writing nothing."""

import hashlib
import json
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from deploytk.backends.engine_manifest import engine_manifest
from deploytk.build.options import BuildOptions
from deploytk.cli import app
from deploytk.exporter.artifacts import write_manifest

from helpers import export_config, seeded_init, snapshot
from helpers.media_models import TINY

model_config_pb2 = pytest.importorskip(
    "tritonclient.grpc.model_config_pb2", reason="tritonclient[grpc] (the `test` extra) is not installed: it has Triton's ModelConfig"
)
from google.protobuf import text_format  # noqa: E402  (tritonclient[grpc] brings it; checked above)
from tritonclient.utils import np_to_triton_dtype, triton_to_np_dtype  # noqa: E402

runner = CliRunner()
ENGINE_BYTES = b"stand-in for a serialized TensorRT engine"


def invoke(*args):
    return runner.invoke(app, ["package", *(str(a) for a in args)])


@pytest.fixture
def artifact(exported, tmp_path):
    """A copy of the shared digits ToMe export that a test may change, in a folder whose name has a space."""
    return exported.copy("digits_vit_tome_r4", tmp_path / "digits_tome r4")


def parse_config(model_dir: Path):
    return text_format.Parse((model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def tensors(config_tensors) -> list[tuple]:
    return [(t.name, model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in config_tensors]


def manifest_tensors(manifest: dict, kind: str) -> list[tuple]:
    """What Triton must be told: the manifest's names, Triton's own dtype for the numpy dtype, the shape after the batch axis."""
    out = []
    for t in manifest[kind]:
        assert isinstance(t["shape"][0], str)  # the dynamic batch axis Triton's max_batch_size stands for
        out.append((t["name"], "TYPE_" + np_to_triton_dtype(np.dtype(t["dtype"])), t["shape"][1:]))
    return out


def write_engine(directory: Path, batch=(1, 8, 32), **over) -> None:
    manifest = json.loads((directory / "manifest.json").read_text())
    record = engine_manifest(
        onnx_sha256=manifest["onnx"]["sha256"],
        tensorrt="10.13.0.35",
        gpu="NVIDIA H100 80GB HBM3",
        compute_capability="9.0",
        options=BuildOptions(batch=batch).model_dump(mode="json"),
        plugin_ops=["ProportionalAttention", "ToMeMatch", "TokenAggregate"],
        build_seconds=42.0,
        created="2026-11-25T00:00:00+00:00",
    )
    (directory / "model.engine").write_bytes(ENGINE_BYTES)
    (directory / "engine.json").write_text(json.dumps(record | over, indent=2))


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def test_onnx_repository_is_a_valid_triton_config_with_the_manifests_tensors(artifact, tmp_path):
    repo = tmp_path / "repo"
    result = invoke(artifact, "--triton", repo, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    model_dir = repo / "digits_tome_r4"  # the directory name, sanitised
    assert report["name"] == "digits_tome_r4" and report["model_dir"] == str(model_dir)
    assert files_under(repo) == ["digits_tome_r4", *(f"digits_tome_r4/{f}" for f in ("1", "1/model.onnx", "README.md", "config.pbtxt"))]

    manifest = json.loads((artifact / "manifest.json").read_text())
    assert hashlib.sha256((model_dir / "1" / "model.onnx").read_bytes()).hexdigest() == manifest["onnx"]["sha256"]
    config = parse_config(model_dir)
    assert (config.name, config.platform, config.backend) == ("digits_tome_r4", "onnxruntime_onnx", "onnxruntime")
    assert config.max_batch_size == 8  # the default for an ONNX model (its batch axis is dynamic)
    assert config.HasField("dynamic_batching") and config.dynamic_batching.max_queue_delay_microseconds == 100
    assert tensors(config.input) == manifest_tensors(manifest, "inputs") == [("input", "TYPE_FP32", [3, 32, 32])]
    assert tensors(config.output) == manifest_tensors(manifest, "outputs") == [("logits", "TYPE_FP32", [10])]
    assert not config.instance_group  # Triton places it: GPU where there is one, else CPU


def test_name_and_max_batch_options(artifact, tmp_path):
    repo = tmp_path / "repo"
    assert invoke(artifact, "--triton", repo, "--name", "vit.tome-r4", "--max-batch", 64).exit_code == 0
    config = parse_config(repo / "vit.tome-r4")
    assert config.name == "vit.tome-r4" and config.max_batch_size == 64


def run_readme_example(model_dir: Path, monkeypatch) -> dict:
    """The README's HTTP example run against a stand-in tritonclient that checks every name, shape and dtype it sends
    against the model's config.pbtxt (tests/serve runs it on a real server); returns what it sent, by input name."""
    readme = (model_dir / "README.md").read_text()
    config = parse_config(model_dir)
    inputs, outputs = {t.name: t for t in config.input}, {t.name: t for t in config.output}

    def datatype(t):  # the client's datatype string of a config tensor: TYPE_FP32 -> FP32
        return model_config_pb2.DataType.Name(t.data_type).removeprefix("TYPE_")

    sent = {}

    class InferInput:  # tritonclient.http's, checking what the example sends against the config
        def __init__(self, name, shape, dtype):
            assert name in inputs and dtype == datatype(inputs[name])
            assert 1 <= shape[0] <= config.max_batch_size and list(shape[1:]) == list(inputs[name].dims)
            self.name, self.shape, self.datatype = name, shape, dtype

        def set_data_from_numpy(self, array):
            assert array.dtype == triton_to_np_dtype(self.datatype) and list(array.shape) == list(self.shape)
            sent[self.name] = array

    class Result:
        def as_numpy(self, name):
            batch = next(iter(sent.values())).shape[0]
            return np.zeros((batch, *outputs[name].dims), dtype=triton_to_np_dtype(datatype(outputs[name])))

    class InferenceServerClient:
        def __init__(self, url):
            assert url == "localhost:8000"

        def infer(self, model_name, infer_inputs, outputs=None):
            assert model_name == config.name and [i.name for i in infer_inputs] == list(inputs)
            assert all(o.name in config_outputs for o in outputs)
            return Result()

    config_outputs = outputs
    http = types.ModuleType("tritonclient.http")
    http.InferInput, http.InferenceServerClient = InferInput, InferenceServerClient
    http.InferRequestedOutput = lambda name: types.SimpleNamespace(name=name)
    package = types.ModuleType("tritonclient")
    package.http = http
    monkeypatch.setitem(sys.modules, "tritonclient", package)
    monkeypatch.setitem(sys.modules, "tritonclient.http", http)
    http_example, grpc_example = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert grpc_example == http_example.replace("tritonclient.http as httpclient", "tritonclient.grpc as grpcclient").replace(
        "httpclient.", "grpcclient."
    ).replace("localhost:8000", "localhost:8001")
    exec(compile(http_example, "README example", "exec"), {})
    return sent


def test_readme_serves_and_requests_with_the_configs_names_shapes_and_dtypes(artifact, tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    assert invoke(artifact, "--triton", repo, "--name", "digits").exit_code == 0
    readme = (repo / "digits" / "README.md").read_text()
    assert "tritonserver --model-repository=/models" in readme and "nvcr.io/nvidia/tritonserver:" in readme
    assert "# your preprocessed images: (batch, channels, height, width) = (batch, 3, 32, 32)" in readme
    assert "# predicted class per image" in readme and "the model family's own eval transform to 32x32" in readme
    sent = run_readme_example(repo / "digits", monkeypatch)
    assert {name: a.shape for name, a in sent.items()} == {"input": (1, 3, 32, 32)}


#: name -> (the input config.pbtxt must name, what the README calls one sample, its axes after the batch, words its
#: preprocessing note must hold)
MEDIA = {
    "videomae": ("pixel_values", "clip", "frames, channels, height, width", "A clip gives 4 RGB frames at evenly spaced positions"),
    "ast": ("input_values", "sound", "time, mel", "makes 100 frames (padded or cut) of 48 log-mel filter banks"),
}


@pytest.mark.parametrize("name", list(MEDIA))
def test_a_video_or_audio_model_is_packaged_with_its_own_input_dims_and_request(exported, tmp_path, monkeypatch, name):
    """config.pbtxt's input is the kind's (VideoMAE: pixel_values [frames, 3, H, W]; AST: input_values [time, mel]), and
    the README's request sends that shape and speaks of clips or sounds, never images."""
    directory, repo = exported.tiny(name), tmp_path / "repo"  # the shared tiny export (helpers.media_models)
    before = snapshot(directory)
    result = invoke(directory, "--triton", repo, "--name", name, "--json")
    assert result.exit_code == 0, result.output
    assert snapshot(directory) == before  # package reads the artifact and writes only into the repository
    input_name, noun, axes, note = MEDIA[name]
    dims = list(TINY[name][3])
    manifest = json.loads((directory / "manifest.json").read_text())
    config = parse_config(repo / name)
    assert tensors(config.input) == manifest_tensors(manifest, "inputs") == [(input_name, "TYPE_FP32", dims)]
    assert tensors(config.output) == manifest_tensors(manifest, "outputs") == [("logits", "TYPE_FP32", [5])]
    assert json.loads(result.stdout)["inputs"] == [{"name": input_name, "dtype": "float32", "triton_dtype": "FP32", "dims": dims}]
    readme = (repo / name / "README.md").read_text()
    shape = ", ".join(map(str, dims))
    assert (
        readme.count(f"batch = np.zeros((1, {shape}), dtype=np.float32)  # your preprocessed {noun}s: (batch, {axes}) = (batch, {shape})")
        == 2
    )
    assert readme.count(f"# predicted class per {noun}") == 2 and note in readme
    assert "image" not in readme.lower() and "timm" not in readme
    sent = run_readme_example(repo / name, monkeypatch)
    assert {n: a.shape for n, a in sent.items()} == {input_name: (1, *dims)}


def test_a_video_models_ir_is_validated_on_clips_and_a_folder_without_clips_is_refused(exported, tmp_path):
    """`backend=openvino` with `data=`: a video model's IR is judged on the folder's clips (the report counts clips),
    and a folder of images for it is refused by what it lacks, before anything is written."""
    from helpers.media import write_clip  # PyAV, the [media] extra

    directory, clips, pictures = exported.tiny("videomae"), tmp_path / "clips", tmp_path / "pictures"
    clips.mkdir(), pictures.mkdir()
    for i in range(3):
        write_clip(clips / f"clip{i}.mp4", count=6 + i)
    (pictures / "frame.png").write_bytes(b"")  # an image, not a clip
    refused = invoke(directory, "--triton", tmp_path / "refused", "--backend", "openvino", "--data", pictures)
    assert refused.exit_code == 2 and f"clip folder {pictures} holds no clips (.avi, .mkv, .mov, .mp4, .webm)" in " ".join(
        refused.output.split()
    )
    assert not (tmp_path / "refused").exists()
    result = invoke(directory, "--triton", tmp_path / "repo", "--name", "videomae_ov", "--backend", "openvino", "--data", clips)
    assert result.exit_code == 0, result.output
    assert "(3 clips, max |diff|" in " ".join(result.output.split())
    config = parse_config(tmp_path / "repo" / "videomae_ov")
    assert config.backend == "openvino" and tensors(config.input) == [("pixel_values", "TYPE_FP32", [4, 3, 32, 32])]
    assert files_under(tmp_path / "repo" / "videomae_ov") == ["1", "1/model.bin", "1/model.xml", "README.md", "config.pbtxt"]


def test_tensorrt_repository_from_an_engine(artifact, tmp_path):
    write_engine(artifact, batch=(1, 8, 32))
    repo = tmp_path / "repo"
    result = invoke(artifact, "--triton", repo, "--name", "digits", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["tensorrt"] == "10.13.0.35" and report["engine_profile"] == [1, 8, 32]
    model_dir = repo / "digits"
    assert files_under(model_dir) == ["1", "1/model.plan", "README.md", "config.pbtxt"]
    assert (model_dir / "1" / "model.plan").read_bytes() == ENGINE_BYTES
    config = parse_config(model_dir)
    assert (config.platform, config.backend, config.max_batch_size) == ("tensorrt_plan", "tensorrt", 32)  # the profile's max
    assert config.HasField("dynamic_batching")
    assert [(g.kind, g.count) for g in config.instance_group] == [(model_config_pb2.ModelInstanceGroup.KIND_GPU, 1)]
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert tensors(config.input) == manifest_tensors(manifest, "inputs")
    assert tensors(config.output) == manifest_tensors(manifest, "outputs")
    readme = " ".join((model_dir / "README.md").read_text().split())
    assert "the same TensorRT version the engine was built with: TensorRT 10.13.0.35" in readme
    assert "needs no plugin library" in readme and "compute capability 9.0" in readme

    assert invoke(artifact, "--triton", repo, "--name", "smaller", "--max-batch", 16).exit_code == 0
    assert parse_config(repo / "smaller").max_batch_size == 16


def _hash_mismatch(art):
    with open(art / "model.onnx", "ab") as f:
        f.write(b"\0")


def _renamed_input(art):
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["inputs"][0]["name"] = "pixels"
    write_manifest(art, manifest)  # sealed again: the edit is what is tested


def _unsealed_edit(art):
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["config"]["merge"]["prop_attn"] = False  # what a user tried: the graph still has proportional attention
    (art / "manifest.json").write_text(json.dumps(manifest))


BAD = {
    "not an artifact": (lambda art: (art / "manifest.json").unlink(), [], "is not a deploytk artifact directory"),
    "onnx changed after export": (_hash_mismatch, [], "does not match its manifest"),
    "manifest inputs edited": (_renamed_input, [], "does not describe model.onnx's graph"),
    "manifest edited by hand": (_unsealed_edit, [], "manifest.json was edited after deploytk wrote it"),
    "engine from another onnx": (lambda art: write_engine(art, onnx_sha256="0" * 64), [], "built from a different model.onnx"),
    "engine without engine.json": (
        lambda art: (art / "model.engine").write_bytes(ENGINE_BYTES),
        [],
        "has model.engine but no engine.json",
    ),
    "engine.json without engine": (
        lambda art: (write_engine(art), (art / "model.engine").unlink()),
        [],
        "has engine.json but no model.engine",
    ),
    "engine.json without TensorRT version": (lambda art: write_engine(art, tensorrt=None), [], "does not record the TensorRT version"),
    "engine profile not from batch 1": (lambda art: write_engine(art, batch=(2, 8, 32)), [], "built for batches 2..32"),
    "max batch above the engine profile": (
        lambda art: write_engine(art, batch=(1, 8, 32)),
        ["--max-batch", "64"],
        "--max-batch 64 exceeds the TensorRT engine's optimisation profile (batch up to 32)",
    ),
    "max batch below 1": (lambda art: None, ["--max-batch", "0"], "--max-batch 0: must be an int >= 1"),
    "unusable name": (lambda art: None, ["--name", "../up"], "is not a usable Triton model name"),
    "unknown runtime": (
        lambda art: None,
        ["--backend", "tensorflow"],
        "--backend 'tensorflow': the runtimes deploytk packages for Triton are",
    ),
    "tensorrt without an engine": (lambda art: None, ["--backend", "trt"], "--backend trt: "),
    "images without openvino": (lambda art: None, ["--data", "."], "--data is for --backend openvino"),
}


@pytest.mark.parametrize("repo_exists", [True, False], ids=["existing repo", "new repo"])
@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_refused_and_nothing_is_written(artifact, tmp_path, case, repo_exists):
    spoil, args, message = BAD[case]
    spoil(artifact)
    repo = tmp_path / "repo"
    if repo_exists:
        (repo / "other" / "1").mkdir(parents=True)
        (repo / "other" / "config.pbtxt").write_text('name: "other"\n')
    before = files_under(repo)
    result = invoke(artifact, "--triton", repo, *args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()) and "Traceback" not in result.output
    assert files_under(repo) == before  # nothing new, not even temp directories
    assert repo.exists() == repo_exists


def test_an_earlier_model_is_replaced_only_with_force_and_a_user_s_folder_never(artifact, tmp_path):
    repo = tmp_path / "repo"
    (repo / "mine" / "1").mkdir(parents=True)
    (repo / "mine" / "config.pbtxt").write_text("mine\n")  # another tool's model folder
    for force in ([], ["--force"]):
        result = invoke(artifact, "--triton", repo, "--name", "mine", *force)
        assert result.exit_code == 2 and "is a folder holding files deploytk did not write (config.pbtxt)" in " ".join(
            result.output.split()
        )
    assert (repo / "mine" / "config.pbtxt").read_text() == "mine\n"
    assert invoke(artifact, "--triton", repo, "--name", "digits").exit_code == 0
    result = invoke(artifact, "--triton", repo, "--name", "digits")
    assert result.exit_code == 2 and "already exists (an earlier deploytk Triton model folder)" in " ".join(result.output.split())
    assert "--force" in result.output
    (repo / "digits" / "notes.txt").write_text("mine")
    assert invoke(artifact, "--triton", repo, "--name", "digits", "--force").exit_code == 0
    assert parse_config(repo / "digits").name == "digits"
    assert files_under(repo / "digits") == ["1", "1/model.onnx", "README.md", "config.pbtxt", "notes.txt"]
    assert (repo / "digits" / "notes.txt").read_text() == "mine"


def test_openvino_repository_is_an_ir_with_stable_topk_validated_before_it_is_written(artifact, tmp_path):
    repo = tmp_path / "repo"
    result = invoke(artifact, "--triton", repo, "--name", "digits_ov", "--backend", "openvino", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    model_dir = repo / "digits_ov"
    assert files_under(model_dir) == ["1", "1/model.bin", "1/model.xml", "README.md", "config.pbtxt"]
    config = parse_config(model_dir)
    assert (config.name, config.platform, config.backend, config.max_batch_size) == ("digits_ov", "", "openvino", 8)
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert tensors(config.input) == manifest_tensors(manifest, "inputs") and tensors(config.output) == manifest_tensors(manifest, "outputs")
    assert not config.instance_group  # the openvino backend runs on the CPU
    validation = report["validation"]
    assert validation["passed"] and validation["num_images"] == 64 and validation["top1_agreement"] == 1.0
    assert validation["max_abs_diff"] < 1e-4
    xml = (model_dir / "1" / "model.xml").read_text()
    assert validation["stable_topk"] == xml.count('type="TopK"') == xml.count('stable="true"') > 0  # ties as ONNX and PyTorch break them
    readme = " ".join((model_dir / "README.md").read_text().split())
    assert "backend openvino, max_batch_size 8" in readme and "every TopK made stable" in readme


@pytest.fixture(scope="module")
def other_export(tmp_path_factory):
    """The digits ToMe config on seeded random weights: the same graph, shapes and tensor names, other outputs."""
    import timm
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("export")
    model = timm.create_model("vit_tiny_patch16_224", patch_size=4, embed_dim=96, num_heads=3, num_classes=10, img_size=32)
    save_file(seeded_init(model, seed=7).state_dict(), folder / "random.safetensors")
    return export_config("digits_vit_tome_r4", folder / "digits_random", checkpoint=str(folder / "random.safetensors"))


def _damaged_write_ir(monkeypatch, damage):
    from deploytk.backends.openvino_backend import OpenVinoBackend

    write_ir = OpenVinoBackend.write_ir

    def damaged(self, art, xml):
        return damage(write_ir, self, art, xml)

    monkeypatch.setattr(OpenVinoBackend, "write_ir", damaged)


def _scrambled(write_ir, backend, art, xml):  # the IR's weights file shuffled: OpenVINO cannot even read it
    written = write_ir(backend, art, xml)
    weights = np.fromfile(xml.with_suffix(".bin"), dtype=np.uint8)
    np.random.default_rng(0).shuffle(weights)
    weights.tofile(xml.with_suffix(".bin"))
    return written


@pytest.mark.parametrize("damage", ["another model's IR", "scrambled weights"])
def test_an_ir_that_fails_validation_is_refused_and_nothing_is_written(artifact, other_export, tmp_path, monkeypatch, damage):
    """What a faulty conversion could hand over: an IR that runs but computes something else, or one OpenVINO cannot read."""
    from deploytk.exporter.artifacts import Artifact

    if damage == "another model's IR":  # same inputs and outputs, different model
        _damaged_write_ir(monkeypatch, lambda write_ir, backend, art, xml: write_ir(backend, Artifact.open(other_export), xml))
        message = "fails validation against the PyTorch reference"
    else:
        _damaged_write_ir(monkeypatch, _scrambled)
        message = "could not be validated against the PyTorch reference"
    repo = tmp_path / "repo"
    result = invoke(artifact, "--triton", repo, "--name", "digits_ov", "--backend", "openvino")
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "the OpenVINO IR of" in text and message in text and "nothing was written" in text and "Traceback" not in text
    assert not repo.exists()


def test_runtime_onnxruntime_packages_the_onnx_even_beside_an_engine(artifact, tmp_path):
    write_engine(artifact)
    repo = tmp_path / "repo"
    assert invoke(artifact, "--triton", repo, "--name", "digits", "--backend", "ort").exit_code == 0
    assert files_under(repo / "digits") == ["1", "1/model.onnx", "README.md", "config.pbtxt"]
    assert parse_config(repo / "digits").backend == "onnxruntime"


def test_openvino_refuses_a_bf16_export_with_the_reason_and_writes_nothing(exported, tmp_path):
    bf16 = exported("digits_vit_tome_r4_bf16")
    result = invoke(bf16, "--triton", tmp_path / "repo", "--backend", "openvino")
    assert result.exit_code == 2, result.output
    assert "is a bf16 graph, which OpenVINO's CPU plugin cannot run as the graph says" in " ".join(result.output.split())
    assert not (tmp_path / "repo").exists()
