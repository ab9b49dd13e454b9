"""What a manifest records besides the config: file hashes, package versions, the time."""

from __future__ import annotations

import hashlib
import platform
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from deploytk.files import sha256_file  # noqa: F401  (the one file hash; imported from here by export code)

VERSIONED_PACKAGES = ("deploytk", "torch", "timm", "onnx", "onnxscript", "onnxruntime", "openvino", "polygraphy")


def sha256_tree(folder: Path) -> str:
    """One sha256 for a folder's content: every file's relative path and bytes (a save_pretrained model folder)."""
    folder = Path(folder)
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + bytes.fromhex(sha256_file(path)))
    return digest.hexdigest()


def package_versions() -> dict[str, str | None]:
    out = {}
    for name in VERSIONED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    out["python"] = platform.python_version()
    return out


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
