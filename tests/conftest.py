"""Shared helpers: deterministic weights that do not depend on timm's or torch's init code."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "2")


def seeded_init(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Fill every parameter from numpy's generator (norm weights around 1, the rest ~N(0, 0.05))."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            values = rng.standard_normal(tuple(p.shape)).astype(np.float32) * 0.05
            if "norm" in name and name.endswith("weight"):
                values += 1.0
            p.copy_(torch.from_numpy(values))
    return model.eval()


def seeded_images(n: int, img: int = 224, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((n, 3, img, img)).astype(np.float32))


def digits_config(stem: str, **overrides):
    """A config of export_configs/ with its checkpoint path made absolute (tests may run from anywhere)."""
    from pathlib import Path

    from deploytk.config import apply_overrides, load_config

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(root / "export_configs" / f"{stem}.yaml")
    overrides = {"checkpoint": str(root / cfg.checkpoint) if cfg.checkpoint else None, **overrides}
    return apply_overrides(cfg, **overrides)


def export_config(stem: str, out, **overrides):
    """Export export_configs/<stem>.yaml (with overrides) to ``out`` and return ``out``."""
    from deploytk.export.pipeline import run_export

    run_export(digits_config(stem, **overrides), out)
    return out


def tome_model(vit, r_spec, prop_attn: bool = True):
    """ToMe on ``vit`` at ``r_spec`` (int, per-block list or (r, inflection)): the reference most tests use."""
    from deploytk.merging.merged_vit import build_merged
    from deploytk.methods import get_method

    method = get_method("tome")
    return build_merged(method, vit, r_spec, prop_attn, method.parse_options({}))


def has_gpu() -> bool:
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    from deploytk.optional import tensorrt_version

    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is visible to torch on this machine")
    skip_trt = pytest.mark.skip(reason="needs TensorRT (libnvinfer), which is not installed here")
    for item in items:
        if "gpu" in item.keywords and not has_gpu():
            item.add_marker(skip_gpu)
        if "trt" in item.keywords and tensorrt_version() is None:
            item.add_marker(skip_trt)
