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

With ``--data`` every measured candidate's top-1 is measured too and the most accurate
candidate within budget is chosen (ties: the least aggressive).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import yaml

from deploytk.backends import Backend, get_backend
from deploytk.build.builder import build_engine
from deploytk.build.options import build_options
from deploytk.calibrate import calibrate, r_samples
from deploytk.config import DeployConfig, config_from_dict, config_to_dict, load_config
from deploytk.data import folder_batches, model_input_size, synthetic_batches
from deploytk.errors import DeploytkError
from deploytk.evaluate.accuracy import exported_accuracy, scan_image_folder
from deploytk.export.artifacts import Artifact
from deploytk.export.baseline import share_baseline
from deploytk.export.pipeline import run_export
from deploytk.files import FileOutput, claim_file, claim_yaml
from deploytk.merging.merged_vit import build_merged
from deploytk.methods import METHODS, get_method
from deploytk.models import build_reference, create_vit
from deploytk.profile.profiler import MIN_SAMPLES, profile
from deploytk.progress import SILENT, Progress

PERCENTILES = tuple(MIN_SAMPLES)
#: keep rates tried for the keep-rate methods (identical schedules are tried once)
KEEP_RATES = [round(0.05 * k, 2) for k in range(2, 20)]
#: quantiles of ATM's calibration run tried (identical schedules are tried once)
QUANTILES = [round(0.05 * k, 2) for k in range(1, 20)]
#: a search stops after this many profile runs even if noise keeps moving the boundary
MAX_MEASUREMENTS = 14


@dataclass
class Candidate:
    """One schedule: ``knob`` as the user reads it, ``data`` the whole config, ``cost`` the ordering estimate."""

    label: str
    knob: dict
    data: dict
    tokens: list[int]
    cost: float
    latencies: list[float] = field(default_factory=list)
    dense_latencies: list[float] = field(default_factory=list)
    gflops: float | None = None
    dense_gflops: float | None = None
    artifact: str | None = None
    accuracy: dict | None = None

    @property
    def latency(self) -> float | None:
        return statistics.median(self.latencies) if self.latencies else None

    def row(self, budget: float) -> dict:
        return {
            "label": self.label,
            **self.knob,
            "tokens_per_layer": self.tokens,
            "estimated_gflops": round(self.cost, 4),
            "gflops": self.gflops,
            "latency_ms": round(self.latency, 3) if self.latency is not None else None,
            "runs_ms": [round(v, 3) for v in self.latencies],
            "dense_latency_ms": round(statistics.median(self.dense_latencies), 3) if self.dense_latencies else None,
            "meets_budget": None if self.latency is None else self.latency <= budget,
            "top1": self.accuracy["top1"] if self.accuracy else None,
            "artifact": self.artifact,
        }


def block_gflops(tokens: int, width: int, mlp_ratio: float) -> float:
    """fvcore's count of one ViT block at ``tokens`` tokens: qkv + proj + MLP linears and the two attention products."""
    return (4 * tokens * width * width + 2 * mlp_ratio * tokens * width * width + 2 * tokens * tokens * width) / 1e9


def _estimate(model) -> tuple[list[int], float]:
    """The token schedule and an estimate of its GFLOPs (enough to order candidates; exports count exactly)."""
    tokens = list(model.schedule.tokens)
    vit = model.vit
    width = int(vit.embed_dim)
    mlp = vit.blocks[0].mlp.fc1.out_features / width
    return tokens, sum(block_gflops(t, width, mlp) for t in tokens)


def _with(cfg: DeployConfig, merge: dict | None = None, options: dict | None = None) -> dict:
    data = config_to_dict(cfg)
    data["merge"].update(merge or {})
    data["merge"]["options"] = {k: v for k, v in {**data["merge"]["options"], **(options or {})}.items() if v is not None}
    data["merge"]["options"].pop("tuned", None)
    return data


def _r_candidates(cfg: DeployConfig, vit, inflections: list[float]) -> list[Candidate]:
    method = get_method(cfg.merge.method)
    options = method.parse_options(cfg.merge.options)
    out = []
    for inflection in inflections:
        previous = None
        for r in range(1, 1000):
            spec = (r, inflection) if inflection else r
            model = build_merged(method, vit, spec, cfg.merge.prop_attn, options)
            tokens, cost = _estimate(model)
            if tokens == previous:  # the cap leaves nothing more to merge
                break
            out.append(_r_candidate(cfg, r, inflection, tokens, cost))
            if model.schedule.tokens_out <= model.schedule.protected + 1:  # merged down to one patch token: the last candidate
                break
            previous = tokens
    return out


