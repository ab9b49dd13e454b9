"""deploytk: deploy token-reducing Vision Transformers to ONNX Runtime and TensorRT.

Commands: export | quantize | validate | profile | tune | inspect | visualize | methods | calibrate | eval | build | package | selftest
| plugins compile | doctor | clean. Each parses its options, calls one ``deploytk.api`` function or ``Artifact`` method
and prints the report it returns (``render``): ``--json`` prints the report's ``to_dict()``, what a Python caller gets
(tests/test_cli_api_parity.py). Every command exits 0 on success; a DeploytkError prints one paragraph to stderr and
exits 2 (validate and selftest exit 1 when their check fails, tune when no schedule meets the budget). ``--json`` prints
exactly one JSON object on stdout and nothing else there; progress goes to stderr. Third-party libraries' warnings are
silenced at their sources (``quiet.py``) unless ``deploytk --verbose COMMAND``.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import signal
from pathlib import Path

import click
import typer

from deploytk import defaults, ready_made, vocabulary
from deploytk.cli import quiet, render
from deploytk.cli.render import RichProgress, fail
from deploytk.errors import DeploytkError, param

# Each command imports deploytk.api (or its own library module) inside its body: the API imports torch, ONNX and OpenVINO,
# and `deploytk --help`, `--version`, `methods` and a command's `--help` need none of them (issue 42). Help texts and defaults come
# from `deploytk.defaults`, whose copies a test holds equal to the library's tables.


class RenamingGroup(typer.core.TyperGroup):
    """The command group that takes a command's old option names (``deploytk.vocabulary.RENAMED``) as the new ones, with
    a one-line note each, before the command parses them: ``--help`` shows only the vocabulary's names."""

    def parse_args(self, ctx, args):
        name = next((a for a in args if not a.startswith("-")), "")
        command = self.commands.get(name)
        takes_values = {o for p in command.params if isinstance(p, click.Option) and not p.is_flag for o in p.opts} if command else set()
        return super().parse_args(ctx, renamed_args(list(args), takes_values, quiet=ctx.resilient_parsing))


def renamed_args(args: list[str], takes_values: set[str] = frozenset(), quiet: bool = False) -> list[str]:
    """``args`` with the old flags (and old values) of the command they name rewritten to the vocabulary's. The group's
    own options take no value, so the first argument that is not an option is the command. An option's value (after one
    of ``takes_values``) and everything after ``--`` stay as given; ``quiet``: no notes (shell completion)."""
    command = next((a for a in args if not a.startswith("-")), "")
    renamed = {vocabulary.flag(old): new for old, new in vocabulary.RENAMED.get(command, {}).items()}
    values = {vocabulary.flag(new): mapping for (cmd, new), mapping in vocabulary.RENAMED_VALUES.items() if cmd == command}
    note = (lambda _: None) if quiet else render.note
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            return out + args[i:]
        name, eq, value = arg.partition("=")
        if out and out[-1] in takes_values and out[-1] not in values:  # the value of the option before: as given
            out.append(arg)
            continue
        if name in renamed:
            note(vocabulary.note(command, name[2:].replace("-", "_"), renamed[name]))
            name = vocabulary.flag(renamed[name])
        if name in values and eq and value in values[name]:  # --flag=old-value
            note(f"{name} {value} is now {name} {values[name][value]} (the old value goes in the next release)")
            value = values[name][value]
        if out and out[-1] in values and arg in values[out[-1]]:  # --flag old-value
            note(f"{out[-1]} {arg} is now {out[-1]} {values[out[-1]][arg]} (the old value goes in the next release)")
            name = values[out[-1]][arg]
        out.append(name + eq + value)
    return out


# help texts are plain text: rich markup would eat every "[...]" in them (the per-precision defaults did vanish)
app = typer.Typer(
    cls=RenamingGroup,
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help=__doc__.splitlines()[0],
)
plugins_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="TensorRT plugin kernels (AOT Triton).")
app.add_typer(plugins_app, name="plugins")
JSON = typer.Option(False, "--json", help="Print the result as one JSON object on stdout.")
VALIDATING_BACKENDS = " | ".join(defaults.VALIDATING_BACKEND_NAMES)


def print_version(value: bool):
    """``--version``: the package's own version string, read without importing any library module."""
    if value:
        from deploytk import __version__

        typer.echo(f"deploytk {__version__}")
        raise typer.Exit()


