"""What the CLI prints: one function per command (a rich table or JSON on stdout), progress and errors on stderr."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from deploytk import progress as library_progress
from deploytk.defaults import VISUALIZE_REFERENCE
from deploytk.errors import PARAMETER, DeploytkNotice

err_console = Console(stderr=True, highlight=False, soft_wrap=True)
out_console = Console(highlight=False, soft_wrap=True)


def running_command_context():
    """The click context of the command whose body is running, or None outside one."""
    try:
        from typer._click.globals import get_current_context  # typer >= 0.26 keeps a copy of click of its own
    except ImportError:  # an older typer runs on click itself
        from click import get_current_context

    return get_current_context(silent=True)


def running_command():
    """The click command whose body is running (None outside one): its parameters are the flags a message may name."""
    context = running_command_context()
    return None if context is None else context.command


def _options(command) -> dict:
    """A click command's options by their Python name (the library's keyword)."""
    return {p.name: p for p in command.params if getattr(p, "param_type_name", None) == "option"}


def _long_flags(option) -> list[str]:
    """An option's long spellings (``--format``), or its short ones where it has no long one."""
    return [o for o in option.opts if o.startswith("--")] or option.opts


def in_flags(message: str, command=None) -> str:
    """The library names parameters (`num_images=0`, deploytk.errors.PARAMETER); the CLI user typed flags. Each marked
    parameter that ``command`` (default: the running one) declares as an option becomes its flag with the value
    (`fmt='x'` -> --format 'x'; True -> the switch, False -> its off switch); any other stays as the library wrote it.
    The flags are the command's own click options, so no table of them is kept here."""
    command = command if command is not None else running_command()
    if command is None:
        return message
    options = _options(command)

    def flag(match) -> str:
        option, value = options.get(match.group(1)), match.group(2)
        if option is None:
            return match.group(0)
        long_opts = _long_flags(option)
        if option.is_flag and value in ("True", "False"):
            if value == "True":
                return long_opts[0]
            return option.secondary_opts[0] if option.secondary_opts else match.group(0)
        return f"{long_opts[0]} {value}" if value else long_opts[0]

    return PARAMETER.sub(flag, message)


def command_line(argument, arguments: dict) -> str:
    """The shell command that reproduces a run of the running command (for the library's ``command_line``): its
    argument, then each keyword argument as the option the command declares for it (lists comma-separated, True as the
    switch, None left out), from the command's own click options."""
    import shlex

    context = running_command_context()
    options = _options(context.command)
    words = ["deploytk", *context.command_path.split()[1:], str(argument)]
    for name, value in arguments.items():
        flag = _long_flags(options[name])[0]
        if value is None or value is False:
            continue
        if value is True:
            words.append(flag)
        elif isinstance(value, list | tuple):
            words += [flag, ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)]
        else:
            words += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return shlex.join(words)


def fail(message: str, code: int = 2):
    """The error paragraph on stderr, the library's parameter names turned into the running command's flags."""
    err_console.print(f"[bold red]error:[/] {escape(in_flags(message))}", soft_wrap=True)  # escaped: messages quote [brackets]
    raise typer.Exit(code)


def note(message: str) -> None:
    """A line on stderr the user should see whatever the output format (stdout stays one JSON object with --json)."""
    err_console.print(f"[dim]note:[/] {escape(in_flags(message))}")


def show_notices() -> None:
    """The library's ``DeploytkNotice`` warnings (a killed run's temporaries removed, a cache entry rebuilt) as ``note:``
    lines; every other warning is shown as Python shows it."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, DeploytkNotice):
            note(str(message))
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    warnings.simplefilter("always", DeploytkNotice)  # each one is news, not a repeat to fold


def emit_json(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


class _Counted(ProgressColumn):
    """A column shown only while the phase has a known size: a step of unknown length shows no bar and no ``0/?``."""

    def __init__(self, column: ProgressColumn):
        super().__init__()
        self.column = column

    def render(self, task) -> Text:
        return Text("") if task.total is None else self.column.render(task)


class _Count(ProgressColumn):
    """``done/total`` of a counted phase."""

    def render(self, task) -> Text:
        return Text(f"{int(task.completed)}/{int(task.total)}", style="progress.download")


class RichProgress(library_progress.Progress):
    """The library's progress on stderr: a spinner with the current step, a bar and ``done/total`` for counted phases."""

    def __init__(self, enabled: bool = True, console: Console | None = None):
        self.enabled = enabled
        self.console = console or err_console
        self._bar = None

    def __enter__(self) -> RichProgress:
        if self.enabled:
            columns = (
                SpinnerColumn(),
                TextColumn("[cyan]{task.description}"),
                _Counted(BarColumn()),
                _Counted(_Count()),
                TimeElapsedColumn(),
            )
            self._bar = Progress(*columns, console=self.console, transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task("starting", total=None)
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def step(self, message: str) -> None:
        if self._bar is not None:
            self._bar.reset(self._task, total=None, description=f"{message}...")

    def start(self, total: int, message: str) -> None:
        if self._bar is not None:
            self._bar.reset(self._task, total=total, description=message)

    def advance(self, units: int = 1) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, units)


