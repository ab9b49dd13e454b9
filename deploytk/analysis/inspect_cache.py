"""`inspect`'s answers kept on disk, so that asking again costs a file read instead of torch, timm and fvcore.

An answer depends on the config's text, the overrides, the architecture of an ``hf:`` model (its config.json) and the
code that counts (deploytk's own files, torch, timm, transformers, fvcore): the key is a digest of all of them, read
without importing any of those libraries, and a change to any gives a new key. Weights never matter (inspect counts
with random ones). Entries live in ``$DEPLOYTK_CACHE/inspect/`` (``deploytk.files.cache_root``); a corrupt one is a
miss and is rewritten.
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from deploytk.defaults import HF_PREFIX
from deploytk.files import cache_root, write_atomically
from deploytk.ready_made import find as find_ready_made

SECTION = "inspect"
#: the distributions whose code shapes a model or counts its FLOPs
COUNTED_BY = ("torch", "timm", "transformers", "fvcore")
_PACKAGE = Path(__file__).resolve().parents[1]


def _code_signature() -> str:
    """deploytk's own files as they are now (names, sizes, times: no contents read), and the counting libraries' versions."""
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        stat = path.stat()
        digest.update(f"{path.relative_to(_PACKAGE)}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    for name in COUNTED_BY:
        try:
            digest.update(f"{name}={metadata.version(name)};".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{name}=none;".encode())
    return digest.hexdigest()


def key(config: str | Path, overrides: dict[str, Any]) -> str | None:
    """The cache key of inspecting the config file (or ready-made name) ``config`` with ``overrides``, or None where the
    answer cannot be keyed without building the model (no such file; a model folder without a config.json)."""
    path = Path(config)
    if not path.exists():  # a name, as load_config reads one: a folder of that name is not one
        path = find_ready_made(config) or path
    if not path.is_file():
        return None
    try:
        text = path.read_bytes()
        data = yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError):
        return None  # unreadable or not YAML: the full path reports what is wrong with it
    model = overrides.get("model") or (data.get("model") if isinstance(data, dict) else None)
    architecture = b""
    if isinstance(model, str) and model.startswith(HF_PREFIX):
        folder = Path(model[len(HF_PREFIX) :]).expanduser()
        folder = folder if folder.is_absolute() or overrides.get("model") else path.parent / folder
        if not (folder / "config.json").is_file():
            return None  # a Hub id or a missing folder: not keyed
        # the folder too: the answer names it, and two folders of one architecture are two answers
        architecture = str(folder.resolve()).encode() + b"\0" + (folder / "config.json").read_bytes()
    shown = {k: canonical(v) for k, v in sorted(overrides.items()) if v is not None and k != "checkpoint"}
    digest = hashlib.sha256()
    for part in (text, architecture, json.dumps(shown, sort_keys=True, default=str).encode(), _code_signature().encode()):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def canonical(value: Any) -> Any:
    """``value`` as JSON that keeps what the API tells apart: a tuple (``r=(8, -1)``, r and inflection) is not a list
    (``r=[8, -1]``, one r per block), which plain JSON would write alike."""
    if isinstance(value, tuple):
        return {"tuple": [canonical(v) for v in value]}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in value.items()}
    return value


def read(cache_key: str | None) -> dict[str, Any] | None:
    if cache_key is None:
        return None
    try:
        answer = json.loads((cache_root() / SECTION / f"{cache_key}.json").read_text())
    except (OSError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


def write(cache_key: str | None, answer: dict[str, Any]) -> None:
    if cache_key is None:
        return
    folder = cache_root() / SECTION
    folder.mkdir(parents=True, exist_ok=True)
    write_atomically(folder / f"{cache_key}.json", json.dumps(answer))