#: this run's --verbose, set by main_options before every command (typer's vendored click keeps its context to itself)
_run = {"verbose": False}


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=print_version, help="Print deploytk's version and exit."),
    verbose: bool = typer.Option(
        False,
        "--verbose",
        help="Let torch's, ONNX Runtime's, Polygraphy's, OpenVINO's and the other libraries' warnings through to stderr "
        "(silenced by default; deploytk's own notes and every error always print). Before the command: deploytk --verbose validate DIR.",
    ),
):
    """deploytk: deploy token-reducing Vision Transformers to ONNX Runtime and TensorRT."""
    _run["verbose"] = verbose  # read by handle_errors, which silences the libraries only once a command's body runs


CONFIG_HELP = f"Export config: a YAML file, or a ready-made config's name (deploytk configs) [default: {ready_made.DEFAULT_NAME}]."


# The config overrides every command that reads a config takes (deploytk.vocabulary): one declaration each, shared.
MODEL = typer.Option(None, "--model", help="Override `model`: a timm ViT name or hf:<folder or Hub id>.")
METHOD = typer.Option(None, "--method", help="Override `merge.method` (deploytk methods).")
R = typer.Option(None, "--r", help="Override `merge.r`: 16 | 8,8,4,... (one per block) | 16:-1 (r:inflection).")
PRECISION = typer.Option(None, "--precision", help="Override `export.precision`: fp32 | fp16 | bf16 (precision lives in the graph).")
OUTPUT_KIND = typer.Option(None, "--output-kind", help="Override `export.output`: logits | embedding | patch_features | tokens.")
IMG_SIZE = typer.Option(None, "--img-size", help="Override `export.img_size`: 224 (square) or H,W.")
FEATURE_LAYER = typer.Option(
    None, "--feature-layer", help="Override `export.feature_layer` (patch_features / tokens): a hidden_states index, -2 the penultimate."
)
CHECKPOINT = typer.Option(None, "--checkpoint", help="Override `checkpoint`: a .safetensors / .pth state_dict (or a JAX .npz).")


def config_overrides(checkpoint, model, method, r, precision, output_kind, img_size, feature_layer) -> dict:
    """The config overrides a command was given, as ``load_config_with_overrides`` takes them (None: not given)."""
    return {
        "checkpoint": str(checkpoint) if checkpoint else None,
        "model": model,
        "method": method,
        "r": r,
        "precision": precision,
        "output_kind": output_kind,
        "img_size": img_size,
        "feature_layer": feature_layer,
    }


def config_or_export(config: Path, overrides: dict):
    """CONFIG with its overrides applied, or an export's folder as it is: an override given to an export is refused."""
    from deploytk.config import load_config_with_overrides

    if not config.is_dir():
        return load_config_with_overrides(config, **overrides)
    given = next((name for name, value in overrides.items() if value is not None), None)
    if given is not None:
        raise DeploytkError(
            f"{config} is an export, whose model, weights and schedule were fixed when it was exported: `{given}=` cannot change them."
        )
    return config


def given_default_config() -> Path:
    """No CONFIG argument: the default, said on stderr so nobody mistakes it for their own config."""
    config = ready_made.default_config()
    render.note(f"no CONFIG given: using the default {config}")
    return config


def tolerance_defaults(field: str) -> str:
    """ "[default: fp32 0.0001, fp16 0.05, bf16 0.2]" from the validator's own table."""
    return "[default: " + ", ".join(f"{p} {t[field]:g}" for p, t in defaults.PRECISION_TOLERANCES.items()) + "]"


#: OS failures the user fixes, not bugs, and what to do; any other OSError keeps its traceback
OS_FAILURES = {
    errno.ENOSPC: "Free space on that disk, or write to another one.",
    errno.EDQUOT: "Free space within your quota, or write to another disk.",
    errno.EROFS: "Choose a folder on a writable file system (copy a read-only artifact to one first).",
    errno.EACCES: "Choose a path you may read and write, or change its permissions.",
    errno.EPERM: "Choose a path you may read and write, or change its permissions.",
}
#: the parameters that name a command's output (the CLI's own words; render.fail names their flags)
OUTPUT_PARAMETERS = ("output", "triton")