def _table(title: str, columns, **kwargs) -> Table:
    table = Table(title=title, **kwargs)
    for col in columns:
        table.add_column(col)
    return table


def _settings(r, options: dict) -> str:
    """What a schedule is set by: r for the r methods, the options for the keep-rate ones (which have no r)."""
    shown = {k: v for k, v in options.items() if k != "calibration"}
    if isinstance(r, dict):  # (r, inflection), as the CLI writes it
        r = f"{r['r']}:{r['inflection']:g}"
    return f"r={r}" if r is not None else ", ".join(f"{k}={v}" for k, v in shown.items())


def export(report: dict, json_out: bool) -> None:
    """``report``: the artifact's ``to_dict()``, ``{"directory": DIR, **manifest}``."""
    if json_out:
        return emit_json(report)
    manifest, output = report, report["directory"]
    s = manifest["schedule"]
    merge = manifest["config"]["merge"]
    settings = _settings(merge.get("r"), manifest["method"]["options"])
    out_console.print(
        f"[green]exported[/] {manifest['model']['name']} ({merge['method']}, {settings}) -> {output}/model.onnx "
        f"in {manifest['onnx']['export_seconds']} s ({manifest['onnx']['precision']})\n"
        f"  tokens per layer: {s['tokens_per_layer']} -> {s['tokens_out']}\n"
        f"  GFLOPs: {manifest['gflops']:.2f} (unmerged {manifest['dense_gflops']:.2f})   custom ops: {manifest['custom_ops']}"
    )
    if manifest.get("onnx_inlined"):
        out_console.print(f"  inlined copy (standard ops only, for OpenVINO): {output}/{manifest['onnx_inlined']['file']}")
    if manifest.get("onnx_ort"):
        fused = ", ".join(f"{op} {n}" for op, n in manifest["onnx_ort"]["fusions"].items())
        out_console.print(f"  ONNX Runtime's fused copy ({fused}): {output}/{manifest['onnx_ort']['file']}")
    for note in (manifest.get("notes") or {}).values():  # what the export said (a capped r, a reference not rebuildable elsewhere)
        out_console.print(f"  [yellow]note:[/] {escape(in_flags(note))}", soft_wrap=True)


def _output_line(output: dict) -> str:
    """inspect's line on what the graph outputs (``export.output``)."""
    kind, layer = output["kind"], output["feature_layer"]
    where = "the final features" if layer is None else f"feature layer {layer} (after {output['blocks_run']} blocks)"
    if kind == "tokens":
        prefix = "prefix tokens kept" if output["keep_prefix_tokens"] else "prefix tokens dropped"
        return f"output: tokens, K = {output['tokens']} from {where}, {prefix}; outputs {', '.join(output['names'])}"
    if kind == "patch_features":
        return f"output: patch_features (every patch, unmerged) from {where}"
    return f"output: {kind} ({output['names'][0]})"


def validations(directory: Path, report: dict, real_images: bool, json_out: bool) -> None:
    """``report``: the ValidationReport's ``to_dict()`` (JSON: all of it, ``passed``, ``backends`` and one report per
    backend in the order given). One backend: its table; several: each table, then one verdict line."""
    if json_out:
        return emit_json(report)
    reports = report["reports"]
    for each in reports:
        validation(directory, each, real_images)
    if len(reports) > 1:
        failed = [f"{r['backend']} ({failed_checks(r)})" for r in reports if not r["passed"]]
        verdict = f"[bold red]FAIL[/] on {'; '.join(failed)}" if failed else "[bold green]PASS[/] on every backend"
        out_console.print(f"{verdict} ({', '.join(report['backends'])}; the reference ran once)")


