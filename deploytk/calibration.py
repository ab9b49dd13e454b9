"""`deploytk calibrate`: turn a method's data-dependent r into a fixed per-layer schedule.

A ``calibrated`` method (ATM) chooses r per batch (ATM: how many pairs clear the layer's
similarity threshold). A static graph needs one r per layer, so the method runs dynamically in
PyTorch over calibration batches (its ``calibration_pass``) and each layer's r becomes a
quantile (default: the median) of the r values it chose, floored. The statistic, the data and
the per-layer spread are written into the new config (``merge.options.calibration``) and from
there into every export's manifest.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
import yaml

from deploytk.config import DeployConfig, config_from_dict, load_config, portable
from deploytk.data import folder_batches, synthetic_batches
from deploytk.errors import DeploytkError
from deploytk.files import claim_yaml
from deploytk.models import build_reference
from deploytk.progress import SILENT, Progress
from deploytk.reducers import METHODS


def require_calibrated(cfg: DeployConfig) -> None:
    """Calibration is for methods with a data-dependent schedule (checked before any image is loaded)."""
    if not cfg.merge.reduction.calibrated:
        which = ", ".join(name for name, m in METHODS.items() if m.calibrated)
        raise DeploytkError(
            f"calibration is for the methods whose r depends on the data ({which}); this config uses {cfg.merge.method!r}, "
            "whose schedule is fixed by its config.",
            hint=f"Set `merge.method` to one of: {which}.",
        )


def r_samples(model, batches: list[np.ndarray], progress: Progress = SILENT) -> np.ndarray:
    """The method's batch-adaptive r of every layer on every batch: [depth, batches] (``tune`` takes many quantiles of one run)."""
    per_batch = []
    progress.start(len(batches), f"running {model.reduction.name} on {len(batches)} calibration batches")
    for b in batches:
        per_batch.append(model.reduction.calibration_pass(model, torch.from_numpy(b)))
        progress.advance()
    return np.array(per_batch).T


def calibrate(
    cfg: DeployConfig,
    batches: list[np.ndarray],
    quantile: float,
    source: str,
    progress: Progress = SILENT,
    model=None,
    samples: np.ndarray | None = None,
) -> tuple[dict, dict]:
    """Return (the calibrated config as a dict, a report); ``samples``: ``r_samples`` of these batches, if already run."""
    require_calibrated(cfg)
    if not batches:
        raise DeploytkError("calibration needs inputs: pass `data=DIR` or `synthetic=N` (N >= 1).")
    if not 0.0 <= quantile <= 1.0:
        raise DeploytkError(f"`quantile={quantile}` must be in [0, 1].")
    model = model if model is not None else build_reference(cfg)
    per_layer = r_samples(model, batches, progress) if samples is None else samples
    r = [int(math.floor(np.quantile(vals, quantile))) for vals in per_layer]
    calibration = {
        "statistic": model.reduction.calibration_statistic.format(q=quantile),
        "quantile": quantile,
        "source": source,
        "images": int(sum(len(b) for b in batches)),
        "batches": len(batches),
        "batch_size": int(len(batches[0])),
        **model.reduction.calibration_settings(),
        "per_layer_r": [
            {"min": int(v.min()), "median": float(np.median(v)), "mean": round(float(v.mean()), 3), "max": int(v.max())} for v in per_layer
        ],
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    data = cfg.model_dump(mode="json", exclude_defaults=False)
    data["merge"]["r"] = r
    data["merge"]["options"] = {**cfg.merge.options, "calibration": calibration}
    config_from_dict(data, "(calibrated config)")  # must load back
    return data, {"r": r, **calibration}


def calibrate_config(
    config: Path,
    *,
    data: Path | None = None,
    synthetic: int | None = None,
    num_samples: int = 256,
    batch_size: int = 16,
    quantile: float = 0.5,
    output: Path | None = None,
    progress: Progress = SILENT,
) -> dict:
    """`deploytk calibrate`: calibrate CONFIG on ``data`` (a folder) or ``synthetic`` seeded inputs and
    write the calibrated config (default CONFIG's folder/<stem>_calibrated.yaml) atomically; returns the report."""
    cfg = load_config(config)
    if (data is None) == (synthetic is None):
        raise DeploytkError("calibration needs inputs: pass exactly one of `data=DIR` or `synthetic=N`.")
    if synthetic is not None and synthetic < 1:
        raise DeploytkError(f"`synthetic={synthetic}`: calibration needs at least 1 image.")
    if batch_size < 1 or num_samples < 1:
        raise DeploytkError("`batch_size=` and `num_samples=` must be >= 1.")
    require_calibrated(cfg)
    with claim_yaml(Path(output) if output else config.with_name(f"{config.stem}_calibrated.yaml"), "deploytk calibrate") as output:
        progress.step("building the model")
        model = build_reference(cfg)
        progress.step("loading calibration images")
        if data is not None:
            batches = folder_batches(data, num_samples, batch_size, model.family.input_transform(), model.family.input_kind, "data")
            source = f"data: {data}"
        else:
            batches = synthetic_batches(synthetic, batch_size, model.family.input_kind)  # export.img_size: null is the model's own
            source = f"synthetic: {synthetic} seeded standard-normal images"
        data, report = calibrate(cfg, batches, quantile, source, progress, model)
        header = f"# Calibrated by `deploytk calibrate {config}` ({report['statistic']}).\n"
        output.write_yaml(header + yaml.safe_dump(portable(data, output.path), sort_keys=False))
        return {"output": str(output.path), **report}