def os_failure(err: BaseException, kwargs: dict) -> str | None:
    """One paragraph for an OS failure in ``err`` or what caused it (disk full, quota, read-only, permissions), naming
    the path: the one the OS reported, or the command's output where the OS named none (a write to an open file) or
    named a temporary file of it; None when it is no such failure."""
    while err is not None and not (isinstance(err, OSError) and err.errno in OS_FAILURES):
        err = err.__cause__ or err.__context__
    if err is None:
        return None
    outputs = " and ".join(param(name, kwargs[name]) for name in OUTPUT_PARAMETERS if kwargs.get(name) is not None)
    if err.filename is not None and not (outputs and err.errno in (errno.ENOSPC, errno.EDQUOT)):
        where = "at " + " -> ".join(str(f) for f in (err.filename, err.filename2) if f is not None)
        where += f" (writing {outputs})" if outputs else ""
    else:
        where = f"writing {outputs}" if outputs else "reading or writing a file"
    reason = err.strerror or os.strerror(err.errno)
    return f"{reason} ({errno.errorcode[err.errno]}) {where}; the command stopped and left nothing half-written. {OS_FAILURES[err.errno]}"


def handle_errors(fn):
    """A command's errors as one paragraph, third-party warnings silenced unless --verbose (entered here, when the body
    runs, not in main_options: `deploytk COMMAND --help` loads no library)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with quiet.third_party_verbose() if _run["verbose"] else quiet.third_party_quiet():
            return _reported(fn, args, kwargs)

    return wrapper


def handle_errors_without_libraries(fn):
    """handle_errors for a command that runs no third-party library (`methods`): nothing to silence, and the silencer
    would import ONNX Runtime and Polygraphy."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return _reported(fn, args, kwargs)

    return wrapper


def _reported(fn, args, kwargs):
    """Run one command, a DeploytkError, Ctrl-C or an OS failure the user fixes turned into one paragraph and exit 2 (the
    parameters it names become the command's flags: render.fail)."""
    try:
        return fn(*args, **kwargs)
    except DeploytkError as err:
        fail(str(err))
    except KeyboardInterrupt:
        fail("interrupted; nothing was written.", 130)
    except Exception as err:  # noqa: BLE001 (re-raised unless it is an OS failure the user fixes)
        message = os_failure(err, kwargs)
        if message is None:
            raise
        fail(message)


@app.command()
@handle_errors
def export(
    config: Path | None = typer.Argument(None, help=CONFIG_HELP, show_default=False),
    checkpoint: Path | None = CHECKPOINT,
    output: Path | None = typer.Option(None, help="Artifact directory (default artifacts/<config stem>/)."),
    model: str | None = MODEL,
    method: str | None = METHOD,
    r: str | None = R,
    precision: str | None = PRECISION,
    output_kind: str | None = OUTPUT_KIND,
    img_size: str | None = IMG_SIZE,
    feature_layer: int | None = FEATURE_LAYER,
    fmt: str = typer.Option(
        "onnx",
        "--format",
        help="onnx: model.onnx (deploytk ops with function bodies: ONNX Runtime, TensorRT) | onnx-inlined: also "
        "model.inlined.onnx, standard ops only (OpenVINO and other runtimes without model-local functions) | onnx-ort: also "
        "model.ort.onnx, fused for ONNX Runtime's CPU kernels (run by --backend ort).",
    ),
    force: bool = typer.Option(
        False, "--force", help="DIR is an earlier export that also holds other files: replace the export's own files, keep the others."
    ),
    json_out: bool = JSON,
):
    """Export CONFIG to DIR/model.onnx + DIR/manifest.json (written atomically).

    DIR must be new, empty or an earlier export; a folder or file deploytk did not write is refused before any work.
    """
    from deploytk.api import export as run_export
    from deploytk.config import load_config_with_overrides

    overrides = config_overrides(checkpoint, model, method, r, precision, output_kind, img_size, feature_layer)
    config = config or given_default_config()
    import warnings

    from deploytk.errors import ExportNotice

    cfg = load_config_with_overrides(config, **overrides)
    with RichProgress() as progress, warnings.catch_warnings():
        warnings.simplefilter("ignore", ExportNotice)  # the export's notes are in its report, rendered below
        artifact = run_export(cfg, output or Path("artifacts") / config.stem, fmt=fmt, force=force, progress=progress)
    render.export(artifact.to_dict(), json_out)


