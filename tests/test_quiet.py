"""Quiet success (issue 41): a successful CLI run prints deploytk's own lines on stderr and no third-party warning,
unless ``deploytk --verbose``; deploytk's own warnings and every error still print."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "export_configs" / "digits_vit_tome_r4.yaml"

#: what deploytk itself writes on stderr on a successful run that is not on a terminal (the progress is drawn only on
#: one): blank lines and its notes (``render.note``)
OWN_LINE_PREFIXES = ("note: ",)

#: each third-party source seen on stderr before, raised for real where the library can be made to (torch, ONNX Runtime's
#: quantizer, Polygraphy), then deploytk's own warning and log line and a third-party error, which always print
EMIT = textwrap.dedent(
    """
    import logging, sys, tempfile, warnings

    import numpy as np
    import onnx
    import torch
    from onnx import TensorProto, helper, numpy_helper
    from polygraphy.logger import G_LOGGER

    from deploytk.cli.quiet import third_party_quiet


    def emit():
        torch.cuda.is_available = lambda: False  # as on the CPU machine with a CUDA toolkit the user ran on
        import torch.utils.cpp_extension as ext

        ext._find_cuda_home()  # "No CUDA runtime is found" (CUDA_HOME names a folder, no GPU)
        from onnxruntime.quantization import quantize_dynamic

        weight = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
        io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in ("x", "y")]
        graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", io[:1], io[1:], [weight])
        with tempfile.TemporaryDirectory() as folder:
            onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), f"{folder}/m.onnx")
            quantize_dynamic(f"{folder}/m.onnx", f"{folder}/q.onnx")  # "Please consider ... pre-processing" (root logger)
        G_LOGGER.warning("polygraphy warning line")
        G_LOGGER.error("polygraphy FAILED line")
        warnings.warn_explicit("torch.onnx warning line", UserWarning, "torch/onnx/x.py", 1, module="torch.onnx.x")
        warnings.warn_explicit("deploytk warning line", UserWarning, "deploytk/x.py", 1, module="deploytk.x")
        logging.getLogger("deploytk").warning("deploytk log line")
        logging.getLogger("onnxruntime").error("onnxruntime error line")


    if sys.argv[1] == "quiet":
        with third_party_quiet():
            emit()
        G_LOGGER.warning("polygraphy warning after the run")  # the process is left as it was found
    else:
        emit()
    """
)

THIRD_PARTY_LINES = ("No CUDA runtime is found", "pre-processing before quantization", "polygraphy warning line", "polygraphy FAILED")
ALWAYS = ("deploytk warning line", "deploytk log line", "onnxruntime error line")


def run_python(code: str, *args: str, cwd: Path, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=environment, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize("mode", ["quiet", "verbose"])
def test_each_third_party_source_is_silenced_and_deploytk_s_own_lines_and_errors_are_not(mode, tmp_path):
    cuda_home = tmp_path / "cuda"
    cuda_home.mkdir()
    done = run_python(EMIT, mode, cwd=tmp_path, CUDA_HOME=str(cuda_home))
    assert done.returncode == 0, done.stderr
    printed = done.stdout + done.stderr
    for line in ALWAYS:
        assert line in done.stderr, (line, printed)
    for line in THIRD_PARTY_LINES:
        assert (line in printed) == (mode == "verbose"), (mode, line, printed)
    if mode == "quiet":
        assert "polygraphy warning after the run" in printed


#: the CLI's steps in one process (one import, as each `deploytk` run is one): a marker line on stderr before each
STEPS = textwrap.dedent(
    """
    import json, sys

    from deploytk.cli import app

    for step in json.loads(sys.argv[1]):
        print("step:", *step, file=sys.stderr, flush=True)
        code = app(step, prog_name="deploytk", standalone_mode=False)
        assert code in (None, 0), (step, code)
    """
)


def steps_stderr(steps: list[list[str]], cwd: Path, **env) -> dict[str, list[str]]:
    """Run ``steps`` through the CLI in one subprocess; each step's stderr lines."""
    done = run_python(STEPS, json.dumps(steps), cwd=cwd, **env)
    assert done.returncode == 0, done.stderr
    lines: dict[str, list[str]] = {}
    for line in done.stderr.splitlines():
        if line.startswith("step: "):
            lines[line] = []
        elif line.strip():
            lines[next(reversed(lines))].append(line)
    return lines


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_a_successful_export_validate_quantize_profile_prints_no_third_party_line_and_verbose_lets_them_through(tmp_path):
    """The demo's steps on the small digits ViT (and ORT int8, whose quantizer warned on every run) through the CLI in a
    subprocess, with CUDA_HOME naming a folder as on the user's machine: every line on stderr is deploytk's."""
    cuda_home = tmp_path / "cuda"
    cuda_home.mkdir()
    art = tmp_path / "art"
    quantize = ["quantize", str(art), "--backend", "ort", "--synthetic", "8", "--output"]
    steps = [
        ["export", str(CONFIG), "--output", str(art), "--format", "onnx-inlined"],
        ["validate", str(art), "--num-samples", "16"],
        [*quantize, str(tmp_path / "int8")],
        ["profile", str(art), "--batch-sizes", "1", "--warmup", "1", "--iterations", "2"],
        ["--verbose", *quantize, str(tmp_path / "int8-verbose")],
    ]
    stderr = steps_stderr(steps, tmp_path, CUDA_HOME=str(cuda_home))
    assert len(stderr) == len(steps), stderr
    *quiet, verbose = stderr.values()
    for step, lines in zip(steps[:-1], quiet, strict=True):
        assert all(line.startswith(OWN_LINE_PREFIXES) for line in lines), (step, lines)
    assert any("pre-processing before quantization" in line for line in verbose), verbose  # --verbose lets it through
