"""`deploytk package` into a repository (`triton=REPO`): a Triton Inference Server model repository for an artifact.

The repository is one model directory, written atomically::

    REPO/NAME/config.pbtxt       platform/backend, max_batch_size, inputs/outputs, dynamic batching
    REPO/NAME/1/model.onnx       ONNX Runtime backend: the function-bodied ONNX runs as is
          or 1/model.plan        TensorRT backend, when DIR has model.engine + engine.json
          or 1/model.xml + .bin  OpenVINO backend (`backend=openvino`): the IR, validated against the reference first
    REPO/NAME/README.md          the server command and tritonclient requests (HTTP and gRPC)

Names, dtypes and dims come from the manifest, checked against model.onnx's graph; the batch
axis (dynamic in every export) becomes Triton's implicit batch dimension. A TensorRT engine is
taken only when engine.json says it was built from this model.onnx, and its optimisation
profile bounds ``max_batch_size``. An OpenVINO IR is written by the openvino backend (every TopK stable) to a
scratch folder and validated there against the PyTorch reference with the artifact's default tolerances; only an IR
that passes goes into the repository. The config is written as protobuf text by hand (tritonclient,
which has Triton's ModelConfig protobuf, is an optional dependency); the tests parse it with
that protobuf.
"""

from __future__ import annotations

import importlib.resources
import re
import shutil
import string
import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnx

from deploytk.backends.engine_manifest import onnx_mismatch, read_engine_manifest
from deploytk.backends.openvino_backend import OpenVinoBackend
from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import ENGINE_FILE, ENGINE_MANIFEST_FILE, Artifact
from deploytk.exporter.onnx_io import data_file_name
from deploytk.files import DirectoryKind, claim_directory
from deploytk.progress import SILENT, Progress
from deploytk.validate.validator import run_validation

CONFIG_FILE = "config.pbtxt"
README_FILE = "README.md"
VERSION_DIR = "1"
#: max_batch_size of an ONNX model when `max_batch=` is not given: the largest batch `profile` measures by
#: default; the exported graph's batch axis is dynamic, so any value works (larger: more throughput, more memory)
DEFAULT_ONNX_MAX_BATCH = 8
#: how long the dynamic batcher may hold a request to fill a batch
QUEUE_DELAY_US = 100
#: manifest dtype -> Triton's tensor datatype (the config's TYPE_<it>, the client's datatype string)
TRITON_DTYPES = {
    "float32": "FP32",
    "float16": "FP16",
    "bfloat16": "BF16",
    "float64": "FP64",
    "int64": "INT64",
    "int32": "INT32",
    "int16": "INT16",
    "int8": "INT8",
    "uint8": "UINT8",
    "bool": "BOOL",
}
_NAME_OK = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_ONNX_RUNTIME = {"platform": "onnxruntime_onnx", "backend": "onnxruntime", "file": "model.onnx"}
_TENSORRT = {"platform": "tensorrt_plan", "backend": "tensorrt", "file": "model.plan"}
#: Triton's openvino backend has no platform name; it loads model.xml (and model.bin beside it) and needs a full config
_OPENVINO = {"platform": None, "backend": "openvino", "file": "model.xml", "weights": "model.bin"}
#: `backend=`: deploytk's runtime names -> Triton's backends
TRITON_RUNTIMES = {"ort": _ONNX_RUNTIME, "openvino": _OPENVINO, "trt": _TENSORRT}
#: the model folder's README.md (string.Template: $-placeholders filled by _readme)
README_TEMPLATE = string.Template((importlib.resources.files("deploytk") / "templates" / "triton_model_README.md").read_text())
#: config.pbtxt's first line: how a later `package` knows the model folder is deploytk's
CONFIG_HEADER = "# written by `deploytk package`; Triton's model configuration (protobuf text format)"


