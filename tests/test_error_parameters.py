"""The library names its parameters, the CLI names its flags (issue 42, item 3).

A Python caller passed keywords, so a library message names `num_samples=0`, never a flag (deploytk.errors.PARAMETER);
the CLI turns each such parameter of the running command into the flag that command declares (render.in_flags). The
same bad input is checked both ways, and no deploytk flag is written anywhere in the library's source.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from deploytk.cli import app, render
from deploytk.errors import PARAMETER, DeploytkError, param

from helpers import digits_config, snapshot
from helpers.configs import CONFIGS, ROOT

runner = CliRunner()
CLI = typer.main.get_command(app)
TOME = CONFIGS / "digits_vit_tome_r4.yaml"
ATM = CONFIGS / "digits_vit_atm.yaml"

#: library code a Python caller meets (serving/ is the deploytk-triton command's own CLI: its flags are its own)
LIBRARY = [p for p in (ROOT / "deploytk").rglob("*.py") if "cli" not in p.relative_to(ROOT / "deploytk").parts[:1]]
LIBRARY += sorted((ROOT / "plugins").rglob("*.py"))
#: other programs' flags the library may quote, and why
OTHER_PROGRAMS = {
    "--gpus": "docker run's, in the Triton model README's server command",
    "--target": "pip install's, in deploytk/__main__.py's docstring",
    "--k_neighbors": "the official study code's argparse flag a method option mirrors",
    "--cluster_iters": "the official study code's argparse flag a method option mirrors",
    "--sinkhorn_eps": "the official study code's argparse flag a method option mirrors",
    "--equal_weight": "the official study code's argparse flag a method option mirrors",
}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*")


def deploytk_flags() -> set[str]:
    """Every flag of every deploytk command, from the CLI's own click options."""
    flags: set[str] = set()

    def walk(command) -> None:
        for p in command.params:
            flags.update(o for o in (*p.opts, *getattr(p, "secondary_opts", ())) if o.startswith("--"))
        for sub in getattr(command, "commands", {}).values():
            walk(sub)

    walk(CLI)
    return flags


def flag_text(text: str, flags: set[str]) -> list[str]:
    """The flags in ``text`` the library may not write: any of deploytk's, and any other not in OTHER_PROGRAMS."""
    return [f for f in FLAG.findall(text) if f in flags or f not in OTHER_PROGRAMS]


def test_the_flag_scan_finds_a_flag_and_lets_a_parameter_and_other_programs_flags_through():
    flags = deploytk_flags()
    assert {"--num-samples", "--format", "--json", "--min-top1", "--no-baseline", "--triton", "--r"} <= flags
    assert flag_text('raise DeploytkError(f"--num-samples {n}: must be >= 1.")', flags) == ["--num-samples"]
    assert flag_text("# hint: `deploytk export --format onnx-inlined`", flags) == ["--format"]
    assert flag_text("an --undeclared-flag of nobody's", flags) == ["--undeclared-flag"]
    assert flag_text('f"`num_images={n}`: must be >= 1." leave out `--gpus all`; linestyle="--"', flags) == []


def test_no_library_source_writes_a_deploytk_flag():
    """Messages, hints, comments and docstrings alike: the simplest rule a grep can hold (issue 42)."""
    flags = deploytk_flags()
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in LIBRARY
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if flag_text(line, flags)
    ]
    assert len(LIBRARY) > 100 and not found, "\n".join(found)


def python_and_cli(tmp_path, art, case):
    """(the library call, the CLI arguments) of one bad input."""
    from deploytk.calibration import calibrate_config
    from deploytk.evaluation.accuracy import evaluate
    from deploytk.exporter.pipeline import run_export
    from deploytk.package import package_triton
    from deploytk.profile.profiler import parse_batch_sizes
    from deploytk.quantize import run_quantize
    from deploytk.tuning import tune
    from deploytk.validate.validator import run_validations

    out, imgs = tmp_path / "out", tmp_path / "imgs"
    return {
        "quantize": (
            lambda: run_quantize(art, "ort", data=imgs, num_samples=0, output=out),
            ["quantize", art, "--backend", "ort", "--data", imgs, "--num-samples", "0", "--output", out],
        ),
        "export": (
            lambda: run_export(digits_config("digits_vit_tome_r4"), out, fmt="x"),
            ["export", TOME, "--format", "x", "--output", out],
        ),
        "profile": (lambda: parse_batch_sizes("1,x"), ["profile", art, "--batch-sizes", "1,x"]),
        "validate": (lambda: run_validations(art, ["ort"], num_samples=0), ["validate", art, "--num-samples", "0"]),
        "eval": (
            lambda: evaluate(digits_config("digits_vit_tome_r4"), imgs, num_samples=0),
            ["eval", TOME, "--data", imgs, "--num-samples", "0"],
        ),
        "calibrate": (
            lambda: calibrate_config(ATM, synthetic=0, output=out / "c.yaml"),
            ["calibrate", ATM, "--synthetic", "0", "--output", out / "c.yaml"],
        ),
        "package": (lambda: package_triton(art, out, max_batch=0), ["package", art, "--triton", out, "--max-batch", "0"]),
        "tune": (
            lambda: tune(TOME, 5.0, percentile="p99", iterations=3, output=out / "t.yaml"),
            ["tune", TOME, "--budget-ms", "5", "--percentile", "p99", "--iterations", "3", "--output", out / "t.yaml"],
        ),
    }[case]


