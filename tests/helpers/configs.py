"""The shipped configs as tests load them, and the ToMe reference most tests build."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "export_configs"
DIGITS_DENSE = CONFIGS / "digits_vit_dense.yaml"
DIGITS_TOME_R4 = CONFIGS / "digits_vit_tome_r4.yaml"


def _digits_input():
    from deploytk.inputs import ImageInput

    return ImageInput.of_size((32, 32))


#: the digits ViT's input: a 32x32 RGB image
DIGITS_INPUT = _digits_input()


def digits_config(stem: str, **overrides):
    """A config of export_configs/ with its checkpoint path made absolute (tests may run from anywhere)."""
    from deploytk.config import apply_overrides, load_config

    cfg = load_config(CONFIGS / f"{stem}.yaml")
    overrides = {"checkpoint": str(ROOT / cfg.checkpoint) if cfg.checkpoint else None, **overrides}
    return apply_overrides(cfg, **overrides)


def export_config(stem: str, out, **overrides):
    """Export export_configs/<stem>.yaml (with overrides) to ``out`` and return ``out``: for a test of the export itself;
    a test that only reads an export takes the shared one (the ``exported`` fixture)."""
    from deploytk.exporter.pipeline import run_export

    run_export(digits_config(stem, **overrides), out)
    return out


def tome_model(vit, r_spec, prop_attn: bool = True):
    """ToMe on ``vit`` at ``r_spec`` (int, per-block list or (r, inflection)): the reference most tests use."""
    from deploytk.merging.merged_vit import build_merged
    from deploytk.reducers import get_method

    method = get_method("tome")
    return build_merged(method, vit, r_spec, prop_attn, method.parse_options({}))
