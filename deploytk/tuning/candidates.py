"""`tune`'s candidates: every distinct schedule of the method's knob, ordered least -> most aggressive without exporting.

The knob is the method's (``Reduction.tune_knob``): ``r`` (ToMe/MCTF, optionally over ToMe's inflection schedules),
``keep_rate`` (the pruning and clustering methods), or ``quantile`` for a calibrated method (ATM): the quantiles of one
calibration run, or the named settings of its ``tuning_points`` (ATM with a preset: the paper's Table A2), each
calibrated at the median. The order comes from an estimate of each schedule's FLOPs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np

from deploytk.adapters import ModelFamily
from deploytk.calibration import calibrate, r_samples
from deploytk.config import DeployConfig, config_from_dict, config_to_dict
from deploytk.errors import DeploytkError
from deploytk.merging.merged_vit import build_merged
from deploytk.models import build_reference, create_model
from deploytk.progress import SILENT, Progress
from deploytk.reducers import METHODS

#: keep rates searched for the keep-rate methods (0.10 .. 0.95)
KEEP_RATES = [round(0.05 * k, 2) for k in range(2, 20)]
#: quantiles of a calibration run searched for a calibrated method without tuning points
QUANTILES = [round(0.05 * k, 2) for k in range(1, 20)]


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
    """The token schedule of the blocks the output needs and an estimate of their GFLOPs (enough to order candidates;
    exports count exactly)."""
    tokens = list(model.schedule.tokens[: model.blocks_run])
    family = model.family
    width = family.embed_dim
    mlp = family.mlp_dim / width
    return tokens, sum(block_gflops(t, width, mlp) for t in tokens)


def config_with(cfg: DeployConfig, merge: dict | None = None, options: dict | None = None) -> dict:
    """``cfg`` as plain data with merge settings and options replaced (a None option is removed), without the ``tuned``
    provenance of an earlier tune: a tuned config is tuned afresh."""
    data = config_to_dict(cfg)
    data["merge"].update(merge or {})
    data["merge"]["options"] = {k: v for k, v in {**data["merge"]["options"], **(options or {})}.items() if v is not None}
    data["merge"]["options"].pop("tuned", None)
    return data


def _r_candidates(cfg: DeployConfig, family: ModelFamily, inflections: list[float]) -> list[Candidate]:
    method, options = cfg.merge.reduction, cfg.merge.parsed_options
    out = []
    for inflection in inflections:
        previous = None
        for r in range(1, 1000):
            spec = (r, inflection) if inflection else r
            model = build_merged(method, family, spec, cfg.merge.prop_attn, options, cfg.export.output_spec())
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
    return Candidate(label, knob, config_with(cfg, {"r": r_value}), tokens, cost)


def _keep_rate_candidates(cfg: DeployConfig, family: ModelFamily) -> list[Candidate]:
    method = cfg.merge.reduction
    out = []
    for keep in reversed(KEEP_RATES):  # least aggressive first
        data = config_with(cfg, options={"keep_rate": keep})
        try:
            options = method.parse_options(data["merge"]["options"])
            model = build_merged(method, family, 0, cfg.merge.prop_attn, options, cfg.export.output_spec())
        except DeploytkError:
            continue  # e.g. a keep rate that leaves zero clusters at a later block
        tokens, cost = _estimate(model)
        out.append(Candidate(f"keep_rate={keep:g}", {"keep_rate": keep}, data, tokens, cost))
    return out


def _calibrated_candidates(cfg: DeployConfig, batches: list[np.ndarray], source: str, progress: Progress) -> list[Candidate]:
    """A calibrated method: its ``tuning_points`` (ATM with ``preset``: the paper's Table A2 points), each calibrated at the
    median; otherwise the quantiles of one calibration run (``deploytk calibrate`` with that ``quantile`` would write the same)."""
    method, options = cfg.merge.reduction, cfg.merge.parsed_options
    family = create_model(cfg)  # the weights, loaded once: every point and quantile runs on them

    def candidate(label: str, knob: dict, data: dict) -> Candidate:
        point = method.parse_options(data["merge"]["options"])
        merged = build_merged(method, family, data["merge"]["r"], cfg.merge.prop_attn, point, cfg.export.output_spec())
        return Candidate(label, knob, data, *_estimate(merged))

    points = method.tuning_points(options)
    if points:
        out = []
        progress.start(len(points), f"calibrating {method.name} at its {len(points)} tuning points")
        for label, knob, overrides in points:
            point_cfg = config_from_dict(config_with(cfg, options=overrides), f"({method.name} {label})")
            data, _ = calibrate(point_cfg, batches, 0.5, source, model=build_reference(point_cfg, family))
            out.append(candidate(label, knob, data))
            progress.advance()
        return out
    model = build_reference(cfg, family)
    samples = r_samples(model, batches, progress)
    quantiles = [(q, calibrate(cfg, batches, q, source, model=model, samples=samples)[0]) for q in QUANTILES]
    return [candidate(f"quantile={q:g}", {"quantile": q}, data) for q, data in quantiles]


def candidates_for(
    cfg: DeployConfig, inflections: list[float] | None = None, calibration: tuple[list[np.ndarray], str] | None = None, progress=SILENT
) -> list[Candidate]:
    """Every distinct schedule of the method's knob, least aggressive (highest estimated FLOPs) first."""
    method = cfg.merge.reduction
    knob = method.tune_knob
    if knob is None:
        tunable = ", ".join(n for n, m in METHODS.items() if m.tune_knob)
        raise DeploytkError(f"method {method.name} cannot be tuned: {method.untunable_reason}.", hint=f"Or tune one of: {tunable}.")
    if inflections and knob != "r":
        raise DeploytkError(f"`inflections=` is for the r-scheduled methods (tome, mctf); {method.name} is tuned by its {knob}.")
    progress.step("planning the candidate schedules")
    family = create_model(cfg.model_copy(update={"checkpoint": None, "pretrained": False}))  # schedules do not depend on weights
    if knob == "r":
        found = _r_candidates(cfg, family, inflections or [_config_inflection(cfg)])
    elif knob == "keep_rate":
        found = _keep_rate_candidates(cfg, family)
    else:  # "quantile": a calibrated method's statistic
        found = _calibrated_candidates(cfg, *calibration, progress)
    by_schedule: dict[tuple, Candidate] = {}
    for c in found:  # one candidate per token schedule (the same graph): the first found wins
        by_schedule.setdefault(tuple(c.tokens), c)
    dense_tokens = [family.num_patches + family.num_prefix_tokens] * family.depth
    return sorted((c for c in by_schedule.values() if c.tokens != dense_tokens), key=lambda c: -c.cost)


def _config_inflection(cfg: DeployConfig) -> float:
    r = cfg.merge.r
    return float(getattr(r, "inflection", 0.0))
