"""The ready-made export configs that ship with deploytk, found by name (``deploytk export deit_small_tome_r16``).

They live in the source tree's ``export_configs/``; a wheel holds the same files as ``deploytk/export_configs/``, with
the digits models their ``checkpoint: ../assets/...`` lines name as ``deploytk/assets/`` (setup.py maps both), so a
relative checkpoint resolves the same way in either. Listing them reads their YAML and nothing else: validating a
config needs the methods' code, which imports torch, and ``deploytk configs`` answers at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from deploytk.errors import DeploytkError

_PACKAGE = Path(__file__).resolve().parent
#: the folder of ready-made configs: the wheel's, else the source tree's (an editable install's)
FOLDER = next((p for p in (_PACKAGE / "export_configs", _PACKAGE.parent / "export_configs") if p.is_dir()), _PACKAGE / "export_configs")
#: what `deploytk export` and `inspect` use without a config
DEFAULT_NAME = "deit_small_tome_r16"
DEFAULT_CONFIG = FOLDER / f"{DEFAULT_NAME}.yaml"
SUFFIX = ".yaml"


def default_config() -> Path:
    """The ready-made config used without one, or a clear error where this install does not have it."""
    if not DEFAULT_CONFIG.is_file():
        raise DeploytkError(
            f"no CONFIG was given and the default config {DEFAULT_CONFIG} is not part of this installation.",
            hint="Pass a config YAML, e.g. `deploytk export my_config.yaml`, or reinstall deploytk.",
        )
    return DEFAULT_CONFIG


def find(name: str | Path) -> Path | None:
    """The ready-made config called ``name`` (its file name without ``.yaml``), or None: a path with a folder or a
    suffix is a file of the user's, never a name."""
    text = str(name)
    if not text or Path(text).name != text or Path(text).suffix:
        return None
    path = FOLDER / f"{text}{SUFFIX}"
    return path if path.is_file() else None


def names() -> list[str]:
    return sorted(p.stem for p in FOLDER.glob(f"*{SUFFIX}"))


def describe(path: Path) -> dict[str, Any]:
    """One config as ``deploytk configs`` lists it: its name, what its first comment line says, and its main settings
    as written (defaults are not filled in: that is validation's job)."""
    text = path.read_text(encoding="utf-8")
    first = text.lstrip().splitlines()[0] if text.strip() else ""
    data = yaml.safe_load(text) or {}
    merge, export = data.get("merge") or {}, data.get("export") or {}
    return {
        "name": path.stem,
        "description": first.lstrip("#").strip() if first.startswith("#") else "",
        "model": data.get("model"),
        "method": merge.get("method", "tome"),
        "r": merge.get("r"),
        "options": merge.get("options") or {},
        "precision": export.get("precision", "fp32"),
        "output": export.get("output"),
        "checkpoint": data.get("checkpoint"),
        "path": str(path),
    }


def listing(contains: str | None = None) -> list[dict[str, Any]]:
    """Every ready-made config (``contains``: those whose name, model or method has that text), by name."""
    entries = [describe(FOLDER / f"{name}{SUFFIX}") for name in names()]
    if contains:
        needle = contains.lower()
        entries = [e for e in entries if any(needle in str(e[k]).lower() for k in ("name", "model", "method"))]
    return entries