def _model_files(folder: Path) -> set[str] | None:
    """The files `package` writes in a model folder, if ``folder`` is one it wrote (its config.pbtxt says so)."""
    try:
        with (folder / CONFIG_FILE).open() as f:
            if f.readline().rstrip("\n") != CONFIG_HEADER:
                return None
    except (OSError, UnicodeDecodeError):
        return None
    written = {f"{VERSION_DIR}/{r[key]}" for r in TRITON_RUNTIMES.values() for key in ("file", "weights") if key in r}
    return {CONFIG_FILE, README_FILE, *written, f"{VERSION_DIR}/{data_file_name(_ONNX_RUNTIME['file'])}"}


#: a model folder in a Triton repository; an earlier one is replaced only with `force=True` (a server may be loading it)
TRITON_MODEL = DirectoryKind("deploytk Triton model folder", CONFIG_FILE, _model_files, replace_needs_force=True)


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output as Triton sees it: ``dims`` without the batch axis."""

    name: str
    dtype: str  # the manifest's numpy name, e.g. float32
    dims: tuple[int, ...]

    @property
    def triton_dtype(self) -> str:
        return TRITON_DTYPES[self.dtype]

    def to_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "triton_dtype": self.triton_dtype, "dims": list(self.dims)}


def package_triton(
    directory: Path,
    repository: Path,
    name: str | None = None,
    max_batch: int | None = None,
    force: bool = False,
    progress: Progress = SILENT,
    backend: str | None = None,
    data: Path | None = None,
) -> dict:
    """Write REPO/NAME (config.pbtxt, 1/model.onnx, 1/model.plan or 1/model.xml + .bin, README.md); every check, and the
    IR's validation, runs before anything is written. ``backend``: the runtime Triton serves it with, ort, openvino or trt
    (Triton's onnxruntime, openvino or tensorrt backend; default: trt when DIR has an engine, else ort). ``data``: a
    folder of the artifact's input kind (images, clips or sounds) the IR is validated
    on (an int8 IR needs samples like its calibration data; default: seeded synthetic samples). The config's dims and the
    README's request follow the manifest's input, whatever its kind."""
    wanted = TRITON_RUNTIMES.get(backend) if backend is not None else None
    if data is not None and wanted is not _OPENVINO:
        raise DeploytkError(
            "`data=` is for `backend=openvino`: the images (a video model's clips, an audio model's sounds) the IR is validated "
            "on before it is written."
        )
    if max_batch is not None and max_batch < 1:
        raise DeploytkError(f"`max_batch={max_batch}`: must be an int >= 1 (Triton's max_batch_size for a batching model).")
    if backend is not None and wanted is None:
        raise DeploytkError(f"`backend={backend!r}`: the runtimes deploytk packages for Triton are {', '.join(TRITON_RUNTIMES)}.")
    progress.step("checking the artifact")
    artifact = Artifact.open(directory)  # model.onnx must match its manifest's sha256
    if data is not None:
        artifact.input_kind.files(data, 1, "data")  # a missing folder, or one without samples, is refused before any work
    model_name = _model_name(name, artifact.directory)
    repository = Path(repository)
    with claim_directory(repository / model_name, TRITON_MODEL, option="`triton=`/`name=`", force=force) as target:
        inputs, outputs = _io_specs(artifact)
        engine = _engine_record(artifact) if wanted in (None, _TENSORRT) else None
        if wanted is _TENSORRT and engine is None:
            raise DeploytkError(
                f"`backend={backend}`: {artifact.directory} has no TensorRT engine.", hint=f"Build one with `deploytk build {directory}`."
            )
        chosen = wanted or (_TENSORRT if engine else _ONNX_RUNTIME)
        if chosen is _OPENVINO:
            artifact.require_runtime("package with `backend=openvino` (Triton's openvino backend)", ("openvino",))
        else:  # an int8 OpenVINO IR is not model.onnx
            artifact.require_runtime(f"package (Triton's {chosen['backend']} backend)", ("ort", "trt"))
        max_batch_size = _max_batch_size(max_batch, engine)

        with tempfile.TemporaryDirectory(prefix="deploytk-package-") as scratch:
            ir = validation = None
            if chosen is _OPENVINO:
                ir, validation = _validated_ir(artifact, Path(scratch) / _OPENVINO["file"], data, progress)
            sources = {chosen["file"]: ir or (artifact.directory / ENGINE_FILE if engine else artifact.onnx_path)}
            if ir is not None:
                sources[_OPENVINO["weights"]] = ir.with_suffix(".bin")
            data = artifact.manifest["onnx"].get("external_data")
            if (
                data and chosen is _ONNX_RUNTIME
            ):  # the weights of a model past protobuf's 2 GiB limit, beside it under the name it references
                sources[data["file"]] = artifact.directory / data["file"]
            config = config_pbtxt(model_name, chosen, max_batch_size, inputs, outputs, gpu=engine is not None)
            readme = _readme(artifact, model_name, chosen, max_batch_size, inputs, outputs, engine)
            progress.step(f"writing {target.path}")
            with target.write() as tmp:  # a repository made for this model goes again if the write fails
                (tmp / VERSION_DIR).mkdir()
                for file, source in sources.items():
                    shutil.copyfile(source, tmp / VERSION_DIR / file)
                (tmp / CONFIG_FILE).write_text(config)
                (tmp / README_FILE).write_text(readme)
        return {
            "repository": str(repository),
            "name": model_name,
            "model_dir": str(target.path),
            "artifact": str(artifact.directory),
            "backend": chosen["backend"],
            "platform": chosen["platform"],
            "model_file": f"{VERSION_DIR}/{chosen['file']}",
            # what the model file is: a copy of this file, or (the IR) written from it
            "source": str(artifact.ir_path or artifact.inlined_path or artifact.onnx_path) if ir else str(sources[chosen["file"]]),
            "max_batch_size": max_batch_size,
            "dynamic_batching": {"max_queue_delay_microseconds": QUEUE_DELAY_US},
            "inputs": [t.to_dict() for t in inputs],
            "outputs": [t.to_dict() for t in outputs],
            "tensorrt": engine["tensorrt"] if engine else None,
            "engine_profile": engine["build"]["batch"] if engine else None,
            "gpu": engine.get("gpu") if engine else None,
            "compute_capability": engine.get("compute_capability") if engine else None,
            "files": [CONFIG_FILE, *(f"{VERSION_DIR}/{f}" for f in sources), README_FILE],
            "validation": validation,
        }


def _validated_ir(artifact: Artifact, xml: Path, data: Path | None, progress: Progress) -> tuple[Path, dict]:
    """The artifact as an OpenVINO IR at ``xml``, run by OpenVINO from that file against the PyTorch reference (64 of
    ``data``, else 64 seeded synthetic inputs; the artifact's default tolerances, as `deploytk validate` with
    `backend=openvino` and this ``data``); a failure is a refusal."""
    progress.step("writing the OpenVINO IR (every TopK stable)")
    try:  # a missing OpenVINO is a DeploytkError with the install command, passed on as is
        written = OpenVinoBackend().write_ir(artifact, xml)
    except RuntimeError as e:  # OpenVINO's own errors are RuntimeErrors
        raise DeploytkError(f"OpenVINO could not convert {artifact.directory} to an IR ({_last_line(e)}); nothing was written.") from None
    progress.step("validating the IR against the PyTorch reference")
    try:
        report, _ = run_validation(artifact.directory, OpenVinoBackend(ir=xml), data=data, progress=progress)
    except (RuntimeError, DeploytkError) as e:  # reading, compiling or running the IR; the reference's replay of its choices
        raise DeploytkError(
            f"the OpenVINO IR of {artifact.directory} could not be validated against the PyTorch reference ({_last_line(e)}); "
            "nothing was written.",
            hint=f"Validate {artifact.directory} with `backend=openvino` to see whether the export itself runs on OpenVINO.",
        ) from None
    summary = {
        "passed": report.passed,
        "checks": report.checks,
        "num_images": report.num_images,
        "samples": artifact.input_kind.nouns,  # what num_images counts: images, clips or sounds
        "images": str(data) if data else "synthetic",
        "max_abs_diff": report.max_abs_diff,
        **({"top1_agreement": report.top1_agreement} if report.top1_agreement is not None else {}),
        **written,
    }
    if not report.passed:
        failed = [name for name, ok in report.checks.items() if not ok]
        raise DeploytkError(
            f"the OpenVINO IR of {artifact.directory} fails validation against the PyTorch reference ({'; '.join(failed)}); "
            "nothing was written.",
            hint=f"Validate {artifact.directory} with `backend=openvino`{f' and `data={data}`' if data else ''} for the full report."
            + ("" if data or not artifact.quantization else " An int8 IR is judged on inputs like its calibration data: pass `data=`."),
        )
    return xml, summary


def _last_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[-1] if lines else type(error).__name__


def sanitize_model_name(text: str) -> str:
    """A Triton model (directory) name from ``text``: letters, digits, '_', '.', '-'; anything else becomes '_'."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", text).lstrip(".-")
    return cleaned or "model"


