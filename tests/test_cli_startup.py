"""Issue 42, item 4: the CLI answers at once. `deploytk --help`, `--version`, `deploytk methods` and a command's `--help` import none of the
heavy libraries (each is run in a fresh interpreter and its sys.modules read), `import deploytk` neither, and the copies
in deploytk/defaults.py that the help texts are built from equal the library tables they copy."""

import json
import os
import subprocess
import sys
from dataclasses import asdict

import pytest
from typer.testing import CliRunner

from deploytk import __version__, defaults
from deploytk.cli import app

HEAVY = ("torch", "onnx", "onnxruntime", "openvino", "timm", "transformers", "polygraphy")

#: runs the app with sys.argv[1:] in this fresh interpreter, then prints the heavy modules it loaded as JSON on stderr
RUN_APP = f"""
import json, sys
from deploytk.cli import app
try:
    app(sys.argv[1:], prog_name="deploytk")
except SystemExit as exit:
    code = exit.code
print(json.dumps({{"code": code, "heavy": sorted(m for m in {HEAVY!r} if m in sys.modules)}}), file=sys.stderr)
"""


def run_app(*args: str) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "-c", RUN_APP, *args], capture_output=True, text=True, timeout=120)
    return json.loads(done.stderr.strip().splitlines()[-1]), done.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("--version",),
        ("methods",),
        ("methods", "--json"),
        ("configs", "--json"),
        ("validate", "--help"),
        ("plugins", "compile", "--help"),
    ],
    ids=" ".join,
)
def test_help_and_version_import_no_heavy_module(args):
    result, stdout = run_app(*args)
    assert result == {"code": 0, "heavy": []}, stdout
    assert stdout.strip()


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_a_command_still_loads_its_library():
    """The check can fail: a command that runs (families reads the family registry) does import torch."""
    result, _ = run_app("families", "--json")
    assert result["code"] == 0 and "torch" in result["heavy"]


def test_import_deploytk_is_light():
    code = f"import sys, deploytk; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_load_imports_no_model_code(exported):
    """Issue 55: `deploytk.load` answers in well under a second because opening an artifact (manifest, seal, model.onnx's
    sha256) needs no torch, timm, transformers, ONNX or runtime."""
    folder = exported("digits_vit_tome_r4")
    code = (
        f"import sys, deploytk; artifact = deploytk.load({str(folder)!r}); print(repr(artifact)); "
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    shown, heavy = done.stdout.strip().splitlines()
    assert "method='tome', r=4" in shown and heavy == "[]"


def test_python_m_deploytk_version_prints_the_package_version():
    done = subprocess.run([sys.executable, "-m", "deploytk", "--version"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"deploytk {__version__}\n", "")


#: the installed console script's name is the program name completion is written for
SHOW_COMPLETION = "from deploytk.cli import app; app(['--show-completion', 'bash'], prog_name='deploytk')"


def test_shell_completion_is_on():
    """typer's --show-completion prints the bash script. It detects the user's shell unless typer's own test switch is set
    (read when the app is made, hence a fresh interpreter): with it the shell is named, so the test needs no shell."""
    env = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    done = subprocess.run([sys.executable, "-c", SHOW_COMPLETION], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "_DEPLOYTK_COMPLETE=complete_bash" in done.stdout and "complete -o default -F" in done.stdout
    assert "--install-completion" in CliRunner().invoke(app, ["--help"]).output


def test_cli_defaults_equal_the_library_tables():
    """deploytk.defaults copies what help texts and the API's defaults need; each copy must equal its source (change
    both together)."""
    from deploytk_plugins.aot import ARCHES

    from deploytk.adapters.hf_common import HF_PREFIX
    from deploytk.api.inputs import CONFIG_SUFFIXES
    from deploytk.backends import BACKENDS, DEFAULT_BACKEND
    from deploytk.package import DEFAULT_ONNX_MAX_BATCH
    from deploytk.quantize import DEFAULT_CALIBRATION_IMAGES
    from deploytk.tuning import PERCENTILES
    from deploytk.validate.validator import PRECISION_TOLERANCES
    from deploytk.visualization import REFERENCE, backend_names

    assert defaults.BACKEND_NAMES == tuple(BACKENDS)
    assert defaults.VALIDATING_BACKEND_NAMES == tuple(n for n, b in BACKENDS.items() if b.validates)
    assert defaults.DEFAULT_BACKEND == DEFAULT_BACKEND
    assert defaults.PRECISION_TOLERANCES == {p: asdict(t) for p, t in PRECISION_TOLERANCES.items()}
    assert defaults.DEFAULT_CALIBRATION_IMAGES == DEFAULT_CALIBRATION_IMAGES
    assert defaults.PERCENTILES == tuple(PERCENTILES)
    assert defaults.ARCHES == tuple(ARCHES)
    assert (defaults.VISUALIZE_REFERENCE, defaults.VISUALIZE_BACKENDS) == (REFERENCE, tuple(backend_names()))
    assert defaults.DEFAULT_ONNX_MAX_BATCH == DEFAULT_ONNX_MAX_BATCH
    assert (defaults.HF_PREFIX, defaults.CONFIG_SUFFIXES) == (HF_PREFIX, CONFIG_SUFFIXES)
