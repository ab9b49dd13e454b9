"""The deploytk command line: export | validate | profile | inspect | build | doctor.

Every command exits 0 on success; a DeploytkError prints one paragraph to stderr and exits
2 (validate exits 1 when the comparison fails). ``--json`` prints exactly one JSON object
on stdout and nothing else there.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from deploytk.config import DEFAULT_CONFIG
from deploytk.errors import DeploytkError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help=__doc__.splitlines()[0])
err_console = Console(stderr=True, highlight=False, soft_wrap=True)
out_console = Console(highlight=False, soft_wrap=True)


def _fail(message: str, code: int = 2):
    err_console.print(f"[bold red]error:[/] {message}", soft_wrap=True)
    raise typer.Exit(code)


def handle_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except DeploytkError as err:
            _fail(str(err))
        except KeyboardInterrupt:
            _fail("interrupted; nothing was written.", 130)

    return wrapper


@contextlib.contextmanager
def progress(enabled: bool = True):
    """A spinner on stderr with the current step; yields step(msg)."""
    if not enabled:
        yield lambda msg: None
        return
    with err_console.status("starting") as status:
        yield lambda msg: status.update(f"[cyan]{msg}...")


def _emit_json(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def _load(config: Path, **overrides):
    from deploytk.config import apply_overrides, load_config, parse_r_option

    cfg = load_config(config)
    if overrides.get("r") is not None:
        overrides["r"] = parse_r_option(overrides["r"])
    return apply_overrides(cfg, **overrides)


@app.command()
@handle_errors
def export(
    config: Path = typer.Argument(DEFAULT_CONFIG, help="Export config YAML."),
    checkpoint: Path | None = typer.Option(None, help=".safetensors or .pth state_dict to load."),
    output: Path | None = typer.Option(None, help="Artifact directory (default artifacts/<config stem>/)."),
    model: str | None = typer.Option(None, help="Override `model` (a timm ViT name)."),
    method: str | None = typer.Option(None, help="Override `merge.method`."),
    r: str | None = typer.Option(None, "--r", help="Override `merge.r`: 16 | 8,8,4 | 16:-1 (r:inflection)."),
    precision: str | None = typer.Option(None, help="Override `export.precision`: fp32 | fp16 | bf16 (precision lives in the graph)."),
    json_out: bool = typer.Option(False, "--json", help="Print the manifest as JSON on stdout."),
):
    """Export CONFIG to DIR/model.onnx + DIR/manifest.json (written atomically)."""
    from deploytk.export.pipeline import run_export

    cfg = _load(config, checkpoint=str(checkpoint) if checkpoint else None, model=model, method=method, r=r, precision=precision)
    output = output or Path("artifacts") / config.stem
    with progress() as step:
        manifest = run_export(cfg, output, step)
    if json_out:
        _emit_json({"output": str(output), **manifest})
        return
    s = manifest["schedule"]
    out_console.print(
        f"[green]exported[/] {cfg.model} ({cfg.merge.method}, r={cfg.merge.model_dump(mode='json')['r']}) -> {output}/model.onnx "
        f"in {manifest['onnx']['export_seconds']} s ({cfg.export.precision})\n"
        f"  tokens per layer: {s['tokens_per_layer']} -> {s['tokens_out']}\n"
        f"  GFLOPs: {manifest['gflops']:.2f} (unmerged {manifest['dense_gflops']:.2f})   custom ops: {manifest['custom_ops']}"
    )
    if s["capped"]:
        out_console.print(f"  [yellow]note:[/] r was capped per layer (ToMe's rule): effective r = {s['effective_r']}")


@app.command()
@handle_errors
def validate(
    directory: Path = typer.Argument(..., help="Artifact directory written by `deploytk export`."),
    backend: str = typer.Option("ort", help="ort | ort-cuda | trt"),
    images: Path | None = typer.Option(None, help="Folder of real images (default: 64 seeded synthetic images)."),
    num_images: int = typer.Option(64, help="Images to compare."),
    batch_size: int = typer.Option(8, help="Batch size of the comparison runs."),
    atol: float | None = typer.Option(None, help="Absolute tolerance on logits [fp32 1e-4, fp16 5e-2, bf16 0.2]."),
    rtol: float | None = typer.Option(None, help="Relative tolerance on logits [fp32 1e-4, fp16 5e-2, bf16 0.2]."),
    min_cosine: float | None = typer.Option(None, help="Minimum per-image cosine similarity [fp32 0.99999, fp16 0.999, bf16 0.995]."),
    min_top1: float | None = typer.Option(None, help="Minimum top-1 agreement, a fraction [fp32 1.0, fp16 0.99, bf16 0.98]."),
    max_branch_flips: float | None = typer.Option(
        None,
        help="Largest fraction of images allowed to take a different matching/selection choice at a proven near-tie "
        "[fp32 0.1, fp16/bf16 0.5].",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
):
    """Compare a backend's outputs with the PyTorch reference; exit 0 = pass, 1 = fail.

    The reference is the fp32 PyTorch model; default tolerances depend on the artifact's
    export.precision (in brackets below).

    An image outside tolerance on a model with matching/selection ops is diagnosed: if the
    backend's first different choice was made on inputs equal to the reference's within
    tolerance, and the reference replayed with the backend's choices matches it, the image
    counts as a near-tie branch flip (listed in the report) and is checked against the replay.
    """
    from deploytk.data import folder_batches, synthetic_batches
    from deploytk.export.artifacts import require_artifact_dir
    from deploytk.export.manifest import read_manifest
    from deploytk.validate.validator import Tolerances
    from deploytk.validate.validator import validate as run_validate

    if num_images < 1 or batch_size < 1:
        raise DeploytkError("--num-images and --batch-size must be >= 1.")
    manifest = read_manifest(require_artifact_dir(directory), verify_model=False)  # validate() checks the hash
    img = tuple(manifest["model"]["img_size"])
    if max_branch_flips is not None and not 0 <= max_branch_flips <= 1:
        raise DeploytkError(f"--max-branch-flips {max_branch_flips} must be a fraction in [0, 1].")
    precision = manifest["config"].get("export", {}).get("precision", "fp32")
    tol = Tolerances.for_precision(
        precision, atol=atol, rtol=rtol, min_cosine=min_cosine, min_top1_agreement=min_top1, max_branch_flips=max_branch_flips
    )
    with progress() as step:
        if images is not None:
            from deploytk.config import config_from_dict
            from deploytk.models import create_vit

            vit = create_vit(config_from_dict(manifest["config"]))
            batches = folder_batches(images, num_images, batch_size, vit)
        else:
            batches = synthetic_batches(num_images, batch_size, img)
        report = run_validate(directory, backend, batches, tol, step)
    if json_out:
        _emit_json(report.to_dict())
    else:
        table = Table(title=f"{directory}: {backend} ({precision}) vs fp32 PyTorch reference ({report.num_images} images)")
        table.add_column("metric")
        table.add_column("value", justify="right")
        table.add_column("tolerance")
        table.add_row("max |logit diff|", f"{report.max_abs_diff:.3e}", f"<= {tol.atol:g} + {tol.rtol:g}*|ref|")
        table.add_row("max diff / max |logit|", f"{report.max_rel_diff:.3e}", "")
        table.add_row("min cosine similarity", f"{report.cosine_similarity_min:.7f}", f">= {tol.min_cosine}")
        table.add_row("top-1 agreement", f"{100 * report.top1_agreement:.2f}%", f">= {100 * tol.min_top1_agreement:.2f}%")
        out_console.print(table)
        if report.emulation:
            out_console.print(f"[yellow]note:[/] {report.emulation}.")
        if report.top1_flips:
            _print_top1_flips(report, tol)
        if report.branch_flips:
            _print_branch_flips(report)
            if precision != "fp32" and images is None:
                out_console.print(
                    "[yellow]note:[/] a low-precision graph flips near-ties far more often on the synthetic noise "
                    "images than on real ones; validate with --images DIR for a representative answer."
                )
        out_console.print(
            "[bold green]PASS[/]" if report.passed else "[bold red]FAIL[/]: " + ", ".join(k for k, v in report.checks.items() if not v)
        )
    raise typer.Exit(0 if report.passed else 1)


def _print_top1_flips(report, tol) -> None:
    from deploytk.validate.validator import near_tied_logits

    flips = report.top1_flips
    shown = ", ".join(f"#{f['image']} ({f['reference_top1']}->{f['backend_top1']}, margin {f['reference_margin']:.2e})" for f in flips[:5])
    out_console.print(f"top-1 flips (image, reference->backend class, reference logit margin): {shown}{' ...' if len(flips) > 5 else ''}")
    if all(near_tied_logits(f, tol) for f in flips):
        out_console.print(
            "[yellow]note:[/] every flipped image's two classes are closer in the reference than the logit tolerance "
            "allows either to move (near-tied logits, typical of random weights); validate a real checkpoint "
            "with --images DIR for a representative top-1 agreement."
        )


def _print_branch_flips(report) -> None:
    flips = Table(title="images that took a different matching/selection choice than the reference")
    for col in ("image", "first flip", "moved", "input Δ", "op agrees", "replay Δ", "near-tie"):
        flips.add_column(col)
    for f in report.branch_flips:
        where = f"{f['op']} #{f['call']}" if f["op"] else "none (same choices)"
        flips.add_row(
            str(f["image"]),
            where,
            str(f["tokens_changed"]),
            f"{f['input_rel_diff']:.1e}",
            "yes" if f["op_reproduces_backend"] else "no",
            f"{f['replay_max_abs_diff']:.1e}",
            "[green]yes[/]" if f["explained"] else "[red]no[/]",
        )
    out_console.print(flips)
    sb = report.same_branch
    out_console.print(
        f"against the reference replayed on the backend's choices: max |logit diff| {sb['max_abs_diff']:.3e}, "
        f"min cosine {sb['cosine_similarity_min']:.7f}, top-1 {100 * sb['top1_agreement']:.2f}%"
    )


@app.command()
@handle_errors
def profile(
    directory: Path = typer.Argument(..., help="Artifact directory written by `deploytk export`."),
    backend: str = typer.Option("ort", help="ort | ort-cuda | torch | trt"),
    batch_sizes: str = typer.Option("1,8", help="Comma-separated batch sizes, e.g. 1,8,32."),
    warmup: int = typer.Option(5, help="Warm-up runs per model and batch size."),
    iterations: int = typer.Option(20, help="Timed runs per model and batch size (alternating)."),
    json_out: bool = typer.Option(False, "--json", help="Print results as JSON on stdout."),
):
    """Latency of the merged model and of the same weights without merging, measured in one run."""
    from deploytk.profile.profiler import profile as run_profile

    try:
        sizes = [int(v) for v in batch_sizes.split(",") if v.strip()]
    except ValueError:
        raise DeploytkError(f"--batch-sizes {batch_sizes!r} must be comma-separated ints, e.g. 1,8,32.") from None
    with progress() as step:
        result = run_profile(directory, backend, sizes, warmup, iterations, step)
    if json_out:
        _emit_json(result)
        return
    table = Table(
        title=f"{result['model']} {result['method']} r={result['r']} {result['precision']} on {backend} ({result['device'].get('gpu') or result['device'].get('cpu', '')})"
    )
    for col in ("batch", "merged p50 ms", "p90", "p99", "mean", "img/s", "dense p50 ms", "speedup"):
        table.add_column(col, justify="right")
    for row in result["results"]:
        lat, dense = row["latency_ms"], row["dense"]["latency_ms"]
        table.add_row(
            str(row["batch_size"]),
            f"{lat['p50']:.2f}",
            f"{lat['p90']:.2f}",
            f"{lat['p99']:.2f}",
            f"{lat['mean']:.2f}",
            f"{row['throughput']:.1f}",
            f"{dense['p50']:.2f}",
            f"{row['speedup_vs_dense']:.2f}x",
        )
    out_console.print(table)


@app.command()
@handle_errors
def inspect(
    config: Path = typer.Argument(DEFAULT_CONFIG, help="Export config YAML."),
    model: str | None = typer.Option(None, help="Override `model`."),
    method: str | None = typer.Option(None, help="Override `merge.method`."),
    r: str | None = typer.Option(None, "--r", help="Override `merge.r`."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
):
    """Token schedule and GFLOPs (fvcore convention) per layer and in total; no weights needed."""
    from deploytk.export.pipeline import flops_summary, schedule_summary
    from deploytk.models import build_reference

    cfg = _load(config, model=model, method=method, r=r).model_copy(update={"checkpoint": None, "pretrained": False})
    with progress() as step:
        step("building the model")
        ref = build_reference(cfg)
        step("counting FLOPs")
        flops = flops_summary(ref)
    sched = schedule_summary(ref)
    from deploytk.export.pipeline import method_summary

    report = {
        "model": cfg.model,
        "method": cfg.merge.method,
        "r": cfg.merge.model_dump(mode="json")["r"],
        "prop_attn": cfg.merge.prop_attn,
        "method_options": method_summary(cfg)["options"],
        **sched,
        **flops,
    }
    if json_out:
        _emit_json(report)
        return
    table = Table(title=f"{cfg.model}  {cfg.merge.method}  r={report['r']}")
    for col in ("block", "tokens in", "r", "GFLOPs"):
        table.add_column(col, justify="right")
    for i, (t, rr, g) in enumerate(zip(sched["tokens_per_layer"], sched["effective_r"], flops["gflops_per_layer"])):
        table.add_row(str(i), str(t), str(rr), f"{g:.3f}")
    out_console.print(table)
    shown = {k: v for k, v in report["method_options"].items() if k != "calibration"}
    if shown:
        out_console.print(f"{cfg.merge.method} options: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    out_console.print(
        f"total {flops['gflops']:.2f} GFLOPs (unmerged {flops['dense_gflops']:.2f}, {flops['flop_reduction']:.2f}x fewer); "
        f"tokens out of the last block: {sched['tokens_out']}"
    )
    if sched["capped"]:
        out_console.print(
            f"[yellow]note:[/] r capped per layer (ToMe's rule): requested {sched['requested_r']}, effective {sched['effective_r']}"
        )


@app.command()
@handle_errors
def methods(json_out: bool = typer.Option(False, "--json", help="Print the methods as JSON on stdout.")):
    """List the token-reduction methods (`merge.method`) with their options (`merge.options`)."""
    from deploytk.merging.registry import METHODS

    report = []
    for m in METHODS.values():
        opts = [
            {"name": name, "type": str(f.annotation).replace("typing.", ""), "default": f.default, "description": f.description or ""}
            for name, f in m.options.model_fields.items()
        ]
        report.append({"name": m.name, "summary": m.summary, "uses_r": m.uses_r, "ops": list(m.ops), "options": opts})
    if json_out:
        _emit_json({"methods": report})
        return
    table = Table(title="token-reduction methods (merge.method / merge.options)", show_lines=True)
    for col in ("method", "what it does", "options (default)"):
        table.add_column(col)
    for m in report:
        opts = "\n".join(f"{o['name']} = {o['default']!r}: {o['description']}" for o in m["options"]) or "-"
        r_note = "" if m["uses_r"] else " Uses keep_rate, not merge.r."
        table.add_row(m["name"], f"{m['summary']}.{r_note}\nops: {', '.join(m['ops'])}", opts)
    out_console.print(table)


@app.command()
@handle_errors
def calibrate(
    config: Path = typer.Argument(..., help="Config YAML with `merge.method: atm`."),
    images: Path | None = typer.Option(None, help="Folder of calibration images (timm preprocessing)."),
    synthetic: int | None = typer.Option(None, help="Use N seeded synthetic images instead of --images."),
    num_images: int = typer.Option(256, help="Calibration images taken from --images."),
    batch_size: int = typer.Option(16, help="Calibration batch size (ATM's r is adaptive per batch)."),
    quantile: float = typer.Option(0.5, help="Per-layer statistic over batches: this quantile of ATM's r (0.5 = median)."),
    output: Path | None = typer.Option(None, help="New config path (default: CONFIG's folder/<stem>_calibrated.yaml)."),
    json_out: bool = typer.Option(False, "--json", help="Print the calibration report as JSON on stdout."),
):
    """Run ATM dynamically on calibration data and write a config with a fixed per-layer schedule."""
    import os
    import tempfile

    import yaml

    from deploytk.data import folder_batches, synthetic_batches
    from deploytk.merging.calibrate import calibrate as run_calibrate
    from deploytk.merging.calibrate import require_atm
    from deploytk.models import create_vit

    cfg = _load(config)
    if (images is None) == (synthetic is None):
        raise DeploytkError("calibration needs images: pass exactly one of --images DIR or --synthetic N.")
    if synthetic is not None and synthetic < 1:
        raise DeploytkError(f"--synthetic {synthetic}: calibration needs at least 1 image.")
    if batch_size < 1 or num_images < 1:
        raise DeploytkError("--batch-size and --num-images must be >= 1.")
    require_atm(cfg)
    output = output or config.with_name(f"{config.stem}_calibrated.yaml")
    with progress() as step:
        step("loading calibration images")
        if images is not None:
            batches = folder_batches(images, num_images, batch_size, create_vit(cfg))
            source = f"images: {images}"
        else:
            img = cfg.export.img_size or 224
            batches = synthetic_batches(synthetic, batch_size, (img, img))
            source = f"synthetic: {synthetic} seeded standard-normal images"
        done = [0]

        def tick():
            done[0] += 1
            step(f"running ATM on batch {done[0]}/{len(batches)}")

        data, report = run_calibrate(cfg, batches, quantile, source, tick)
    header = f"# Calibrated by `deploytk calibrate {config}` ({report['statistic']}).\n"
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(header + yaml.safe_dump(data, sort_keys=False))
        os.replace(tmp, output)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if json_out:
        _emit_json({"output": str(output), **report})
        return
    out_console.print(
        f"[green]calibrated[/] {config} -> {output}\n  r per layer: {report['r']}\n  from {report['images']} images in {report['batches']} batches ({source}); {report['statistic']}"
    )


@app.command()
@handle_errors
def build(
    directory: Path = typer.Argument(..., help="Artifact directory written by `deploytk export`."),
    batch: str = typer.Option("1,8,64", help="Optimization profile of the batch: min,opt,max (or one value)."),
    merge_impl: str = typer.Option("plugin", help="plugin (deploytk's AOT kernels) | native (TensorRT inlines the ONNX bodies)."),
    attention_impl: str = typer.Option("plugin", help="plugin (deploytk's kernel) | native (TensorRT's fused attention, log(size) mask)."),
    opt_level: int = typer.Option(3, help="TensorRT builder optimization level 0..5."),
    timing_cache: Path = typer.Option(None, help="Timing cache file, read if present and updated after the build."),
    baseline: bool = typer.Option(
        True, help="Also build the unmerged model the same way (baseline.engine), which `profile --backend trt` compares against."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the engine manifest as JSON on stdout."),
):
    """Build DIR/model.engine (+ baseline.engine, engine.json) with TensorRT and the deploytk plugins (needs TensorRT and a GPU)."""
    from deploytk.build.builder import build_engine
    from deploytk.build.options import build_options
    from deploytk.export.artifacts import require_artifact_dir

    options = build_options(
        batch,
        merge_impl=merge_impl,
        attention_impl=attention_impl,
        opt_level=opt_level,
        timing_cache=str(timing_cache) if timing_cache else None,
        baseline=baseline,
    )
    require_artifact_dir(directory)
    with progress(not json_out) as step:
        record = build_engine(directory, options, step)
    if json_out:
        _emit_json(record)
    else:
        out_console.print(
            f"[green]built[/] {directory / 'model.engine'} in {record['build_seconds']} s "
            f"(TensorRT {record['tensorrt']}, {record['gpu']}; plugins: {', '.join(record['plugin_ops']) or 'none'})"
        )


@app.command("eval")
@handle_errors
def eval_accuracy(
    config: Path = typer.Argument(..., help="Export config YAML (model, weights, merge schedule)."),
    data: Path = typer.Option(..., "--data", help="ImageFolder tree DIR/<class>/<image>; classes = sorted folder names."),
    artifacts: Path | None = typer.Option(
        None, "--artifacts", help="Existing `deploytk export` directory of CONFIG (default: export to a temp dir)."
    ),
    batch_size: int = typer.Option(64, "--batch-size", help="Images per batch."),
    limit: int | None = typer.Option(None, "--limit", help="Evaluate only N images (class-interleaved, deterministic)."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
):
    """Top-1/top-5 on an ImageFolder of the unmerged model, the merged reference and ONNX Runtime, with GFLOPs."""
    from deploytk.evaluate.accuracy import evaluate, scan_image_folder

    if batch_size < 1:
        raise DeploytkError(f"--batch-size {batch_size}: must be an int >= 1.")
    scan_image_folder(data, limit)  # bad --data / --limit fail before the model is built
    cfg = _load(config)
    report = evaluate(cfg, data, artifacts=artifacts, batch_size=batch_size, limit=limit, config_name=str(config), console=err_console)
    if json_out:
        _emit_json(report)
        return
    k = report["topk"]
    options = report["merge"].get("options") or {}
    settings = ", ".join(f"{key}={value}" for key, value in options.items()) if options else f"r={report['r']}"
    table = Table(
        title=f"{config}: {report['method']} {settings} on {report['data']} ({report['num_images']} images, {report['num_classes']} classes)"
    )
    for col in ("model", "top-1", f"top-{k}", "GFLOPs"):
        table.add_column(col, justify="right" if col != "model" else "left")
    table.add_row(
        "dense (timm, unmerged)",
        f"{100 * report['dense']['top1']:.2f}%",
        f"{100 * report['dense']['top5']:.2f}%",
        f"{report['dense_gflops']:.4f}",
    )
    table.add_row(
        "reference (PyTorch, merged)",
        f"{100 * report['reference']['top1']:.2f}%",
        f"{100 * report['reference']['top5']:.2f}%",
        f"{report['gflops']:.4f}",
    )
    low = report["precision"] + (" emulated" if report["ort_emulation"] else "") if report["precision"] != "fp32" else ""
    table.add_row(
        f"ONNX Runtime (merged{', ' + low if low else ''})",
        f"{100 * report['ort']['top1']:.2f}%",
        f"{100 * report['ort']['top5']:.2f}%",
        f"{report['gflops']:.4f}",
    )
    out_console.print(table)
    out_console.print(
        f"ORT vs reference top-1 agreement: {100 * report['agreement']:.2f}%   "
        f"reference vs dense: {100 * report['reference_vs_dense_agreement']:.2f}%   "
        f"({report['seconds']['total']:.1f} s{', ONNX exported to a temporary directory' if report['artifacts'] is None else ''})"
    )


@app.command()
@handle_errors
def selftest(
    json_out: bool = typer.Option(
        False, "--json", help='Print {"cases": [{"op", "dtype", "shape", "max_abs_err", "passed"}, ...]} on stdout.'
    ),
    seed: int = typer.Option(0, help="Seed of the randomized shapes and inputs."),
):
    """Run every Triton kernel against the PyTorch reference (GPU natively; CPU via TRITON_INTERPRET=1)."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        import torch

        if not torch.cuda.is_available():
            raise DeploytkError(
                "selftest runs the Triton kernels natively on a CUDA GPU, and none is available here.",
                hint="Run `TRITON_INTERPRET=1 deploytk selftest` to run them in Triton's CPU interpreter (small shapes).",
            )
    try:
        import triton  # noqa: F401
    except ImportError:
        raise DeploytkError("selftest needs Triton (`pip install triton`).") from None
    from deploytk.kernels import selftest as st

    with progress(not json_out) as step:
        step("running the kernels against the PyTorch reference")
        cases = st.run(seed)
    report = st.to_json(cases)
    if json_out:
        _emit_json(report)
    else:
        env = report["environment"]
        table = Table(title=f"deploytk selftest ({env['mode']}, Triton {env['triton']}{', ' + env['gpu'] if 'gpu' in env else ''})")
        for col in ("op", "dtype", "shape", "max err (rel. to scale)", "tolerance", "result"):
            table.add_column(col)
        for c in cases:
            shape = " ".join(f"{k}={v}" for k, v in c.shape.items())
            result = "[green]pass[/]" + (f" ({c.near_ties} near-tie images)" if c.near_ties else "") if c.passed else "[red]FAIL[/]"
            table.add_row(c.op, c.dtype, shape, f"{c.max_abs_err:.2e}", f"{c.tolerance:.0e}", result)
        out_console.print(table)
        for dtype, why in env.get("skipped", {}).items():
            out_console.print(f"skipped {dtype}: {why}")
        n_fail = sum(not c.passed for c in cases)
        out_console.print("[bold green]PASS[/]" if not n_fail else f"[bold red]FAIL[/]: {n_fail} of {len(cases)} cases")
    raise typer.Exit(0 if report["passed"] else 1)