def validation(directory: Path, report: dict, real_images: bool) -> None:
    """One backend's report (a dict of ``deploytk.validate.validator.ValidationReport``'s fields) as a table."""
    tol = report["tolerances"]
    title = f"{directory}: {report['backend']} ({report['precision']}) vs fp32 PyTorch reference ({report['num_images']} images)"
    table = _table(title, ("metric", "value", "tolerance"))
    what = {"logits": "logit", "patch_features": "patch feature", "tokens": "token feature"}.get(report["output_kind"], "embedding")
    int8 = report["choices"] is not None
    bound = "reported, not judged (int8)" if int8 else f"<= {tol['atol']:g} + {tol['rtol']:g}*|ref|"
    table.add_row(f"max |{what} diff|", f"{report['max_abs_diff']:.3e}", bound)
    table.add_row(f"max diff / max |{what}|", f"{report['max_rel_diff']:.3e}", "")
    table.add_row("min cosine similarity", f"{report['cosine_similarity_min']:.7f}", "" if int8 else f">= {tol['min_cosine']}")
    table.add_row("mean cosine similarity", f"{report['cosine_similarity_mean']:.7f}", f">= {tol['min_cosine']}" if int8 else "")
    if report["top1_agreement"] is None:
        table.add_row("top-1 agreement", f"n/a ({report['output_kind']} output, no classes)", "")
    else:
        table.add_row("top-1 agreement", f"{100 * report['top1_agreement']:.2f}%", "")
        counted = f"{100 * report['top1_agreement_counted']:.2f}%"
        table.add_row("  counting only flips outside tolerance", counted, f">= {100 * tol['min_top1_agreement']:.2f}%")
    if report["matching_decisions"] and not int8:  # int8 judges every choice on the runtime's inputs instead
        table.add_row(
            "flipped matching decisions",
            f"{report['flipped_choices']:,} of {report['matching_decisions']:,} ({_percent(report['flipped_choice_fraction'])})",
            f"<= {_percent(tol['max_flipped_choices'])}",
        )
    if tol["max_branch_flips"] is not None:
        table.add_row(
            "images with branch flips (deprecated bound)",
            f"{len(report['branch_flips'])} of {report['num_images']}",
            f"<= {_percent(tol['max_branch_flips'])}",
        )
    out_console.print(table)
    if report["emulation"]:
        out_console.print(f"[yellow]note:[/] {report['emulation']}.")
    if int8:
        _int8_choices(report)
    if report["top1_flips"]:
        _top1_flips(report)
    if report["branch_flips"]:
        _branch_flips(report)
        if report["precision"] != "fp32" and not real_images:
            out_console.print(
                "[yellow]note:[/] a low-precision graph flips near-ties far more often on the synthetic noise "
                "images than on real ones; validate with --data DIR for a representative answer."
            )
    out_console.print("[bold green]PASS[/]" if report["passed"] else f"[bold red]FAIL[/]: {failed_checks(report)}")


def failed_checks(report: dict) -> str:
    """The checks one backend's report failed, by name: what its summary line says."""
    return escape(", ".join(k for k, v in report["checks"].items() if not v))


def _int8_choices(report: dict) -> None:
    c = report["choices"]
    out_console.print(
        f"int8: {c.get('images_with_other_choices', 0)} of {report['num_images']} images merge or select differently from the fp32 "
        "reference (their metric and scores come from int8 projections); "
        + (
            "every choice is the op's own on the runtime's inputs"
            if not c.get("unreproduced")
            else f"[red]{len(c['unreproduced'])} choices are not the op's own[/] (first: {c['unreproduced'][0]})"
        )
        + ("" if not c["quantized_inputs"] else f"; [red]quantized matching inputs[/]: {', '.join(c['quantized_inputs'][:3])}")
        + "."
    )


