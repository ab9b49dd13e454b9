"""Artifact directories are written atomically: build in a temp dir, then rename into place."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

from deploytk.errors import DeploytkError

MODEL_FILE = "model.onnx"
MANIFEST_FILE = "manifest.json"


@contextlib.contextmanager
def atomic_directory(target: Path):
    """Yield a temp dir next to ``target``; on success it replaces ``target``, on failure it is removed."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{tmp.name.rsplit('-', 1)[-1]}")
        target.rename(old)
    tmp.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def require_artifact_dir(directory: Path) -> Path:
    """The artifact dir of an earlier export, or a clear error if it is not one."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DeploytkError(
            f"artifact directory {directory} does not exist.",
            hint="Create it with `deploytk export CONFIG --output DIR` first.",
        )
    for name in (MODEL_FILE, MANIFEST_FILE):
        if not (directory / name).is_file():
            raise DeploytkError(
                f"{directory} is not a deploytk artifact directory: {name} is missing.",
                hint="Re-run `deploytk export` to write model.onnx and manifest.json there.",
            )
    return directory
