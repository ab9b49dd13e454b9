"""Where deploytk writes, and how: nothing a user owns is ever lost, and nothing appears half-written.

The one rule for every command that writes (export, calibrate, tune, visualize, package,
plugins compile, the benchmarks): the output path is **claimed before any work**
(``claim_directory`` / ``claim_file``), and the claim refuses, with the path and what to do:

- ``.``, ``..``, ``/``, the working directory or one of its parents, a symbolic link, a path
  under a file, a folder that cannot be written;
- a regular file that deploytk did not write (recognised by the mark every deploytk file
  carries: a ``written_by`` key in JSON, a ``# ... deploytk ...`` first line in YAML, the PNG
  ``Software`` text), and ``--force`` does not change that;
- a non-empty folder that is not an earlier deploytk output of the same kind (each kind,
  ``DirectoryKind``, says which files of such a folder deploytk wrote, from its manifest).

An earlier output of the same kind is replaced, but only the files deploytk wrote there: other
files in it are refused unless ``--force``, and with ``--force`` they are kept where they are.
Writes go to a temporary sibling that replaces the target only when complete; on any failure,
Ctrl-C included, the temporary folder and any parent folder the claim created are removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from deploytk.errors import DeploytkError

#: how many foreign file names an error lists before "and N more"
_LISTED = 5


@dataclass(frozen=True)
class DirectoryKind:
    """A kind of folder deploytk writes (an export, a Triton model, a kernel set), and how it knows an earlier one."""

    name: str  # "deploytk export": what the messages call it
    #: the file whose content says "this is one": removed first and written last when a folder is replaced in place
    marker: str
    #: relative POSIX paths of the files deploytk writes in a folder of this kind (read from its marker), or None
    #: when the folder is not one; may name files that are absent
    owned: Callable[[Path], set[str] | None]
    #: an earlier one is replaced only with --force (a Triton model a server may be loading), not by a plain rerun
    replace_needs_force: bool = False


def default_mode(path: Path, mode: int) -> None:
    """Temporaries are created owner-only (0600/0700); a user's outputs get the modes open() and mkdir() would give."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, mode & ~umask)


def _files_under(directory: Path) -> set[str]:
    """Every file and link under ``directory`` (relative POSIX paths); empty folders are not files."""
    found = set()
    for root, dirs, files in os.walk(directory):
        for name in files + [d for d in dirs if (Path(root) / d).is_symlink()]:
            found.add((Path(root) / name).relative_to(directory).as_posix())
    return found


def _listing(names) -> str:
    names = sorted(names)
    more = f" and {len(names) - _LISTED} more" if len(names) > _LISTED else ""
    return ", ".join(names[:_LISTED]) + more


def _check_path(path: Path, option: str) -> Path:
    """Refuse a path no output may take; return the nearest existing folder above it (checked writable)."""
    text = str(path)
    resolved = path.resolve()
    cwd = Path.cwd().resolve()
    if path.name in ("", ".", "..") or resolved == cwd or resolved in cwd.parents:
        where = "the root folder" if resolved == Path(resolved.anchor) else "the working folder or one of its parents"
        raise DeploytkError(
            f"{option} {text} names {where}; deploytk writes an output under a name of its own and never replaces such a folder.",
            hint=f"Give a new name, e.g. {option} {Path(text) / 'out' if resolved != cwd else 'out'}.",
        )
    if path.is_symlink():
        raise DeploytkError(
            f"{option} {text} is a symbolic link; deploytk does not write through or replace links.",
            hint=f"Give the real path ({resolved}) or another name.",
        )
    for above in path.absolute().parents:
        if above.exists() or above.is_symlink():
            if not above.is_dir():
                raise DeploytkError(f"{option} {text}: {above} is a file, not a folder, so nothing can be written under it.")
            break
    _require_writable(above, f"{option} {text}")
    return above


def _require_writable(folder: Path, what: str) -> None:
    """Make and remove an entry in ``folder``: the real test (root passes os.access on a folder that still takes no
    files, like /proc); the folder's times are put back, so a refused command leaves it as it was."""
    before = folder.stat()
    probe = _temp_name(folder, ".deploytk-probe-")
    try:
        probe.mkdir(mode=0o700)
    except OSError as err:
        raise DeploytkError(f"{what}: cannot write in {folder} ({err.strerror or err}).") from None
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()
    with contextlib.suppress(OSError):
        os.utime(folder, ns=(before.st_atime_ns, before.st_mtime_ns))


def _created_parents(path: Path) -> list[Path]:
    """The missing folders above ``path``, nearest first (made by the write, removed again if it fails)."""
    missing = []
    for above in path.absolute().parents:
        if above.exists():
            break
        missing.append(above)
    return missing