def _top1_flips(report: dict) -> None:
    flips = report["top1_flips"]
    shown = ", ".join(
        f"#{f['image']} ({f['reference_top1']}->{f['backend_top1']}, margin {f['reference_margin']:.2e}"
        f"{', within tolerance' if f.get('within_tolerance') else ''})"
        for f in flips[:5]
    )
    more = " ..." if len(flips) > 5 else ""
    out_console.print(f"top-1 flips (image, reference->backend class, reference logit margin): {shown}{more}")
    if report["top1_flips_within_tolerance"]:
        why = (
            "the two classes' reference logits are within 2 x atol of each other"
            if report["choices"] is not None  # int8: the element-wise error is not judged, the margin alone decides
            else "every logit is within atol/rtol and the two classes are closer in the reference than the tolerance lets either move"
        )
        out_console.print(
            f"[yellow]note:[/] {report['top1_flips_within_tolerance']} of {len(flips)} flip(s) are within tolerance: {why} "
            "(near-tied logits, typical of random weights). They are reported, not counted against --min-top1; "
            "validate a real checkpoint with --data DIR for a representative top-1 agreement."
        )


def _percent(fraction: float) -> str:
    """A share as a percentage with two significant digits (0.0068% of a video's decisions, 50% of the images)."""
    return f"{100 * fraction:.2g}%"


def _branch_flips(report: dict) -> None:
    columns = ("image", "first flip", "moved", "input Δ", "op agrees", "calls", "decisions", "replay Δ", "near-tie")
    flips = _table("images that took a different matching/selection choice than the reference", columns)
    for f in report["branch_flips"]:
        where = f"{f['op']} #{f['call']}" if f["op"] else "none (same choices)"
        unproven = f.get("first_unproven_call")
        flips.add_row(
            str(f["image"]),
            where,
            str(f["tokens_changed"]),
            f"{f['input_rel_diff']:.1e}",
            "yes" if f["op_reproduces_backend"] else "no",
            str(f["calls_flipped"]),
            str(f["choices_flipped"]),
            f"{f['replay_max_abs_diff']:.1e}",
            "[green]yes[/]" if f["explained"] else "[red]no[/]" + ("" if unproven is None else f" (#{unproven} unproven)"),
        )
    out_console.print(flips)
    sb = report["same_branch"]
    out_console.print(
        f"against the reference replayed on the backend's choices: max |logit diff| {sb['max_abs_diff']:.3e}, "
        f"min cosine {sb['cosine_similarity_min']:.7f}"
        + ("" if sb["top1_agreement"] is None else f", top-1 {100 * sb['top1_agreement']:.2f}%")
    )


def profile(result: dict, json_out: bool) -> None:
    if json_out:
        return emit_json(result)
    device = result["device"].get("gpu") or result["device"].get("cpu", "")
    settings = _settings(result["r"], result["method_options"])
    title = f"{result['model']} {result['method']} {settings} {result['precision']} on {result['device']['backend']} ({device})"
    table = _table(title, ())
    for col in ("batch", "p50 ms", "p90", "p99", "max", "runs", "img/s", "dense p50", "speedup"):  # mean: in --json
        table.add_column(col, justify="right", no_wrap=True)
    for row in result["results"]:
        lat, dense = row["latency_ms"], row["dense"]["latency_ms"]
        cells = [lat.get(k) for k in ("p50", "p90", "p99", "max")]  # p90/p99 only where enough runs back them
        table.add_row(
            str(row["batch_size"]),
            *("-" if v is None else f"{v:.2f}" for v in cells),
            str(lat["samples"]),
            f"{row['throughput']:.1f}",
            f"{dense['p50']:.2f}",
            f"{row['speedup_vs_dense']:.2f}x",
        )
    out_console.print(table)
    for warning in result["warnings"]:
        out_console.print(f"[yellow]warning:[/] {escape(warning['message'])}; try:")
        for suggestion in warning["suggestions"]:
            out_console.print(f"  - {escape(in_flags(suggestion))}")


def tune(report: dict, json_out: bool) -> None:
    if json_out:
        return emit_json(report)
    title = (
        f"{report['model']} {report['method']}: {report['percentile']} at batch {report['batch']} on {report['backend']}, "
        f"budget {report['budget_ms']:g} ms"
    )
    table = _table(title, ())
    for col in ("candidate", "GFLOPs", f"{report['percentile']} ms", "runs", "dense ms", "top-1", "budget"):
        table.add_column(col, justify="right")
    chosen = (report["chosen"] or {}).get("label")
    for row in report["measured"]:
        verdict = "[green]meets[/]" if row["meets_budget"] else "[red]misses[/]"
        top1 = f"{100 * row['top1']:.1f}%" if row["top1"] is not None else "-"
        name = f"[bold]{escape(row['label'])} <-[/]" if row["label"] == chosen else escape(row["label"])
        runs = len(row["runs_ms"])
        table.add_row(name, f"{row['gflops']:.3f}", f"{row['latency_ms']:.2f}", str(runs), f"{row['dense_latency_ms']:.2f}", top1, verdict)
    out_console.print(table)
    style = {"ok": "green", "dense": "yellow", "impossible": "red"}[report["outcome"]]
    out_console.print(f"[{style}]{escape(report['message'])}[/]")
    out_console.print(
        f"  {report['measurements']} profile runs of {report['exports']} exports ({report['candidates']} candidate schedules); "
        f"report {report['report']}" + (f", plot {report['plot']}" if report["plot"] else "")
    )
    if report["output"]:
        out_console.print(f"  tuned config: {report['output']}")