@app.command()
@handle_errors
def quantize(
    directory: Path = typer.Argument(..., help="fp32 artifact directory written by `deploytk export`."),
    backend: str = typer.Option(
        ...,
        help="The runtime the int8 model is for: openvino (NNCF, OpenVINO IR) | ort (ONNX Runtime QDQ) | trt (Q/DQ in "
        "TensorRT's explicit-quantization rules; checked on ONNX Runtime here).",
    ),
    data: Path | None = typer.Option(None, "--data", help="Folder of real calibration inputs (recursively), e.g. your training split."),
    synthetic: int | None = typer.Option(None, "--synthetic", help="Calibrate on N seeded noise inputs instead (no real ranges)."),
    num_samples: int = typer.Option(defaults.DEFAULT_CALIBRATION_IMAGES, help="Calibration inputs taken from --data."),
    output: Path | None = typer.Option(None, help="New artifact directory (default: DIR-int8-BACKEND beside DIR)."),
    force: bool = typer.Option(False, "--force", help="OUTPUT is an earlier artifact that also holds other files: keep them."),
    json_out: bool = JSON,
):
    """Quantize an export to INT8 for one runtime: a new artifact (model + int8 dense baseline + manifest) that validate,
    profile, eval, tune and package take like any other.

    Only the ops with weights become int8; the merge / selection choices, their inputs, attention products, softmax and
    norms stay fp32. Written atomically; bad input is refused before anything is written.
    """
    from deploytk.api import load

    with RichProgress(not json_out) as progress:
        quantized = load(directory).quantize(
            backend, output=output, data=data, synthetic=synthetic, num_samples=num_samples, force=force, progress=progress
        )
    render.quantization(directory, quantized.to_dict(), json_out)


@app.command()
@handle_errors
def validate(
    directory: Path = typer.Argument(..., help="Artifact directory written by `deploytk export`."),
    backend: str = typer.Option(
        defaults.DEFAULT_BACKEND,
        help=VALIDATING_BACKENDS + ". Several, comma-separated (ort,openvino): each judged, the reference run once.",
    ),
    data: Path | None = typer.Option(
        None, help="Folder of real inputs: images, or clips / sounds for a video / audio model (default: seeded synthetic ones)."
    ),
    num_samples: int = typer.Option(64, help="Inputs (images, clips, sounds) to compare."),
    batch_size: int = typer.Option(8, help="Batch size of the comparison runs."),
    atol: float | None = typer.Option(None, help="Absolute tolerance on logits " + tolerance_defaults("atol")),
    rtol: float | None = typer.Option(None, help="Relative tolerance on logits " + tolerance_defaults("rtol")),
    min_cosine: float | None = typer.Option(None, help="Minimum per-image cosine similarity " + tolerance_defaults("min_cosine")),
    min_top1_agreement: float | None = typer.Option(
        None, "--min-top1", help="Minimum top-1 agreement, a fraction " + tolerance_defaults("min_top1_agreement")
    ),
    max_flipped_choices: float | None = typer.Option(
        None,
        help="Largest fraction of the matching decisions (one per token per matching op per image) allowed to differ "
        "from the reference's at proven near-ties " + tolerance_defaults("max_flipped_choices"),
    ),
    max_branch_flips: float | None = typer.Option(
        None,
        help="Deprecated (goes in the next release; judged only where given): largest fraction of images allowed to "
        "take a different matching/selection choice at a proven near-tie.",
    ),
    json_out: bool = JSON,
):
    """Compare a backend's outputs with the PyTorch reference; exit 0 = pass, 1 = fail.

    The reference is the fp32 PyTorch model; default tolerances depend on the artifact's
    export.precision (in brackets below).

    An image outside tolerance on a model with matching/selection ops is diagnosed: if each of
    the backend's different choices was made on inputs equal to the reference's within
    tolerance and is the op's own choice up to float32-rounding ties, and the reference replayed
    with the backend's choices matches it, the image counts as a near-tie branch flip (listed in
    the report) and is checked against the replay; the flipped decisions' share of all matching
    decisions is bounded by --max-flipped-choices.
    """
    from deploytk.api import load

    tolerances = {
        "atol": atol,
        "rtol": rtol,
        "min_cosine": min_cosine,
        "min_top1_agreement": min_top1_agreement,
        "max_flipped_choices": max_flipped_choices,
        "max_branch_flips": max_branch_flips,
    }
    with RichProgress() as progress:
        report = load(directory).validate(
            backend, data=data, num_samples=num_samples, batch_size=batch_size, progress=progress, **tolerances
        )
    render.validations(directory, report.to_dict(), data is not None, json_out)
    raise typer.Exit(0 if report.passed else 1)