def _model_name(name: str | None, directory: Path) -> str:
    if name is None:
        return sanitize_model_name(directory.resolve().name)
    if not _NAME_OK.match(name):
        raise DeploytkError(
            f"`name={name!r}` is not a usable Triton model name: it becomes a directory and the name clients call, "
            "so it may hold only letters, digits, '_', '.' and '-', and must not start with '.' or '-'.",
            hint=f"For example `name={sanitize_model_name(name)}`.",
        )
    return name


def _io_specs(artifact: Artifact) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The manifest's inputs and outputs, batch axis dropped, after checking them against model.onnx's graph."""
    manifest = artifact.manifest
    specs = {}
    for kind in ("inputs", "outputs"):
        entries = manifest.get(kind)
        if not isinstance(entries, list) or not entries:
            raise DeploytkError(f"{artifact.directory}/manifest.json has no {kind} list.", hint="Re-run `deploytk export`.")
        specs[kind] = [_tensor_spec(artifact, kind, entry) for entry in entries]
    _check_against_graph(artifact, specs)
    return specs["inputs"], specs["outputs"]


def _tensor_spec(artifact: Artifact, kind: str, entry: dict) -> TensorSpec:
    where = f"{artifact.directory}/manifest.json {kind}"
    try:
        name, dtype, shape = entry["name"], entry["dtype"], list(entry["shape"])
    except (KeyError, TypeError):
        raise DeploytkError(f"{where}: an entry lacks name, dtype or shape ({entry!r}).", hint="Re-run `deploytk export`.") from None
    if dtype not in TRITON_DTYPES:
        raise DeploytkError(f"{where} {name!r}: dtype {dtype!r} has no Triton datatype here (known: {', '.join(TRITON_DTYPES)}).")
    if not shape or not isinstance(shape[0], str):
        raise DeploytkError(
            f"{where} {name!r}: shape {shape} has no dynamic batch axis first; Triton's batching needs one.",
            hint="Re-run `deploytk export` (exports have a dynamic 'batch' axis).",
        )
    dims = shape[1:]
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims):
        raise DeploytkError(f"{where} {name!r}: shape {shape} must be the batch axis followed by fixed sizes >= 1.")
    return TensorSpec(name, dtype, tuple(dims))


def _check_against_graph(artifact: Artifact, specs: dict[str, list[TensorSpec]]) -> None:
    """The manifest says what model.onnx's graph says (model.onnx is hash-checked; the manifest's I/O lists are not)."""
    graph = onnx.load(str(artifact.onnx_path), load_external_data=False).graph
    initializers = {t.name for t in graph.initializer}
    actual = {
        "inputs": [v for v in graph.input if v.name not in initializers],
        "outputs": list(graph.output),
    }
    problems = []
    for kind in ("inputs", "outputs"):
        graph_io = [(v.name, _onnx_dtype(v), _onnx_shape(v)) for v in actual[kind]]
        same = len(graph_io) == len(specs[kind]) and all(
            name == t.name and dtype == t.dtype and shape and isinstance(shape[0], str) and tuple(shape[1:]) == t.dims
            for (name, dtype, shape), t in zip(graph_io, specs[kind], strict=True)
        )
        if not same:
            problems.append(f"{kind}: manifest {_describe(specs[kind])}, model.onnx {_describe_graph(graph_io)}")
    if problems:
        raise DeploytkError(
            f"{artifact.directory}/manifest.json does not describe model.onnx's graph ({'; '.join(problems)}).",
            hint="Re-run `deploytk export` to regenerate both.",
        )


def _onnx_dtype(value: onnx.ValueInfoProto) -> str:
    elem = value.type.tensor_type.elem_type
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem).name
    except (KeyError, ValueError, TypeError):
        return f"onnx-type-{elem}"


def _onnx_shape(value: onnx.ValueInfoProto) -> list:
    return [d.dim_param or (d.dim_value if d.HasField("dim_value") else "?") for d in value.type.tensor_type.shape.dim]


def _describe(specs: list[TensorSpec]) -> str:
    return ", ".join(f"{t.name} {t.dtype} [batch, {', '.join(map(str, t.dims))}]" for t in specs)


def _describe_graph(io: list[tuple]) -> str:
    return ", ".join(f"{n} {d} {s}" for n, d, s in io)


def _engine_record(artifact: Artifact) -> dict | None:
    """engine.json when DIR has a TensorRT engine built from this model.onnx; None when it has none; else a refusal."""
    directory = artifact.directory
    has_engine, has_record = (directory / ENGINE_FILE).is_file(), (directory / ENGINE_MANIFEST_FILE).is_file()
    if not has_engine and not has_record:
        return None
    if has_engine != has_record:
        present, missing = (ENGINE_FILE, ENGINE_MANIFEST_FILE) if has_engine else (ENGINE_MANIFEST_FILE, ENGINE_FILE)
        raise DeploytkError(
            f"{directory} has {present} but no {missing}, so the engine cannot be matched to model.onnx.",
            hint=f"Rebuild it with `deploytk build {directory}`, or remove {present} to package the ONNX model.",
        )
    record = read_engine_manifest(directory)
    if not isinstance(record, dict):
        raise DeploytkError(f"{directory / ENGINE_MANIFEST_FILE} is not a JSON object.", hint=f"Rebuild with `deploytk build {directory}`.")
    reasons = []
    if record.get("format") != "deploytk-engine/1":
        reasons.append(f"its format is {record.get('format')!r}, not 'deploytk-engine/1'")
    if mismatch := onnx_mismatch(record, artifact.manifest["onnx"]["sha256"]):
        reasons.append(mismatch)
    if not (isinstance(record.get("tensorrt"), str) and record["tensorrt"]):
        reasons.append("it does not record the TensorRT version it was built with")
    build = record.get("build")
    batch = build.get("batch") if isinstance(build, dict) else None
    if not _is_profile(batch):
        reasons.append(f"its batch profile {batch!r} is not [min, opt, max] with 1 <= min <= opt <= max")
    if reasons:
        raise DeploytkError(
            f"the TensorRT engine in {directory} does not match the artifact: " + "; ".join(reasons) + ".",
            hint=f"Rebuild it with `deploytk build {directory}`, or remove {ENGINE_FILE} and {ENGINE_MANIFEST_FILE} "
            "to package the ONNX model.",
        )
    if batch[0] != 1:
        raise DeploytkError(
            f"the TensorRT engine in {directory} was built for batches {batch[0]}..{batch[2]}: Triton's dynamic batcher "
            f"sends whatever has arrived (a lone request is a batch of 1), and batches below {batch[0]} would fail.",
            hint=f"Rebuild it (`deploytk build`) with `batch_sizes=1,{batch[1]},{batch[2]}`.",
        )
    return record


def _is_profile(batch) -> bool:
    return (
        isinstance(batch, list)
        and len(batch) == 3
        and all(isinstance(b, int) and not isinstance(b, bool) for b in batch)
        and 1 <= batch[0] <= batch[1] <= batch[2]
    )


def _max_batch_size(max_batch: int | None, engine: dict | None) -> int:
    if engine is None:
        return DEFAULT_ONNX_MAX_BATCH if max_batch is None else max_batch
    _, profile_opt, profile_max = engine["build"]["batch"]
    if max_batch is None:
        return profile_max
    if max_batch > profile_max:
        raise DeploytkError(
            f"`max_batch={max_batch}` exceeds the TensorRT engine's optimisation profile (batch up to {profile_max}); "
            "Triton refuses to load a config whose max_batch_size the engine cannot run.",
            hint=f"Use `max_batch={profile_max}` or less, or rebuild the engine (`deploytk build`) with "
            f"`batch_sizes=1,{profile_opt},{max_batch}`.",
        )
    return max_batch


def config_pbtxt(name: str, runtime: dict, max_batch_size: int, inputs: list[TensorSpec], outputs: list[TensorSpec], gpu: bool) -> str:
    """Triton's model configuration (ModelConfig protobuf, text format)."""
    lines = [
        CONFIG_HEADER,
        f'name: "{name}"',
        *([f'platform: "{runtime["platform"]}"'] if runtime["platform"] else []),
        f'backend: "{runtime["backend"]}"',
        f"max_batch_size: {max_batch_size}",
    ]
    for field, tensors in (("input", inputs), ("output", outputs)):
        lines.append(f"{field} [")
        for i, t in enumerate(tensors):
            comma = "," if i < len(tensors) - 1 else ""
            dims = ", ".join(map(str, t.dims))
            lines += ["  {", f'    name: "{t.name}"', f"    data_type: TYPE_{t.triton_dtype}", f"    dims: [ {dims} ]", "  }" + comma]
        lines.append("]")
    lines += ["dynamic_batching {", f"  max_queue_delay_microseconds: {QUEUE_DELAY_US}", "}"]
    if gpu:  # a TensorRT engine runs on the GPU it was built for; ONNX models keep Triton's default placement
        lines += ["instance_group [", "  {", "    kind: KIND_GPU", "    count: 1", "  }", "]"]
    return "\n".join(lines) + "\n"