def inspect(report: dict, json_out: bool) -> None:
    if json_out:
        return emit_json(report)
    if "schedules" in report:
        return schedules(report)
    table = _table(f"{report['model']}  {report['method']}  {_settings(report['r'], report['method_options'])}", ())
    for col in ("block", "tokens in", "r" if report["r"] is not None else "removed", "GFLOPs"):
        table.add_column(col, justify="right")
    for i, (t, rr, g) in enumerate(zip(report["tokens_per_layer"], report["effective_r"], report["gflops_per_layer"], strict=True)):
        table.add_row(f"{i} (stem)" if i < report["stem_blocks"] else str(i), str(t), str(rr), f"{g:.3f}")
    out_console.print(table)
    shown = {k: v for k, v in report["method_options"].items() if k != "calibration"}
    if shown:
        out_console.print(f"{report['method']} options: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    out_console.print(
        f"total {report['gflops']:.2f} GFLOPs (unmerged {report['dense_gflops']:.2f}, {report['flop_reduction']:.2f}x fewer); "
        f"tokens out of the last block: {report['tokens_out']}; {report['params_millions']:.2f} M parameters"
    )
    if report["stem_blocks"]:
        out_console.print(
            f"  blocks 0..{report['stem_blocks'] - 1} are the multi-scale stem (both token scales, fused after it); "
            f"outside the blocks {report['gflops_outside_blocks']:.3f} GFLOPs, of which "
            + ", ".join(f"{label} {g:.4f}" for label, g in report["gflops_of_parts"].items())
        )
    blocks_run = report["output"]["blocks_run"]
    if blocks_run < len(report["tokens_per_layer"]):
        out_console.print(f"  the graph runs blocks 0..{blocks_run - 1} (`export.feature_layer`); the rows after are not in it")
    out_console.print(_output_line(report["output"]))
    if report["capped"]:
        out_console.print(
            f"[yellow]note:[/] r capped per layer (ToMe's rule): requested {report['requested_r']}, effective {report['effective_r']}"
        )


def methods(report: dict, json_out: bool, markdown: bool) -> None:
    """``report``: ``{"methods": [...]}``, the MethodsReport's ``to_dict()``."""
    if json_out:
        return emit_json(report)
    if markdown:
        return sys.stdout.write(methods_markdown(report["methods"]))
    table = _table(
        "token-reduction methods (merge.method / merge.options)", ("method", "what it does", "options (default)"), show_lines=True
    )
    for m in report["methods"]:
        opts = "\n".join(f"{o['name']} = {o['default']!r}: {o['description']}" for o in m["options"]) or "-"
        r_note = "" if m["uses_r"] else " Uses keep_rate, not merge.r."
        learned = f" Learned: {learned_text(m)}." if m["learned"] or m["learned_when"] else ""
        table.add_row(m["name"], f"{m['summary']} ({m['kind']}).{r_note}{learned}\nops: {ops_text(m)}", opts)
    out_console.print(table)


def learned_text(method: dict) -> str:
    keys = f"checkpoint keys `{method['checkpoint_prefix']}.*`"
    if method["learned"]:
        return f"yes: {keys}"
    return f"with `{method['learned_when']}`: {keys}" if method["learned_when"] else "no"


def ops_text(method: dict) -> str:
    return ", ".join(method["ops"]) or "none (standard ONNX ops only)"


def families(report: dict, json_out: bool) -> None:
    """``report``: ``{"families": [...]}``, the FamiliesReport's ``to_dict()``."""
    if json_out:
        return emit_json(report)
    table = _table("model families (`model:`)", ("family", "model:", "classes", "learned"), show_lines=True)
    for f in report["families"]:
        table.add_row(f["name"], f["model"], "\n".join(f["classes"]), "yes" if f["learned_reducers"] else "no")
    out_console.print(table)