def _remove_if_empty(folders: list[Path]) -> None:
    for folder in folders:  # nearest first
        with contextlib.suppress(OSError):
            folder.rmdir()


@dataclass
class DirectoryOutput:
    """A claimed output folder: ``write()`` yields a temporary folder to fill; it becomes ``path`` when complete."""

    path: Path
    kind: DirectoryKind
    option: str
    force: bool
    #: files deploytk did not write that stay where they are (an earlier output with --force)
    kept: tuple[str, ...] = ()

    @contextlib.contextmanager
    def write(self) -> Iterator[Path]:
        claim = claim_directory(self.path, self.kind, option=self.option, force=self.force)  # the folder may have changed since
        target = self.path
        tmp = _temp_name(target.parent, f".{target.name}.tmp-")  # named before it exists: cleanup finds it whenever a signal lands
        made = _created_parents(target)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp.mkdir(mode=0o700)
            default_mode(tmp, 0o777)
            yield tmp
            if not target.exists():
                tmp.rename(target)
            elif not claim.kept and any(target.iterdir()):
                _swap(tmp, target)  # only deploytk's files there: replace the folder as a whole
            else:
                _replace_in_place(tmp, target, self.kind)  # keeps the user's files (or an empty folder they made) where they are
        except BaseException as err:
            if not _not_ours(err, tmp):
                shutil.rmtree(tmp, ignore_errors=True)
            _remove_if_empty(made)
            raise


def _temp_name(folder: Path, prefix: str, suffix: str = "") -> Path:
    """A fresh temporary name in ``folder``, chosen before anything is made there: a temporary created by
    ``mkdtemp``/``mkstemp`` is nameless to the caller until they return, and a Ctrl-C or kill landing in between (the
    moment a watcher sees it appear) would leave it behind."""
    return folder / f"{prefix}{secrets.token_hex(8)}{suffix}"


def _not_ours(err: BaseException, tmp: Path) -> bool:
    """The error is the temporary's own creation failing because the name exists: that entry is someone else's."""
    return isinstance(err, FileExistsError) and err.filename == str(tmp)


def _swap(tmp: Path, target: Path) -> None:
    old = target.with_name(f".{target.name}.old-{tmp.name.rsplit('-', 1)[-1]}")
    target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def _replace_in_place(tmp: Path, target: Path, kind: DirectoryKind) -> None:
    """Move the new files into ``target`` one by one, then remove the earlier output's files the new one lacks.

    The marker goes first and comes back last, so an interrupted replace never looks like a complete output.
    """
    owned = kind.owned(target) or set()
    (target / kind.marker).unlink(missing_ok=True)
    new = _files_under(tmp)
    for name in sorted(new - {kind.marker}):
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp / name, target / name)
    for name in sorted(owned - new):
        stale = target / name
        if stale.is_file() or stale.is_symlink():
            stale.unlink()
            _remove_if_empty([p for p in stale.parents if p != target and target in p.parents])
    if kind.marker in new:
        os.replace(tmp / kind.marker, target / kind.marker)
    shutil.rmtree(tmp, ignore_errors=True)


def claim_directory(path: Path, kind: DirectoryKind, *, option: str = "--output", force: bool = False) -> DirectoryOutput:
    """Check that ``path`` may receive a ``kind`` folder (see the module doc); raise DeploytkError naming the path if not."""
    path = Path(path)
    _check_path(path, option)
    if not path.exists():
        return DirectoryOutput(path, kind, option, force)
    if not path.is_dir():
        raise DeploytkError(
            f"{option} {path} is a file, not a {kind.name} folder; deploytk never overwrites a file it did not write "
            "(--force does not either).",
            hint=f"Choose another {option}.",
        )
    present = _files_under(path)
    if not present:
        return DirectoryOutput(path, kind, option, force)
    owned = kind.owned(path)
    if owned is None:
        raise DeploytkError(
            f"{option} {path} is a folder holding files deploytk did not write ({_listing(present)}); it is not a {kind.name}. "
            f"deploytk writes a {kind.name} only into a new or empty folder or over an earlier {kind.name}, and --force "
            "never deletes other files.",
            hint=f"Choose another {option}.",
        )
    foreign = present - owned
    if foreign and not force:
        raise DeploytkError(
            f"{option} {path} is an earlier {kind.name} but also holds files deploytk did not write ({_listing(foreign)}); "
            "it was left as it is.",
            hint=f"Pass --force to replace the {kind.name}'s own files and keep those where they are, or choose another {option}.",
        )
    if kind.replace_needs_force and not force:
        raise DeploytkError(
            f"{option} {path} already exists (an earlier {kind.name}); it was left as it is.",
            hint=f"Pass --force to replace it (atomically), or choose another {option}.",
        )
    return DirectoryOutput(path, kind, option, force, tuple(sorted(foreign)))