def _r_candidate(cfg, r, inflection, tokens, cost) -> Candidate:
    r_value = {"r": r, "inflection": inflection} if inflection else r
    label = f"r={r}" + (f", inflection={inflection:g}" if inflection else "")
    knob = {"r": r} | ({"inflection": inflection} if inflection else {})
    return Candidate(label, knob, _with(cfg, {"r": r_value}), tokens, cost)


def _keep_rate_candidates(cfg: DeployConfig, vit) -> list[Candidate]:
    method = get_method(cfg.merge.method)
    out = []
    for keep in reversed(KEEP_RATES):  # least aggressive first
        data = _with(cfg, options={"keep_rate": keep})
        try:
            model = build_merged(method, vit, 0, cfg.merge.prop_attn, method.parse_options(data["merge"]["options"]))
        except DeploytkError:
            continue  # e.g. a keep rate that leaves zero clusters at a later block
        tokens, cost = _estimate(model)
        out.append(Candidate(f"keep_rate={keep:g}", {"keep_rate": keep}, data, tokens, cost))
    return out


def _calibrated_candidates(cfg: DeployConfig, batches: list[np.ndarray], source: str, progress: Progress) -> list[Candidate]:
    """A calibrated method: its ``tuning_points`` (ATM with ``preset``: the paper's Table A2 points), each calibrated at the
    median; otherwise the quantiles of one calibration run (``deploytk calibrate --quantile Q`` would write the same)."""
    method = get_method(cfg.merge.method)
    options = method.parse_options(cfg.merge.options)
    vit = create_vit(cfg)  # the weights, loaded once: every point and quantile runs on them

    def candidate(label: str, knob: dict, data: dict) -> Candidate:
        merged = build_merged(method, vit, data["merge"]["r"], cfg.merge.prop_attn, method.parse_options(data["merge"]["options"]))
        return Candidate(label, knob, data, *_estimate(merged))

    points = method.tuning_points(options)
    if points:
        out = []
        progress.start(len(points), f"calibrating {method.name} at its {len(points)} tuning points")
        for label, knob, overrides in points:
            point_cfg = config_from_dict(_with(cfg, options=overrides), f"({method.name} {label})")
            data, _ = calibrate(point_cfg, batches, 0.5, source, model=build_reference(point_cfg, vit))
            out.append(candidate(label, knob, data))
            progress.advance()
        return out
    model = build_reference(cfg, vit)
    samples = r_samples(model, batches, progress)
    quantiles = [(q, calibrate(cfg, batches, q, source, model=model, samples=samples)[0]) for q in QUANTILES]
    return [candidate(f"quantile={q:g}", {"quantile": q}, data) for q, data in quantiles]


def candidates_for(
    cfg: DeployConfig, inflections: list[float] | None = None, calibration: tuple[list[np.ndarray], str] | None = None, progress=SILENT
) -> list[Candidate]:
    """Every distinct schedule of the method's knob, least aggressive (highest estimated FLOPs) first."""
    method = get_method(cfg.merge.method)
    knob = method.tune_knob
    if knob is None:
        tunable = ", ".join(n for n, m in METHODS.items() if m.tune_knob)
        raise DeploytkError(
            f"method {method.name} cannot be tuned: its token counts are trained into its layers (a different count needs "
            f"different weights).",
            hint=f"Fine-tune it at another keep rate, or tune one of: {tunable}.",
        )
    if inflections and knob != "r":
        raise DeploytkError(f"--inflections is for the r-scheduled methods (tome, mctf); {method.name} is tuned by its {knob}.")
    progress.step("planning the candidate schedules")
    vit = create_vit(cfg.model_copy(update={"checkpoint": None, "pretrained": False}))  # schedules do not depend on weights
    if knob == "r":
        found = _r_candidates(cfg, vit, inflections or [_config_inflection(cfg)])
    elif knob == "keep_rate":
        found = _keep_rate_candidates(cfg, vit)
    else:  # "quantile": a calibrated method's statistic
        found = _calibrated_candidates(cfg, *calibration, progress)
    by_schedule: dict[tuple, Candidate] = {}
    for c in found:  # one candidate per token schedule (the same graph): the first found wins
        by_schedule.setdefault(tuple(c.tokens), c)
    dense_tokens = [vit.patch_embed.num_patches + vit.num_prefix_tokens] * len(vit.blocks)
    return sorted((c for c in by_schedule.values() if c.tokens != dense_tokens), key=lambda c: -c.cost)