def schedules(report: dict) -> None:
    """Several schedules of one model side by side (``inspect --r A --r B``): what each keeps and costs."""
    table = _table(f"{report['model']}  {report['method']}: one row per schedule", ())
    for col in ("schedule", "tokens out", "GFLOPs", "of dense", "FLOPs ratio", "capped"):
        table.add_column(col, justify="right")
    for s in report["schedules"]:
        table.add_row(
            _settings(s["r"], s["method_options"]) or "-",
            str(s["tokens_out"]),
            f"{s['gflops']:.3f}",
            f"{s['gflops'] / s['dense_gflops']:.2f}",
            f"{s['flop_reduction']:.2f}x",
            "yes" if s["capped"] else "",
        )
    out_console.print(table)
    first = report["schedules"][0]
    out_console.print(f"unmerged: {first['dense_gflops']:.3f} GFLOPs; `deploytk inspect --r R` (one r) shows a schedule block by block")


def configs(report: dict, json_out: bool) -> None:
    """``report``: the ConfigsReport's ``to_dict()``: a name is what the user types, so it is never cut."""
    if json_out:
        return emit_json(report)
    table = Table(title=f"ready-made configs ({report['folder']}): deploytk export NAME")
    table.add_column("name", no_wrap=True)
    table.add_column("method", no_wrap=True)
    table.add_column("schedule", max_width=28, overflow="fold")
    table.add_column("what it is")
    for c in report["configs"]:
        table.add_row(c["name"], c["method"], _settings(c["r"], c["options"]) or "-", c["description"])
    out_console.print(table)
    if not report["configs"]:
        note("no ready-made config matches")


def methods_markdown(report: list[dict], options_link: bool = False) -> str:
    """The methods table of docs/guides/methods.md (a test holds the page to it).

    ``options_link``: each method's options as one link to the section that tables them (the generated
    docs/reference/methods.md, whose sections are named after the methods) instead of listed in the cell."""
    lines = [
        "| `merge.method` | what it does | kind | learned | schedule | custom ops | `merge.options`"
        + (" |" if options_link else " (default) |"),
        "|---|---|---|---|---|---|---|",
    ]
    for m in report:
        opts = "<br>".join(f"`{o['name']}` = `{o['default']!r}`: {o['description']}" for o in m["options"]) or "-"
        if options_link and m["options"]:
            opts = "[" + ", ".join(f"`{o['name']}`" for o in m["options"]) + f"](#{m['name']})"
        learned = learned_text(m)
        lines.append(f"| `{m['name']}` | {m['summary']} | {m['kind']} | {learned} | {m['schedule']} | {ops_text(m)} | {opts} |")
    return "\n".join(lines) + "\n"


def calibration(config: Path, report: dict, json_out: bool) -> None:
    if json_out:
        return emit_json(report)
    out_console.print(
        f"[green]calibrated[/] {config} -> {report['output']}\n  r per layer: {report['r']}\n"
        f"  from {report['images']} images in {report['batches']} batches ({report['source']}); {report['statistic']}"
    )


def build(directory: Path, record: dict, json_out: bool) -> None:
    if json_out:
        return emit_json(record)
    out_console.print(
        f"[green]built[/] {directory / 'model.engine'} in {record['build_seconds']} s "
        f"(TensorRT {record['tensorrt']}, {record['gpu']}; plugins: {', '.join(record['plugin_ops']) or 'none'})"
    )