plugins_app = typer.Typer(no_args_is_help=True, help="TensorRT plugin kernels (AOT Triton).")
app.add_typer(plugins_app, name="plugins")


@plugins_app.command("compile")
@handle_errors
def plugins_compile(
    arch: str = typer.Option(..., help="GPU architecture: sm_80 | sm_86 | sm_89 | sm_90."),
    output: Path = typer.Option(..., help="Directory for the .ptx files and kernels.json (replaced atomically)."),
    json_out: bool = typer.Option(False, "--json", help="Print kernels.json on stdout."),
):
    """Compile every plugin kernel ahead of time to PTX (no GPU needed)."""
    from plugins.aot import ARCHES, compile_all

    if arch not in ARCHES:
        raise DeploytkError(f"--arch {arch!r} is not supported; choose one of {', '.join(ARCHES)}.")
    with progress(not json_out) as step:
        index = compile_all(arch, output, step=step)
    if json_out:
        _emit_json(index)
    else:
        for k in index["kernels"]:
            out_console.print(f"{output / k['file']}  ({k['kernel_name']}, {k['num_warps']} warps, {k['shared_mem']} B shared)")
        out_console.print(f"[bold green]{len(index['kernels'])} kernels[/] compiled for {arch}; index: {output / 'kernels.json'}")


@app.command()
@handle_errors
def doctor(json_out: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout.")):
    """Report versions, ONNX Runtime providers, GPU and TensorRT availability."""
    from deploytk.doctor import environment_report

    report = environment_report()
    if json_out:
        _emit_json(report)
        return
    table = Table(title="deploytk doctor", show_header=False)
    table.add_column("what")
    table.add_column("value")
    for name, version in report["packages"].items():
        table.add_row(name, version or "[red]not installed[/]")
    table.add_row(
        "onnxruntime providers",
        ", ".join(report["onnxruntime_providers"])
        if isinstance(report["onnxruntime_providers"], list)
        else str(report["onnxruntime_providers"]),
    )
    table.add_row("torch CUDA build", str(report["torch_cuda_build"]))
    table.add_row("GPU", report["gpu"] or "none (CPU only)")
    table.add_row("triton", report["triton"] or "not installed")
    table.add_row("TensorRT", report["tensorrt"] or f"[yellow]absent[/]: {report['tensorrt_hint']}")
    out_console.print(table)


def main():  # console-script entry point
    import warnings

    # fvcore's tracer and torch.onnx emit deprecation chatter that says nothing to a user
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    app()


if __name__ == "__main__":
    main()
