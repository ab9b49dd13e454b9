"""What "the file system is unchanged" means in the tests that check it."""

from __future__ import annotations

import stat
from pathlib import Path


def snapshot(root) -> dict:
    """Every entry under ``root`` (and root itself): kind, mode, mtime and bytes."""
    root = Path(root)
    entries = {}
    for path in [root, *sorted(root.rglob("*"))]:
        st = path.lstat()
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else None
        entries[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), st.st_mode, st.st_mtime_ns, data)
    return entries