@app.command()
@handle_errors
def profile(
    directory: Path = typer.Argument(..., help="Artifact directory written by `deploytk export`."),
    backend: str = typer.Option(defaults.DEFAULT_BACKEND, help=" | ".join(defaults.BACKEND_NAMES)),
    batch_sizes: str = typer.Option("1,8", help="Comma-separated batch sizes, e.g. 1,8,32."),
    warmup: int = typer.Option(5, help="Warm-up runs per model and batch size."),
    iterations: int = typer.Option(20, help="Timed runs per model and batch size (alternating)."),
    json_out: bool = JSON,
):
    """Latency of the merged model and of the same weights without merging, measured in one run."""
    from deploytk.api import load

    with RichProgress() as progress:
        report = load(directory).profile(backend, batch_sizes=batch_sizes, warmup=warmup, iterations=iterations, progress=progress)
    render.profile(report.to_dict(), json_out)


@app.command()
@handle_errors
def inspect(
    config: Path | None = typer.Argument(None, help=CONFIG_HELP, show_default=False),
    model: str | None = MODEL,
    method: str | None = METHOD,
    r: list[str] | None = typer.Option(
        None,
        "--r",
        help="Override `merge.r`: 16 | 8,8,4,... (one per block) | 16:-1 (r:inflection). Given several times (--r 4 --r 8 "
        "--r 16): one row per schedule, the unmerged model counted once.",
    ),
    precision: str | None = PRECISION,
    output_kind: str | None = OUTPUT_KIND,
    img_size: str | None = IMG_SIZE,
    feature_layer: int | None = FEATURE_LAYER,
    json_out: bool = JSON,
):
    """Token schedule and GFLOPs (fvcore convention) per layer and in total; no weights needed."""
    from deploytk.analysis import inspect_cache

    one = r[0] if r and len(r) == 1 else None
    overrides = config_overrides(None, model, method, one, precision, output_kind, img_size, feature_layer)
    config = config or given_default_config()
    cache_key = inspect_cache.key(config, {**overrides, "schedules": r if r and len(r) > 1 else None})
    answer = inspect_cache.read(cache_key)  # asked before: no torch, no model
    if answer is None:
        from deploytk.api import inspect as run_inspect
        from deploytk.config import load_config_with_overrides, parse_r_option

        cfg = load_config_with_overrides(config, **overrides)
        schedules = [parse_r_option(each) for each in r] if r and len(r) > 1 else None
        with RichProgress() as progress:
            answer = run_inspect(cfg, schedules=schedules, progress=progress).to_dict()
        inspect_cache.write(cache_key, answer)
    render.inspect(answer, json_out)


@app.command()
@handle_errors
def visualize(
    config: Path = typer.Argument(
        ..., help="Export config YAML, or an export's folder (its reference's or, with a runtime, its graph's choices)."
    ),
    image: Path = typer.Option(
        ...,
        "--image",
        help="The model's input: an image (PNG/JPG), a clip (.mp4 ...) or a sound (.wav ...), preprocessed as `eval` and `validate` do.",
    ),
    layers: str | None = typer.Option(
        None, "--layers", help="0-based blocks to draw, e.g. 3,6,11 (default: up to 4 evenly spaced reducing blocks, the last included)."
    ),
    output: Path = typer.Option(Path("merge.png"), "--output", help="PNG to write (atomically)."),
    backend: str = typer.Option(
        defaults.VISUALIZE_REFERENCE,
        help=" | ".join(defaults.VISUALIZE_BACKENDS)
        + ": whose choices to draw (reference: the PyTorch reference's; a runtime: the exported graph's there).",
    ),
    artifacts: Path | None = typer.Option(
        None, "--artifacts", help="With a runtime backend: CONFIG's export (default: export to a temp dir)."
    ),
    checkpoint: Path | None = CHECKPOINT,
    model: str | None = MODEL,
    method: str | None = METHOD,
    r: str | None = R,
    precision: str | None = PRECISION,
    output_kind: str | None = OUTPUT_KIND,
    img_size: str | None = IMG_SIZE,
    feature_layer: int | None = FEATURE_LAYER,
    colors: str = typer.Option("mean", help="mean: each token in the mean colour of its patches | random: a colour per token."),
    json_out: bool = JSON,
):
    """Draw the image, clip or spectrogram, each patch coloured by its token after each chosen block (dimmed: dropped, hatched: fused)."""
    from deploytk.api import visualize as run_visualize

    overrides = config_overrides(checkpoint, model, method, r, precision, output_kind, img_size, feature_layer)
    model = config_or_export(config, overrides)
    with RichProgress(not json_out) as progress:
        report = run_visualize(
            model,
            image,
            output=output,
            layers=layers,
            backend=backend,
            artifacts=artifacts,
            colors=colors,
            config_name=str(config),
            progress=progress,
        )
    render.visualization(report.to_dict(), json_out)


