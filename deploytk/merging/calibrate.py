"""`deploytk calibrate`: turn ATM's data-dependent r into a fixed per-layer schedule.

ATM chooses r per batch (how many pairs clear the layer's similarity threshold). A static
graph needs one r per layer, so ATM runs dynamically in PyTorch over calibration batches
and each layer's r becomes a quantile (default: the median) of the r values it chose,
floored. The statistic, the data and the per-layer spread are written into the new config
(``merge.options.calibration``) and from there into every export's manifest.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone

import numpy as np
import torch

from deploytk.config import DeployConfig, config_from_dict
from deploytk.errors import DeploytkError
from deploytk.models import build_reference

STATISTIC = (
    "per layer: the {q:g}-quantile (floored) over calibration batches of ATM's batch-adaptive r, where a batch's r is the "
    "floor of the mean over its images of the number of pairs whose cosine similarity exceeds theta_l"
)


def require_atm(cfg: DeployConfig) -> None:
    """Calibration only makes sense for ATM (checked before any image is loaded)."""
    if cfg.merge.method != "atm":
        raise DeploytkError(f"calibration is for method atm; this config uses {cfg.merge.method!r}.", hint="Set `merge.method: atm`.")


def calibrate(cfg: DeployConfig, batches: list[np.ndarray], quantile: float, source: str, progress=None) -> tuple[dict, dict]:
    """Return (the calibrated config as a dict, a report)."""
    require_atm(cfg)
    if not batches:
        raise DeploytkError("calibration needs images: pass --images DIR or --synthetic N (N >= 1).")
    if not 0.0 <= quantile <= 1.0:
        raise DeploytkError(f"--quantile {quantile} must be in [0, 1].")
    model = build_reference(cfg)
    per_batch = []
    for b in batches:
        per_batch.append(model.calibration_pass(torch.from_numpy(b)))
        if progress:
            progress()
    per_layer = np.array(per_batch).T  # [depth, batches]
    r = [int(math.floor(np.quantile(vals, quantile))) for vals in per_layer]
    calibration = {
        "statistic": STATISTIC.format(q=quantile),
        "quantile": quantile,
        "source": source,
        "images": int(sum(len(b) for b in batches)),
        "batches": len(batches),
        "batch_size": int(len(batches[0])),
        "thresholds": [round(t, 6) for t in model.thresholds],
        "split_layer": model.split_layer,
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