def _readme(
    artifact: Artifact, name: str, runtime: dict, max_batch: int, inputs: list[TensorSpec], outputs: list[TensorSpec], engine: dict | None
) -> str:
    manifest = artifact.manifest
    cfg = manifest.get("config", {})
    method = manifest.get("method", {}).get("name", cfg.get("merge", {}).get("method", "?"))
    onnx_info = manifest.get("onnx", {})
    precision = onnx_info.get("precision", artifact.precision)
    if artifact.quantization:  # `deploytk quantize`: int8 weight ops, the rest in the export's precision
        precision = f"int8 ({artifact.quantization['tool']}, {artifact.quantization['runtime']} rules), the rest {precision}"
    io_rows = [f"| input | `{t.name}` | `{t.triton_dtype}` | `[{', '.join(map(str, t.dims))}]` |" for t in inputs]
    io_rows += [f"| output | `{t.name}` | `{t.triton_dtype}` | `[{', '.join(map(str, t.dims))}]` |" for t in outputs]
    if engine:
        runs = (
            f"`{VERSION_DIR}/model.plan` is the TensorRT engine `deploytk build` wrote (`{ENGINE_FILE}`, profile batch "
            f"{'..'.join(map(str, engine['build']['batch'][::2]))}, {engine['build'].get('merge_impl', '?')} merge, "
            f"{engine['build'].get('attention_impl', '?')} attention), run by Triton's `tensorrt` backend. The deploytk "
            "plugins are ahead-of-time plugins: their compiled kernels are embedded in the engine, so the server needs no "
            "plugin library, no Python and no deploytk.\n\n"
            f"**The server must have the same TensorRT version the engine was built with: TensorRT {engine['tensorrt']}** "
            "(engines are not portable across TensorRT versions). Use the Triton Inference Server release whose TensorRT is "
            f"{engine['tensorrt']} (each release's notes list its TensorRT version), and a GPU of the same architecture: "
            f"it was built on {engine.get('gpu', '?')} (compute capability {engine.get('compute_capability', '?')}). "
            "A different TensorRT or GPU architecture fails when Triton loads the engine; rebuild it there with `deploytk build`."
        )
        gpu_note = ""
    elif runtime is _OPENVINO:
        runs = (
            f"`{VERSION_DIR}/model.xml` and `{VERSION_DIR}/model.bin` are the OpenVINO IR of the export (its deploytk functions "
            "inlined into standard ops, every TopK made stable so that ties pick the lower index as the PyTorch reference "
            "does), run by Triton's `openvino` backend on the CPU; the batch axis is dynamic. `deploytk package` ran this IR "
            "with OpenVINO against the PyTorch reference before writing it. "
            "The backend takes no auto-completed config: the config.pbtxt here is complete. deploytk validated the IR in "
            "f32; on a CPU with bf16 arithmetic (AVX512-BF16, AMX) OpenVINO's CPU plugin computes in bf16 unless told "
            "otherwise, which changes merge choices: check that your openvino backend version runs it in f32 there."
        )
        gpu_note = " The openvino backend runs on the CPU: leave out `--gpus all`."
    else:
        versions = manifest.get("versions", {})
        runs = (
            f"`{VERSION_DIR}/model.onnx` is the exported model as is, run by Triton's `onnxruntime` backend"
            + (
                ": its deploytk nodes carry ONNX function bodies of standard ops, which ONNX Runtime inlines, so no custom-op "
                "library is needed. "
                if manifest.get("custom_ops")
                else " (standard ONNX ops only). "
            )
            + f"The server's ONNX Runtime must read ONNX IR version {onnx_info.get('ir_version', '?')} and opset "
            f"{onnx_info.get('opset', '?')} (the export's environment had onnxruntime {versions.get('onnxruntime', '?')}). "
            "It runs on the GPU where the server has one, else on the CPU."
        )
        if precision == "bf16":
            runs += (
                " This is a bf16 graph, and ONNX Runtime's CPU provider has no bf16 kernels (`deploytk validate` emulates "
                "them on the CPU; Triton does not), so it needs a GPU instance."
            )
        gpu_note = " Without a GPU, leave out `--gpus all`: ONNX Runtime then runs the model on the CPU."
    x, y = inputs[0], outputs[0]
    kind = artifact.input_kind  # the request's wording and axes: an image's, a clip's or a sound's
    np_dtype = {"bfloat16": "float32"}.get(x.dtype, x.dtype)  # tritonclient sends BF16 from float32 arrays (numpy has no bf16)
    example_shape = ", ".join(map(str, (1, *x.dims)))
    last = (
        f'print(result.as_numpy("{y.name}").argmax(axis=1))  # predicted class per {kind.noun}'
        if artifact.output_kind == "logits"
        else f'print(result.as_numpy("{y.name}").shape)  # (batch, {", ".join(map(str, y.dims))})'
    )
    return README_TEMPLATE.substitute(
        name=name,
        artifact=artifact.directory,
        model=manifest.get("model", {}).get("name", "?"),
        method=method,
        precision=precision,
        sha=onnx_info.get("sha256", "?")[:16],
        serving=(
            f"platform {runtime['platform']} (backend {runtime['backend']})" if runtime["platform"] else f"backend {runtime['backend']}"
        ),
        max_batch=max_batch,
        model_file=f"{VERSION_DIR}/{runtime['file']:<14}",
        runs=runs,
        io_rows="\n".join(io_rows),
        queue_delay_us=QUEUE_DELAY_US,
        gpu_note=gpu_note,
        example_shape=example_shape,
        np_dtype=np_dtype,
        input_dims=", ".join(map(str, x.dims)),
        input_axes=", ".join(kind.axes),
        nouns=kind.nouns,
        preprocessing=kind.preprocessing(),
        input_name=x.name,
        input_dtype=x.triton_dtype,
        output_name=y.name,
        last=last,
    )