@app.command()
@handle_errors_without_libraries
def methods(
    json_out: bool = JSON,
    markdown: bool = typer.Option(False, "--markdown", help="Print the methods as the README's Markdown table."),
):
    """List the token-reduction methods (`merge.method`) with their options (`merge.options`)."""
    # not deploytk.api.methods(): the registry imports torch and timm with every method, and `deploytk methods` answers at
    # once (issue 42). methods.json is what deploytk.api.methods() returned when scripts/write_cli_methods.py wrote it;
    # tests/merging/test_registry.py and tests/test_cli_api_parity.py hold the two equal.
    render.methods({"methods": json.loads((Path(__file__).parent / "methods.json").read_text())}, json_out, markdown)


@app.command()
@handle_errors_without_libraries
def configs(
    contains: str | None = typer.Argument(None, help="Only the configs whose name, model or method contains this text."),
    json_out: bool = JSON,
):
    """List the ready-made export configs: pass a NAME wherever a config YAML goes (deploytk export deit_small_tome_r16)."""
    from deploytk.api import configs as run_configs

    render.configs(run_configs(contains).to_dict(), json_out)


@app.command()
@handle_errors
def families(json_out: bool = JSON):
    """List the model families (`model:`) deploytk runs: timm ViTs and the Hugging Face transformers image towers."""
    from deploytk.api import families as run_families

    render.families(run_families().to_dict(), json_out)


@app.command()
@handle_errors
def calibrate(
    config: Path = typer.Argument(..., help="Config YAML with `merge.method: atm`."),
    data: Path | None = typer.Option(None, help="Folder of calibration inputs (the model family's preprocessing)."),
    synthetic: int | None = typer.Option(None, help="Use N seeded synthetic inputs instead of --data."),
    num_samples: int = typer.Option(256, help="Calibration inputs taken from --data."),
    batch_size: int = typer.Option(16, help="Calibration batch size (ATM's r is adaptive per batch)."),
    quantile: float = typer.Option(0.5, help="Per-layer statistic over batches: this quantile of ATM's r (0.5 = median)."),
    output: Path | None = typer.Option(None, help="New config path (default: CONFIG's folder/<stem>_calibrated.yaml)."),
    json_out: bool = JSON,
):
    """Run ATM dynamically on calibration data and write a config with a fixed per-layer schedule."""
    from deploytk.api import calibrate as run_calibrate

    with RichProgress() as progress:
        report = run_calibrate(
            config,
            data=data,
            synthetic=synthetic,
            num_samples=num_samples,
            batch_size=batch_size,
            quantile=quantile,
            output=output,
            progress=progress,
        )
    render.calibration(config, report.to_dict(), json_out)


@app.command()
@handle_errors
def tune(
    config: Path = typer.Argument(..., help="Export config YAML whose method's schedule knob is searched."),
    budget_ms: float = typer.Option(..., "--budget-ms", help="Latency budget in milliseconds for one batch."),
    batch_size: int = typer.Option(8, help="Batch size the budget is for."),
    backend: str = typer.Option(defaults.DEFAULT_BACKEND, help=" | ".join(defaults.BACKEND_NAMES)),
    percentile: str = typer.Option("p50", help=" | ".join(defaults.PERCENTILES) + ": the latency statistic held to the budget."),
    data: Path | None = typer.Option(None, "--data", help="ImageFolder: also measure top-1 and pick the most accurate within budget."),
    num_samples: int | None = typer.Option(256, help="With --data: inputs used per candidate (class-interleaved)."),
    inflections: str | None = typer.Option(
        None, help="r methods: ToMe inflection schedules to search as well, e.g. 0,-0.5,-1 (default: the config's)."
    ),
    output: Path | None = typer.Option(None, help="Tuned config path (default: CONFIG's folder/<stem>_tuned.yaml; .json/.png beside it)."),
    cache: Path | None = typer.Option(None, help="Where candidate exports are cached (default: artifacts/tune/<config stem>/)."),
    warmup: int = typer.Option(3, help="Warm-up runs per candidate."),
    iterations: int = typer.Option(10, help="Timed runs per candidate (alternating with the dense model, as `profile`)."),
    json_out: bool = JSON,
):
    """Find the least aggressive schedule whose latency meets --budget-ms on this backend and hardware; write it as a config."""
    from deploytk.api import tune as run_tune

    try:
        inflection_list = [float(v) for v in inflections.split(",")] if inflections else None
    except ValueError:
        raise DeploytkError(f"--inflections {inflections!r} must be comma-separated numbers, e.g. 0,-0.5,-1.") from None
    with RichProgress() as progress:
        report = run_tune(
            config,
            budget_ms,
            batch_size=batch_size,
            backend=backend,
            percentile=percentile,
            data=data,
            num_samples=num_samples,
            inflections=inflection_list,
            output=output,
            cache=cache,
            warmup=warmup,
            iterations=iterations,
            progress=progress,
            command_line=render.command_line,
        )
    render.tune(report.to_dict(), json_out)
    raise typer.Exit(0 if report.passed else 1)


