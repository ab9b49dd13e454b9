"""Atomic writes: a file or directory appears complete under its name, or not at all.

Every artifact deploytk writes (exports, engines, kernels, configs, datasets, benchmark
results) goes through these two helpers, so an interrupted or failing command never leaves
a half-written file where a user or a later command would read it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _default_mode(path: Path, mode: int) -> None:
    """mkstemp/mkdtemp create owner-only (0600/0700) entries; a user's outputs get the modes open() and mkdir() would give."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, mode & ~umask)


@contextlib.contextmanager
def atomic_directory(target: Path) -> Iterator[Path]:
    """Yield a temp dir next to ``target``; on success it replaces ``target``, on failure it is removed."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    _default_mode(tmp, 0o777)
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


@contextlib.contextmanager
def atomic_file(target: Path) -> Iterator[Path]:
    """Yield a temp path next to ``target`` to write; on success it replaces ``target``, on failure it is removed.

    The temp name keeps ``target``'s suffix, for writers that choose the format by it (matplotlib, onnx).
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.stem}.tmp-", suffix=target.suffix, dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    _default_mode(tmp, 0o666)
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomically(target: Path, data: bytes | str) -> None:
    """Write ``data`` (text as UTF-8) to ``target`` atomically."""
    with atomic_file(target) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
