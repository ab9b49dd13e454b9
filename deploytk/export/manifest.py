"""manifest.json: everything needed to rebuild the reference and to trust the ONNX file."""

from __future__ import annotations

import hashlib
import json
import platform
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from deploytk.errors import DeploytkError
from deploytk.export.artifacts import MANIFEST_FILE, MODEL_FILE

VERSIONED_PACKAGES = ("deploytk", "torch", "timm", "onnx", "onnxscript", "onnxruntime", "polygraphy")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
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


def read_manifest(directory: Path, verify_model: bool = True) -> dict:
    path = Path(directory) / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise DeploytkError(f"{path} could not be read as JSON ({err}).", hint="Re-run `deploytk export`.") from None
    if verify_model:
        actual = sha256_file(Path(directory) / MODEL_FILE)
        expected = manifest.get("onnx", {}).get("sha256")
        if actual != expected:
            raise DeploytkError(
                f"{Path(directory) / MODEL_FILE} does not match its manifest (sha256 {actual[:12]}... vs "
                f"{str(expected)[:12]}...): the file was changed after export.",
                hint="Re-run `deploytk export` to regenerate both.",
            )
    return manifest


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