@app.command()
@handle_errors
def build(
    directory: Path = typer.Argument(..., help="Artifact directory written by `deploytk export`."),
    batch_sizes: str = typer.Option("1,8,64", help="The engine's batch profile: min,opt,max (or one value)."),
    merge_impl: str = typer.Option("plugin", help="plugin (deploytk's AOT kernels) | native (TensorRT inlines the ONNX bodies)."),
    attention_impl: str = typer.Option("plugin", help="plugin (deploytk's kernel) | native (TensorRT's fused attention, log(size) mask)."),
    opt_level: int = typer.Option(3, help="TensorRT builder optimization level 0..5."),
    timing_cache: Path = typer.Option(None, help="Timing cache file, read if present and updated after the build."),
    baseline: bool = typer.Option(
        True, help="Also build the unmerged model the same way (baseline.engine), which `profile --backend trt` compares against."
    ),
    json_out: bool = JSON,
):
    """Build DIR/model.engine (+ baseline.engine, engine.json) with TensorRT and the deploytk plugins (needs TensorRT and a GPU)."""
    from deploytk.api import load

    artifact = load(directory)
    with RichProgress(not json_out) as progress:
        report = artifact.build(
            batch_sizes=batch_sizes,
            merge_impl=merge_impl,
            attention_impl=attention_impl,
            opt_level=opt_level,
            timing_cache=timing_cache,
            baseline=baseline,
            progress=progress,
        )
    render.build(directory, report.to_dict(), json_out)