def evaluation(config: Path, report: dict, json_out: bool) -> None:
    if json_out:
        return emit_json(report)
    k = report["topk"]
    options = report["merge"].get("options") or {}
    settings = ", ".join(f"{key}={value}" for key, value in options.items()) if options else f"r={report['r']}"
    title = f"{config}: {report['method']} {settings} on {report['data']} ({report['num_images']} images, {report['num_classes']} classes)"
    table = _table(title, ("model",))
    for col in ("top-1", f"top-{k}", "GFLOPs"):
        table.add_column(col, justify="right")
    low = report["precision"] + (" emulated" if report["emulation"] else "") if report["precision"] != "fp32" else ""
    from deploytk.backends import BACKENDS  # imports the runtimes: only here, an eval report (render is loaded by --help)

    runtime = BACKENDS[report["backend"]].display_name
    rows = [
        ("dense (timm, unmerged)", report["dense"], report["dense_gflops"]),
        ("reference (PyTorch, merged)", report["reference"], report["gflops"]),
        (f"{runtime} (merged{', ' + low if low else ''})", report["exported"], report["gflops"]),
    ]
    for name, acc, gflops in rows:
        table.add_row(name, f"{100 * acc['top1']:.2f}%", f"{100 * acc['top5']:.2f}%", f"{gflops:.4f}")
    out_console.print(table)
    temp = ", ONNX exported to a temporary directory" if report["artifacts"] is None else ""
    out_console.print(
        f"{report['backend']} vs reference top-1 agreement: {100 * report['agreement']:.2f}%   "
        f"reference vs dense: {100 * report['reference_vs_dense_agreement']:.2f}%   ({report['seconds']['total']:.1f} s{temp})"
    )


def selftest(report: dict, json_out: bool) -> None:
    if json_out:
        return emit_json(report)
    env = report["environment"]
    gpu = ", " + env["gpu"] if "gpu" in env else ""
    table = _table(f"deploytk selftest ({env['mode']}, Triton {env['triton']}{gpu})", ("op", "dtype", "shape", "max err (rel. to scale)"))
    table.add_column("tolerance")
    table.add_column("result")
    for c in report["cases"]:
        shape = " ".join(f"{k}={v}" for k, v in c["shape"].items())
        ties = f" ({c['near_ties']} near-tie images)" if c["near_ties"] else ""
        result = f"[green]pass[/]{ties}" if c["passed"] else "[red]FAIL[/]"
        table.add_row(c["op"], c["dtype"], shape, f"{c['max_abs_err']:.2e}", f"{c['tolerance']:.0e}", result)
    out_console.print(table)
    for dtype, why in env.get("skipped", {}).items():
        out_console.print(f"skipped {dtype}: {why}")
    n_fail = sum(not c["passed"] for c in report["cases"])
    out_console.print("[bold green]PASS[/]" if not n_fail else f"[bold red]FAIL[/]: {n_fail} of {len(report['cases'])} cases")


def plugins_compile(arch: str, output: Path, index: dict, json_out: bool) -> None:
    if json_out:
        return emit_json(index)
    for k in index["kernels"]:
        out_console.print(f"{output / k['file']}  ({k['kernel_name']}, {k['num_warps']} warps, {k['shared_mem']} B shared)")
    out_console.print(f"[bold green]{len(index['kernels'])} kernels[/] compiled for {arch}; index: {output / 'kernels.json'}")


def doctor(report: dict, json_out: bool) -> None:
    if json_out:
        return emit_json(report)
    table = Table(title="deploytk doctor", show_header=False)
    table.add_column("what")
    table.add_column("value")
    for name, version in report["packages"].items():
        table.add_row(name, version or "[red]not installed[/]")
    table.add_row("onnxruntime providers", ", ".join(report["onnxruntime_providers"]))
    table.add_row("torch CUDA build", str(report["torch_cuda_build"]))
    gpu = report["gpu"] or "none (CPU only)"
    if report["gpu"]:
        kernels = "plugin kernels compile for it" if report["plugin_kernels_for_this_gpu"] else "[yellow]no plugin kernels for it[/]"
        gpu += f" (compute capability {report['compute_capability']}; {kernels})"
    table.add_row("GPU", gpu)
    table.add_row("triton", report["triton"] or "not installed")
    tensorrt = report["tensorrt"] or "[yellow]absent[/]"
    table.add_row("TensorRT", f"{tensorrt}: {report['tensorrt_hint']}" if report["tensorrt_hint"] else tensorrt)
    if report["openvino"]:
        table.add_row("OpenVINO", f"{report['openvino']} (CPU: {', '.join(report['openvino_cpu_capabilities'])})")
    else:
        table.add_row("OpenVINO", f"[yellow]absent[/]: {report['openvino_hint']}")
    doctor_extras(table, report)
    out_console.print(table)