def _config_inflection(cfg: DeployConfig) -> float:
    r = cfg.merge.r
    return float(getattr(r, "inflection", 0.0))


def config_hash(data: dict) -> str:
    """Cache key of an export: the whole config, and the checkpoint file's identity (path, size, mtime)."""
    key = dict(data)
    if data.get("checkpoint"):
        st = os.stat(data["checkpoint"])
        key["checkpoint"] = [str(Path(data["checkpoint"]).resolve()), st.st_size, st.st_mtime_ns]
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Search:
    """Bisection over candidates sorted least -> most aggressive; ``measure(i)`` adds a run to candidate i."""

    candidates: list[Candidate]
    budget: float
    measure: Callable[[int], None]
    max_measurements: int = MAX_MEASUREMENTS
    runs: int = 0
    outcome: str = ""
    boundary: tuple[int, int] = (-1, -1)
    device: dict | None = None  # the backend's description, from the first profile run

    def meets(self, i: int) -> bool:
        return self.candidates[i].latency <= self.budget

    def _run(self, i: int) -> bool:
        self.measure(i)
        self.runs += 1
        return self.meets(i)

    def _boundary(self) -> tuple[int, int | None]:
        """(lo, hi): hi the least aggressive measured candidate that meets the budget (None: none does any more), lo the
        nearest measured one before it (it misses; -1: the dense model). Medians over runs, so the refine runs correct a noisy one."""
        measured = [j for j, c in enumerate(self.candidates) if c.latencies]
        hi = min((j for j in measured if self.meets(j)), default=None)
        return max((j for j in measured if hi is None or j < hi), default=-1), hi

    def dense_latency(self) -> float:
        return statistics.median(v for c in self.candidates for v in c.dense_latencies)

    def run(self) -> str:
        """'ok', 'impossible' (the most aggressive misses) or 'dense' (the dense model already meets the budget)."""
        n = len(self.candidates)
        last_meets = self._run(n - 1)
        if self.dense_latency() <= self.budget:
            self.outcome = "dense"
            return self.outcome
        if not last_meets:
            self.outcome = "impossible"
            return self.outcome
        refined: set[int] = set()
        while True:
            lo, hi = self._boundary()
            if hi is None:  # re-measured, even the most aggressive misses
                self.outcome = "impossible"
                return self.outcome
            if hi - lo > 1 and self.runs < self.max_measurements:  # bisect the gap
                self._run((lo + hi) // 2)
                continue
            # refine: one more run of each side of the boundary; medians decide, and a moved boundary is bisected again
            todo = [i for i in (hi, lo) if i >= 0 and i not in refined]
            if not todo or self.runs >= self.max_measurements:
                break
            for i in todo:
                refined.add(i)
                self._run(i)
        self.boundary = (lo, hi)
        self.outcome = "ok"
        return self.outcome

    def measure_the_rest_within(self) -> None:
        """Measure every candidate more aggressive than the boundary that the bisection skipped (``--data``: "the most
        accurate within budget" then compares every candidate that meets it, not the few the search happened to visit)."""
        for i in range(self.boundary[1] + 1, len(self.candidates)):
            if not self.candidates[i].latencies:
                self._run(i)


def tune(
    config: Path,
    budget_ms: float,
    *,
    batch: int = 8,
    backend: str | Backend = "ort",
    percentile: str = "p50",
    data: Path | None = None,
    limit: int | None = 256,
    inflections: list[float] | None = None,
    output: Path | None = None,
    cache: Path | None = None,
    warmup: int = 3,
    iterations: int = 10,
    progress: Progress = SILENT,
) -> dict:
    """Search, write NEW.yaml (+ NEW.json, NEW.png) and return the report; see the module doc."""
    if budget_ms <= 0:
        raise DeploytkError(f"--budget-ms {budget_ms}: must be a positive number of milliseconds.")
    if batch < 1 or warmup < 0 or iterations < 1:
        raise DeploytkError("--batch and --iterations must be >= 1 and --warmup >= 0.")
    if percentile not in PERCENTILES:
        raise DeploytkError(f"--percentile {percentile!r} is not one of {', '.join(PERCENTILES)}.")
    if iterations < MIN_SAMPLES[percentile]:
        raise DeploytkError(
            f"--percentile {percentile} needs at least {MIN_SAMPLES[percentile]} timed runs per candidate; with --iterations "
            f"{iterations} it would be the slowest run, not a {percentile}.",
            hint=f"Pass --iterations {MIN_SAMPLES[percentile]} or more (each candidate then takes longer to measure).",
        )
    cfg = config_from_dict(_with(load_config(config)), str(config))  # a tuned config is tuned afresh
    backend = get_backend(backend) if isinstance(backend, str) else backend
    folder = scan_image_folder(data, limit) if data is not None else None
    output = claim_yaml(Path(output) if output else config.with_name(f"{config.stem}_tuned.yaml"), "deploytk tune")
    report_out, plot_out = (claim_file(output.path.with_suffix(suffix), "deploytk tune") for suffix in (".json", ".png"))
    cache = Path(cache) if cache else Path("artifacts") / "tune" / config.stem
    calibration = None
    if get_method(cfg.merge.method).calibrated:
        progress.step("loading the calibration images")
        vit = create_vit(cfg.model_copy(update={"checkpoint": None, "pretrained": False}))  # its input size, its transform
        if data is not None:
            calibration = (folder_batches(data, 64, 16, vit), f"images: {data}")
        else:
            calibration = (synthetic_batches(64, 16, model_input_size(vit)), "synthetic: 64 seeded standard-normal images")
    candidates = candidates_for(cfg, inflections, calibration, progress)
    if not candidates:
        raise DeploytkError(f"{config}: no schedule of {cfg.merge.method} reduces any token on {cfg.model}; nothing to tune.")
    dense_dir: list[Path] = []

    def measure(i: int) -> None:
        c = candidates[i]
        directory = cache / config_hash(c.data)
        progress.step(f"candidate {c.label}: export")
        _export_cached(config_from_dict(c.data, f"(candidate {c.label})"), directory, backend, batch, progress)
        if dense_dir:
            share_baseline(Artifact.open(dense_dir[0], verify=False), Artifact.open(directory, verify=False))
        progress.step(f"candidate {c.label}: profile at batch {batch} ({backend.name})")
        result = profile(directory, backend, [batch], warmup, iterations, progress)
        row = result["results"][0]
        c.latencies.append(row["latency_ms"][percentile])
        c.dense_latencies.append(row["dense"]["latency_ms"][percentile])
        c.gflops, c.dense_gflops, c.artifact = result["gflops"], result["dense_gflops"], str(directory)
        search.device = result["device"]
        dense_dir[:] = dense_dir or [directory]
        if folder is not None and c.accuracy is None:
            c.accuracy = exported_accuracy(directory, folder, batch_size=64, backend=backend, progress=progress)

    search = Search(candidates, budget_ms, measure)
    outcome = search.run()
    if outcome == "ok" and folder is not None:
        search.measure_the_rest_within()
    report = _report(config, cfg, search, backend, batch, percentile, folder)
    if outcome == "ok":
        chosen = report["chosen"]
        tuned = {
            "budget_ms": budget_ms,
            "percentile": percentile,
            "batch": batch,
            "backend": backend.name,
            "device": search.device,
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
        header = f"# Tuned by `deploytk tune {config} --budget-ms {budget_ms:g}` ({backend.name}, batch {batch}, {percentile}).\n"
        output.write_yaml(header + yaml.safe_dump(new, sort_keys=False))
        report["output"] = str(output.path)
    report["report"] = str(report_out.path)
    report["plot"] = _plot(report, plot_out)
    report_out.write_json(report)
    return report


def _export_cached(cfg: DeployConfig, directory: Path, backend: Backend, batch: int, progress: Progress) -> None:
    """Export (and for TensorRT build) unless the cache holds this config's export."""
    try:
        Artifact.open(directory)
    except DeploytkError:
        if directory.exists():
            raise DeploytkError(
                f"tune cache {directory} holds an unreadable export (interrupted?).", hint=f"Remove it: rm -r {directory}"
            ) from None
        run_export(cfg, directory, progress)
    if backend.needs_build(directory):
        build_engine(directory, build_options(f"1,{batch},{batch}"), progress)


def _report(config, cfg, search: Search, backend, batch, percentile, folder) -> dict:
    budget = search.budget
    measured = [c for c in search.candidates if c.latencies]
    rows = [c.row(budget) for c in measured]
    dense = round(search.dense_latency(), 3)
    report = {
        "config": str(config),
        "model": cfg.model,
        "method": cfg.merge.method,
        "knob": get_method(cfg.merge.method).tune_knob,
        "budget_ms": budget,
        "percentile": percentile,
        "batch": batch,
        "backend": backend.name,
        "device": search.device,
        "dense_latency_ms": dense,
        "dense_gflops": measured[0].dense_gflops,
        "candidates": len(search.candidates),
        "measurements": search.runs,
        "exports": len(measured),
        "data": str(folder.root) if folder else None,
        "outcome": search.outcome,
        "measured": sorted(rows, key=lambda r: -r["estimated_gflops"]),
        "chosen": None,
        "next_less_aggressive": None,
        "output": None,
    }
    most = search.candidates[-1]
    if search.outcome == "dense":
        report["message"] = (
            f"the dense model already meets the budget: its {percentile} is {dense:.2f} ms <= {budget:g} ms at batch {batch} on "
            f"{backend.name} (the most aggressive schedule, {most.label}, takes {most.latency:.2f} ms); no reduction is needed, so no "
            "config was written."
        )
        return report
    if search.outcome == "impossible":
        report["message"] = (
            f"no schedule meets {budget:g} ms: the most aggressive, {most.label} ({most.gflops} GFLOPs), takes {most.latency:.2f} ms "
            f"({percentile}, batch {batch}, {backend.name}; dense {dense:.2f} ms). Raise the budget, lower the batch, or use a faster "
            "backend or a smaller model."
        )
        return report
    lo, hi = search.boundary
    within = [c for c in measured if c.latency <= budget]
    chosen = search.candidates[hi]
    if folder is not None:  # the most accurate within budget; ties: the least aggressive
        chosen = max(within, key=lambda c: (c.accuracy["top1"], c.cost))
    report["chosen"] = chosen.row(budget)
    report["next_less_aggressive"] = search.candidates[lo].row(budget) if lo >= 0 else {"label": "dense", "latency_ms": dense}
    nxt = report["next_less_aggressive"]
    report["message"] = (
        f"{chosen.label}: {percentile} {chosen.latency:.2f} ms <= {budget:g} ms (dense {dense:.2f} ms, {chosen.gflops} GFLOPs); the next "
        f"less aggressive, {nxt['label']}, takes {nxt['latency_ms']:.2f} ms."
    )
    return report


def _plot(report: dict, out: FileOutput) -> str | None:
    """Latency vs GFLOPs of every measured candidate (top-1 as colour with --data), the budget and the choice; None without matplotlib."""
    try:
        import matplotlib  # optional (the bench extra): the JSON has every number

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [r for r in report["measured"] if r["latency_ms"] is not None]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    top1 = [r["top1"] for r in rows]
    if all(t is not None for t in top1):
        xs, ys = [r["gflops"] for r in rows], [r["latency_ms"] for r in rows]
        points = ax.scatter(xs, ys, c=[100 * t for t in top1], cmap="viridis", zorder=3)
        fig.colorbar(points, ax=ax, label="top-1 (%)")
    else:
        ax.scatter([r["gflops"] for r in rows], [r["latency_ms"] for r in rows], color="tab:blue", zorder=3, label="candidates")
    for r in rows:
        ax.annotate(r["label"], (r["gflops"], r["latency_ms"]), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.scatter([report["dense_gflops"]], [report["dense_latency_ms"]], marker="s", color="black", zorder=3, label="dense")
    ax.axhline(report["budget_ms"], color="tab:red", linestyle="--", label=f"budget {report['budget_ms']:g} ms")
    if report["chosen"]:
        ch = report["chosen"]
        label = f"chosen: {ch['label']}"
        ax.scatter([ch["gflops"]], [ch["latency_ms"]], s=160, facecolors="none", edgecolors="tab:red", zorder=4, label=label)
    ax.set_xlabel("GFLOPs (per image)")
    ax.set_ylabel(f"{report['percentile']} latency (ms), batch {report['batch']}")
    ax.set_title(f"{report['model']} {report['method']} on {report['backend']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out.save_figure(fig, dpi=120)
    plt.close(fig)
    return str(out.path)
