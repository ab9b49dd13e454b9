"""`deploytk tune`: the least aggressive schedule that meets a latency budget, measured on this backend and hardware.

The method's schedule knob (``Reduction.tune_knob``: ToMe/MCTF ``r``, optionally over several
of ToMe's inflection schedules; the keep rate of the pruning and clustering methods; the
quantile of ATM's calibration run) spans a list of candidates, ordered from least to most
aggressive by an estimate of their FLOPs from the token schedule (planned without export).
Latency falls as tokens are removed, so the boundary between candidates that miss the
budget and those that meet it is found by bisection: the most aggressive candidate first
(its run also times the dense model, which answers "impossible" and "no reduction needed"),
then halving. The two candidates on either side of the boundary are measured again (refine)
and each candidate's latency is the median over its runs; if a re-measurement moves the
boundary, the bisection resumes. Each measurement is one ``deploytk profile`` run (merged
and dense alternating) of an export cached by config hash, so a rerun exports nothing.

With ``data`` every candidate within budget is measured (the bisection's and every more aggressive one), with its
top-1, and the most accurate is chosen (ties: the least aggressive).

The parts: ``candidates`` (planning), ``search`` (bisection), ``measure`` (export cache, build, profile, accuracy),
``report`` (the report and its plot); this module checks the options and writes the config.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import yaml

from deploytk.backends import Backend, get_backend
from deploytk.config import config_from_dict, load_config, portable
from deploytk.data import folder_batches, synthetic_batches
from deploytk.errors import DeploytkError
from deploytk.evaluation.accuracy import scan_image_folder
from deploytk.files import claim_file, claim_yaml
from deploytk.models import create_model
from deploytk.profile.profiler import MIN_SAMPLES
from deploytk.progress import SILENT, Progress
from deploytk.tuning.candidates import candidates_for, config_with
from deploytk.tuning.measure import Measure
from deploytk.tuning.report import build_report, plot
from deploytk.tuning.search import Search

#: the latency statistics a budget can hold (`profile` reports p90 / p99 only where enough runs back them)
PERCENTILES = tuple(MIN_SAMPLES)


def tune(
    config: Path,
    budget_ms: float,
    *,
    batch_size: int = 8,
    backend: str | Backend = "ort",
    percentile: str = "p50",
    data: Path | None = None,
    num_samples: int | None = 256,
    inflections: list[float] | None = None,
    output: Path | None = None,
    cache: Path | None = None,
    warmup: int = 3,
    iterations: int = 10,
    progress: Progress = SILENT,
    command_line: Callable[[Path, dict], str] | None = None,
) -> dict:
    """Search, write NEW.yaml (+ NEW.json, NEW.png) and return the report; see the module doc. The report's ``command``
    reproduces the run: ``command_line(config, arguments)`` where the caller speaks another language than Python (the
    CLI's flags), else the Python call."""
    if budget_ms <= 0:
        raise DeploytkError(f"`budget_ms={budget_ms}`: must be a positive number of milliseconds.")
    if batch_size < 1 or warmup < 0 or iterations < 1:
        raise DeploytkError("`batch_size=` and `iterations=` must be >= 1 and `warmup=` >= 0.")
    batch = batch_size
    if percentile not in PERCENTILES:
        raise DeploytkError(f"`percentile={percentile!r}` is not one of {', '.join(PERCENTILES)}.")
    if iterations < MIN_SAMPLES[percentile]:
        raise DeploytkError(
            f"`percentile={percentile}` needs at least {MIN_SAMPLES[percentile]} timed runs per candidate; with "
            f"`iterations={iterations}` it would be the slowest run, not a {percentile}.",
            hint=f"Pass `iterations={MIN_SAMPLES[percentile]}` or more (each candidate then takes longer to measure).",
        )
    cfg = config_from_dict(config_with(load_config(config)), str(config))  # a tuned config is tuned afresh
    kind = cfg.export.output
    if data is not None and kind != "logits":  # the model's own output (null) may be an embedding: its head decides
        kind = cfg.export.output_spec().resolved(create_model(cfg.model_copy(update={"checkpoint": None, "pretrained": False})).num_classes)
    if data is not None and kind != "logits":
        raise DeploytkError(
            f"`data=` ranks the candidates by top-1, and {config} exports `export.output: {kind}`, which has no classes.",
            hint="Omit `data=`: tune then picks the least aggressive schedule within the latency budget.",
        )
    backend = get_backend(backend) if isinstance(backend, str) else backend
    folder = None
    if data is not None:  # the files of the model's kind (images, clips, sounds), checked before anything is claimed
        folder = scan_image_folder(
            data, num_samples, create_model(cfg.model_copy(update={"checkpoint": None, "pretrained": False})).input_kind
        )
    with contextlib.ExitStack() as claims:  # each claim holds its file's lock until written or given up
        output = claims.enter_context(
            claim_yaml(Path(output) if output else config.with_name(f"{config.stem}_tuned.yaml"), "deploytk tune")
        )
        report_out, plot_out = (claims.enter_context(claim_file(output.path.with_suffix(s), "deploytk tune")) for s in (".json", ".png"))
        cache = Path(cache) if cache else Path("artifacts") / "tune" / config.stem
        calibration = None
        if cfg.merge.reduction.calibrated:
            progress.step("loading the calibration images")
            family = create_model(cfg.model_copy(update={"checkpoint": None, "pretrained": False}))  # its input size, its transform
            if data is not None:
                calibration = (folder_batches(data, 64, 16, family.input_transform(), family.input_kind, "data"), f"images: {data}")
            else:
                calibration = (synthetic_batches(64, 16, family.input_kind), "synthetic: 64 seeded standard-normal images")
        candidates = candidates_for(cfg, inflections, calibration, progress)
        if not candidates:
            raise DeploytkError(f"{config}: no schedule of {cfg.merge.method} reduces any token on {cfg.model}; nothing to tune.")
        measure = Measure(candidates, cache, backend, batch, warmup, iterations, percentile, folder, progress)
        search = Search(candidates, budget_ms, measure)
        outcome = search.run()
        if outcome == "ok" and folder is not None:
            search.measure_the_rest_within()
        report = build_report(config, cfg, search, backend, batch, percentile, folder, measure.device)
        if outcome == "ok":
            chosen = report["chosen"]
            tuned = {
                "budget_ms": budget_ms,
                "percentile": percentile,
                "batch": batch,
                "backend": backend.name,
                "device": measure.device,
                "measured_ms": chosen["latency_ms"],
                "dense_ms": report["dense_latency_ms"],
                "knob": {k: chosen[k] for k in ("r", "inflection", "keep_rate", "quantile", "preset", "paper_gflops") if k in chosen},
                "top1": chosen["top1"],
                "data": str(data) if data else None,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }
            new = next(c for c in candidates if c.label == chosen["label"]).data
            new = json.loads(json.dumps(new))
            new["merge"]["options"]["tuned"] = tuned
            config_from_dict(new, "(tuned config)")  # must load back
            header = f"# Tuned by `deploytk tune {config}` to a budget of {budget_ms:g} ms ({backend.name}, batch {batch}, {percentile}).\n"
            output.write_yaml(header + yaml.safe_dump(portable(new, output.path), sort_keys=False))
            report["output"] = str(output.path)
        report["report"] = str(report_out.path)
        arguments = {  # what reproduces this run (every argument spelled out, defaults included)
            "budget_ms": budget_ms,
            "batch_size": batch,
            "backend": backend.name,
            "percentile": percentile,
            "warmup": warmup,
            "iterations": iterations,
            **({"data": str(data), "num_samples": num_samples} if data is not None else {}),
            **({"inflections": list(inflections)} if inflections else {}),
            "output": str(output.path),
            "cache": str(cache),
        }
        report["command"] = (
            command_line(config, arguments)
            if command_line is not None
            else f"deploytk.tune({str(config)!r}, " + ", ".join(f"{k}={v!r}" for k, v in arguments.items()) + ")"
        )
        report["plot"] = plot(report, plot_out)
        report_out.write_json(report)
        return report