# ---- single files ---------------------------------------------------------------------------

#: the mark a standalone JSON file deploytk writes carries: its first key, naming the writer
WRITTEN_BY = "written_by"


def written_by_deploytk(path: Path) -> bool:
    """Whether ``path`` carries deploytk's mark (JSON ``written_by``, YAML first-line comment, PNG ``Software`` text)."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            data = json.loads(path.read_text())
            return isinstance(data, dict) and str(data.get(WRITTEN_BY, "")).startswith("deploytk")
        if suffix in (".yaml", ".yml"):
            with path.open() as f:
                first = f.readline()
            return first.startswith("#") and "deploytk" in first
        if suffix == ".png":
            from PIL import Image

            with Image.open(path) as img:
                return str(img.info.get("Software", "")).startswith("deploytk")
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return False


@dataclass
class FileOutput:
    """A claimed output file: written through a temporary sibling, marked as deploytk's, replaced only when complete."""

    path: Path
    option: str
    #: who wrote it, e.g. "deploytk tune": the mark that lets a rerun replace it
    writer: str

    @contextlib.contextmanager
    def write(self) -> Iterator[Path]:
        """A temporary path with ``path``'s suffix (writers that choose the format by it) to fill; the caller marks it."""
        claim_file(self.path, self.writer, option=self.option)  # the file may have changed since
        with atomic_file(self.path) as tmp:
            yield tmp

    def write_json(self, payload: dict) -> None:
        """``payload`` as indented JSON, ``written_by`` first."""
        with self.write() as tmp:
            tmp.write_text(json.dumps({WRITTEN_BY: self.writer, **payload}, indent=2) + "\n")

    def write_yaml(self, text: str) -> None:
        """A YAML document whose first line is a comment naming the writer (``# Tuned by `deploytk tune ...```)."""
        first = text.split("\n", 1)[0]
        if not (first.startswith("#") and "deploytk" in first):
            raise ValueError(f"a YAML file deploytk writes starts with a comment naming deploytk, not {first!r}")
        with self.write() as tmp:
            tmp.write_text(text)

    def save_figure(self, fig, **savefig_kwargs) -> None:
        """A matplotlib figure as PNG, the writer in its ``Software`` text."""
        with self.write() as tmp:
            fig.savefig(tmp, format="png", metadata={"Software": self.writer}, **savefig_kwargs)


def claim_file(path: Path, writer: str, *, option: str = "--output") -> FileOutput:
    """Check that ``path`` may be written by ``writer`` (see the module doc); raise DeploytkError naming the path if not."""
    path = Path(path)
    _check_path(path, option)
    if path.exists():
        if path.is_dir():
            raise DeploytkError(
                f"{option} {path} is a folder; {writer} writes a file here.", hint=f"Give a file name, e.g. {path / 'out'}."
            )
        if not written_by_deploytk(path):
            raise DeploytkError(
                f"{option} {path} exists and was not written by deploytk; it was left as it is (deploytk never overwrites "
                "a file it did not write).",
                hint=f"Choose another {option}, or move the file away yourself.",
            )
    return FileOutput(path, option, writer)


def claim_yaml(path: Path, writer: str, *, option: str = "--output") -> FileOutput:
    """``claim_file`` for a config: the name must end in .yaml or .yml (how a rerun recognises it, and what loads it)."""
    claim = claim_file(path, writer, option=option)
    if claim.path.suffix.lower() not in (".yaml", ".yml"):
        raise DeploytkError(f"{option} {path}: {writer} writes a YAML config; give a file name ending in .yaml or .yml.")
    return claim


# ---- files inside a folder deploytk owns ----------------------------------------------------


@contextlib.contextmanager
def atomic_file(target: Path) -> Iterator[Path]:
    """Yield a temp path next to ``target`` to write; on success it replaces ``target``, on failure it (and any
    folder made for it) is removed.

    Unchecked: only for files inside a folder deploytk owns (an export's engines and baseline cache); a path the user names
    goes through ``claim_file``. The temp name keeps ``target``'s suffix, for writers that choose the format by it.
    """
    target = Path(target)
    tmp = _temp_name(target.parent, f".{target.stem}.tmp-", target.suffix)
    made = _created_parents(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        default_mode(tmp, 0o666)
        yield tmp
        os.replace(tmp, target)
    except BaseException as err:
        if not _not_ours(err, tmp):
            tmp.unlink(missing_ok=True)
        _remove_if_empty(made)
        raise


def write_atomically(target: Path, data: bytes | str) -> None:
    """Write ``data`` (text as UTF-8) to ``target`` atomically (inside a folder deploytk owns, as ``atomic_file``)."""
    with atomic_file(target) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