#: command -> (what the Python caller reads, what the CLI user reads)
SAID = {
    "quantize": ("`num_samples=0`: must be >= 1.", "--num-samples 0: must be >= 1."),
    "export": ("`fmt='x'` is not one of onnx, onnx-inlined, onnx-ort.", "--format 'x' is not one of onnx, onnx-inlined, onnx-ort."),
    "profile": ("`batch_sizes='1,x'` must be comma-separated ints, e.g. 1,8,32.", "--batch-sizes '1,x' must be comma-separated ints"),
    "validate": ("`num_samples=` and `batch_size=` must be >= 1.", "--num-samples and --batch-size must be >= 1."),
    "eval": (
        "`num_samples=0`: must be an int >= 1 (or omitted for all inputs).",
        "--num-samples 0: must be an int >= 1 (or omitted for all inputs).",
    ),
    "calibrate": ("`synthetic=0`: calibration needs at least 1 image.", "--synthetic 0: calibration needs at least 1 image."),
    "package": ("`max_batch=0`: must be an int >= 1 (Triton's", "--max-batch 0: must be an int >= 1 (Triton's"),
    "tune": (
        "`percentile=p99` needs at least 100 timed runs per candidate; with `iterations=3` it would be the slowest run, not a "
        "p99. Pass `iterations=100` or more",
        "--percentile p99 needs at least 100 timed runs per candidate; with --iterations 3 it would be the slowest run, not a "
        "p99. Pass --iterations 100 or more",
    ),
}


@pytest.mark.parametrize("case", sorted(SAID))
def test_the_library_names_the_parameter_and_the_cli_the_flag(exported, tmp_path, case):
    art = exported("digits_vit_tome_r4")
    call, args = python_and_cli(tmp_path, art, case)
    python_says, cli_says = SAID[case]
    before = snapshot(tmp_path)
    with pytest.raises(DeploytkError) as err:
        call()
    assert python_says in str(err.value)
    assert not FLAG.search(str(err.value)), "a Python caller passed no flag"
    assert snapshot(tmp_path) == before

    result = runner.invoke(app, [str(a) for a in args])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in text, result.output
    assert cli_says in text, result.output
    assert not PARAMETER.search(text), "every parameter the message names is one of this command's options"
    assert snapshot(tmp_path) == before


def command(*path: str):
    found = CLI
    for name in path:
        found = found.commands[name]
    return found


def test_a_marked_parameter_becomes_the_commands_own_flag_and_anything_else_stays():
    message = "Pass `force=True`, `fmt='onnx-inlined'`, `checkpoint=` or `r=8`; `num_images=3` and `merge.r` are not export's."
    assert render.in_flags(message, command("export")) == (
        "Pass --force, --format 'onnx-inlined', --checkpoint or --r 8; `num_images=3` and `merge.r` are not export's."
    )
    assert render.in_flags("built with `baseline=False`", command("build")) == "built with --no-baseline"
    assert render.in_flags("built with `baseline=True`", command("build")) == "built with --baseline"
    assert render.in_flags(f"{param('min_top1_agreement', 0.5)}", command("validate")) == "--min-top1 0.5"
    assert render.in_flags("`json_out=True` ``check=False`` `TRITON_INTERPRET=1 x`", command("doctor")) == (
        "--json ``check=False`` `TRITON_INTERPRET=1 x`"
    )
    assert render.in_flags("`arch='sm_1'`", command("plugins", "compile")) == "--arch 'sm_1'"
    assert render.in_flags("`fmt='x'`") == "`fmt='x'`", "outside a command nothing is translated"


def test_the_tune_command_line_spells_each_argument_as_tunes_flag():
    root = typer.Context(CLI, info_name="deploytk")
    with typer.Context(command("tune"), info_name="tune", parent=root):
        line = render.command_line(Path("a b.yaml"), {"budget_ms": 5.0, "inflections": [0.0, -0.5], "data": None, "output": "o.yaml"})
    assert line == "deploytk tune 'a b.yaml' --budget-ms 5 --inflections 0,-0.5 --output o.yaml"