def clean(report: dict, json_out: bool) -> None:
    if json_out:
        return emit_json(report)
    entries = report["entries"]
    if not entries:
        out_console.print(f"nothing stale under {escape(report['path'])}")
        return
    table = Table(title=f"left by interrupted deploytk runs under {escape(report['path'])}")
    for column in ("entry", "kind", "MB", "state"):
        table.add_column(column)
    for e in entries:
        table.add_row(escape(e["path"]), e["kind"], f"{e['bytes'] / 1e6:.1f}", escape(e["state"]))
    out_console.print(table)
    if not report["removed"] and any(e["state"] == "stale" for e in entries):
        out_console.print(f"remove them with: deploytk clean {escape(report['path'])}")


def package(report: dict, json_out: bool) -> None:
    if json_out:
        return emit_json(report)
    tensors = "; ".join(
        f"{kind} {t['name']} {t['triton_dtype']} [{', '.join(map(str, t['dims']))}]"
        for kind, key in (("input", "inputs"), ("output", "outputs"))
        for t in report[key]
    )
    out_console.print(
        f"[green]packaged[/] {report['artifact']} -> {report['model_dir']} ({report['model_file']}, Triton backend "
        f"{report['backend']}, max_batch_size {report['max_batch_size']}, dynamic batching)\n  {tensors} (after the batch dimension)"
    )
    if report["validation"]:
        v = report["validation"]
        top1 = f", top-1 agreement {v['top1_agreement']:.3f}" if "top1_agreement" in v else ""
        out_console.print(
            f"  the IR passed validation against the PyTorch reference on OpenVINO {v['openvino']} "
            f"({v['num_images']} {v.get('samples', 'images')}, "
            f"max |diff| {v['max_abs_diff']:.2e}{top1}; {v['stable_topk']} TopK made stable)"
        )
    if report["tensorrt"]:
        out_console.print(
            f"  the server must have TensorRT {report['tensorrt']} (the engine's version) and a GPU of compute capability "
            f"{report['compute_capability']}; the plugins are embedded in the engine"
        )
    out_console.print(
        f"  serve: tritonserver --model-repository={report['repository']}   (docker command and a client: {report['model_dir']}/README.md)"
    )


def quantization(directory: Path, report: dict, json_out: bool) -> None:
    """``report``: the new artifact's ``to_dict()``, ``{"directory": DIR, **manifest}`` (as export's)."""
    if json_out:
        return emit_json(report)
    q, target = report["quantization"], report["directory"]
    calibration = q["calibration"]
    data = "synthetic noise" if calibration["source"] == "synthetic" else calibration["source"]
    ops = ", ".join(f"{k} {v}" for k, v in q["quantized_ops"].items())
    out_console.print(
        f"[green]quantized[/] {directory} -> {target} (int8 for {q['runtime']}, {q['tool']}, {q['seconds']} s)\n"
        f"  calibration: {calibration['images']} images from {data}\n  int8 ops: {ops}\n  kept fp32: {q['kept_fp32']}\n"
        f"  next: deploytk validate {target} --backend {q['backend']}"
    )


def doctor_extras(table: Table, report: dict) -> None:
    """`deploytk doctor`'s rows for the extras: installed or what is missing, with versions and what each enables."""
    for extra, info in report["extras"].items():
        versions = ", ".join(f"{name} {version or '[yellow]missing[/]'}" for name, version in info["packages"].items())
        state = "[green]installed[/]" if info["installed"] else f"[yellow]not installed[/] ({escape(info['install'])})"
        table.add_row(escape(f"deploytk[{extra}]"), f"{state}: {versions}; for {escape(info['for'])}")
    if report["extras_hint"]:
        table.add_row("", f"[yellow]note:[/] {escape(report['extras_hint'])}")


def visualization(report: dict, json_out: bool) -> None:
    if json_out:
        return emit_json(report)
    source = "the PyTorch reference" if report["backend"] == VISUALIZE_REFERENCE else f"{report['backend']} (the exported graph's choices)"
    out_console.print(f"[green]wrote[/] {escape(report['output'])} ({report['method']}, {report['kind']}; choices of {source})")
    table = _table(
        f"{report['patches']} patches of {escape(report['image'])}", ("after block", "tokens", "hold patches", "dropped", "fused")
    )
    for layer in report["layers"]:
        soft = " (argmax of soft weights)" if layer["soft_assignment"] else ""
        table.add_row(
            str(layer["block"]),
            str(layer["tokens"]),
            f"{layer['tokens_with_patches']}{soft}",
            str(layer["patches_dropped"]),
            str(layer["patches_fused"]),
        )
    out_console.print(table)
    out_console.print(f"  {escape(report['caption'])}")