@app.command()
@handle_errors
def package(
    directory: Path = typer.Argument(..., help="Artifact directory written by `deploytk export` (and `deploytk build`)."),
    triton: Path = typer.Option(..., "--triton", help="Triton Inference Server model repository to write the model into."),
    name: str | None = typer.Option(None, help="Model name (default: the artifact directory's name, sanitised)."),
    max_batch: int | None = typer.Option(
        None,
        "--max-batch",
        help=f"Triton's max_batch_size [default: ONNX {defaults.DEFAULT_ONNX_MAX_BATCH}; TensorRT engine: its profile's max, which it may "
        "not exceed].",
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Replace an earlier deploytk model at REPO/NAME (atomically; files deploytk did not write there are kept, and a folder "
        "that is not deploytk's is refused even so).",
    ),
    backend: str | None = typer.Option(
        None,
        help="The runtime Triton serves it with: ort (Triton's onnxruntime backend, 1/model.onnx) | trt (tensorrt, 1/model.plan, "
        "from `deploytk build`) | openvino (1/model.xml + .bin, validated against the reference before it is written) "
        "[default: trt when DIR has an engine, else ort].",
    ),
    data: Path | None = typer.Option(
        None,
        help="--backend openvino: validate the IR on 64 inputs of this folder (images, or clips / sounds for a video / audio "
        "model; default: seeded synthetic ones; an int8 IR needs inputs like its calibration data).",
    ),
    json_out: bool = JSON,
):
    """Write a Triton model repository entry: REPO/NAME/config.pbtxt, 1/model.onnx (model.plan, model.xml), README.md."""
    from deploytk.api import load

    with RichProgress(not json_out) as progress:
        report = load(directory).package(triton, name=name, max_batch=max_batch, force=force, progress=progress, backend=backend, data=data)
    render.package(report.to_dict(), json_out)


@app.command("eval")
@handle_errors
def eval_accuracy(
    config: Path = typer.Argument(
        ..., help="Export config (a YAML file or a ready-made name), or an export's folder (its graph against its reference)."
    ),
    data: Path = typer.Option(..., "--data", help="ImageFolder tree DIR/<class>/<image>; classes = sorted folder names."),
    artifacts: Path | None = typer.Option(
        None, "--artifacts", help="Existing `deploytk export` directory of CONFIG (default: export to a temp dir)."
    ),
    batch_size: int = typer.Option(64, "--batch-size", help="Images per batch."),
    num_samples: int | None = typer.Option(None, help="Evaluate only N inputs (class-interleaved, deterministic)."),
    backend: str = typer.Option(defaults.DEFAULT_BACKEND, help="Runtime of the exported model: " + VALIDATING_BACKENDS),
    checkpoint: Path | None = CHECKPOINT,
    model: str | None = MODEL,
    method: str | None = METHOD,
    r: str | None = R,
    precision: str | None = PRECISION,
    output_kind: str | None = OUTPUT_KIND,
    img_size: str | None = IMG_SIZE,
    feature_layer: int | None = FEATURE_LAYER,
    json_out: bool = JSON,
):
    """Top-1/top-5 on an ImageFolder of the unmerged model, the merged reference and the exported model on a runtime, with GFLOPs."""
    from deploytk.api import evaluate

    overrides = config_overrides(checkpoint, model, method, r, precision, output_kind, img_size, feature_layer)
    cfg = config_or_export(config, overrides)
    with RichProgress() as progress:
        report = evaluate(
            cfg,
            data,
            artifacts=artifacts,
            batch_size=batch_size,
            num_samples=num_samples,
            config_name=str(config),
            backend=backend,
            progress=progress,
        )
    render.evaluation(config, report.to_dict(), json_out)


@app.command()
@handle_errors
def selftest(
    json_out: bool = typer.Option(
        False, "--json", help='Print {"cases": [{"op", "dtype", "shape", "max_abs_err", "passed"}, ...]} on stdout.'
    ),
    seed: int = typer.Option(0, help="Seed of the randomized shapes and inputs."),
):
    """Run every Triton kernel against the PyTorch reference (GPU natively; CPU via TRITON_INTERPRET=1)."""
    from deploytk.api import selftest as run_selftest

    with RichProgress(not json_out) as progress:
        report = run_selftest(seed, progress)
    render.selftest(report.to_dict(), json_out)
    raise typer.Exit(0 if report.passed else 1)


@plugins_app.command("compile")
@handle_errors
def plugins_compile(
    arch: str = typer.Option(..., help=f"GPU architecture: {' | '.join(defaults.ARCHES)}."),
    output: Path = typer.Option(
        ..., help="Directory for the .ptx files and kernels.json (new, empty or an earlier one; replaced atomically)."
    ),
    force: bool = typer.Option(
        False, "--force", help="OUTPUT is an earlier kernel folder that also holds other files: replace its own files, keep the others."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print kernels.json on stdout."),
):
    """Compile every plugin kernel ahead of time to PTX (no GPU needed)."""
    # not deploytk.api: compiling the TensorRT plugins is deploytk_plugins' job (a package of its own, below deploytk)
    from deploytk_plugins.aot import compile_all

    with RichProgress(not json_out) as progress:
        index = compile_all(arch, output, progress=progress, force=force)
    render.plugins_compile(arch, output, index, json_out)


@app.command()
@handle_errors
def doctor(json_out: bool = JSON):
    """Report versions, ONNX Runtime providers, GPU and TensorRT availability."""
    from deploytk.api import doctor as run_doctor

    render.doctor(run_doctor().to_dict(), json_out)


@app.command()
@handle_errors
def clean(
    path: Path = typer.Argument(..., help="A folder outputs were written into (searched with its subfolders)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List what is stale; remove nothing."),
    json_out: bool = JSON,
):
    """Remove what killed deploytk runs left under PATH: .NAME.tmp-* / .NAME.old-* temporaries and lock files whose
    writer is gone (a live writer's are listed as in use and never touched). Nothing else is removed."""
    from deploytk.api import clean as run_clean

    render.clean(run_clean(path, dry_run=dry_run).to_dict(), json_out)


def _terminated(signum, frame):
    raise KeyboardInterrupt  # a kill (SIGTERM) cleans up like Ctrl-C: temporary folders go, nothing half-written stays


def main():  # console-script entry point
    # Third-party warnings are silenced at their sources by main_options (quiet.py) unless --verbose; deploytk's own
    # are never filtered (tests/test_hostile_inputs.py holds deploytk's code to raising none with the pinned versions).
    signal.signal(signal.SIGTERM, _terminated)
    render.show_notices()
    app()


if __name__ == "__main__":
    main()
