"""Where deploytk writes, and how: nothing a user owns is ever lost, and nothing appears half-written.

The one rule for every command that writes (export, calibrate, tune, visualize, package,
plugins compile, the benchmarks): the output path is **claimed before any work**
(``claim_directory`` / ``claim_file``), and the claim refuses, with the path and what to do:

- ``.``, ``..``, ``/``, the working directory or one of its parents, a symbolic link, a path
  under a file, a folder that cannot be written;
- a regular file that deploytk did not write (recognised by the mark every deploytk file
  carries: a ``written_by`` key in JSON, a ``# ... deploytk ...`` first line in YAML, the PNG
  ``Software`` text), and ``force`` does not change that;
- a non-empty folder that is not an earlier deploytk output of the same kind (each kind,
  ``DirectoryKind``, says which files of such a folder deploytk wrote, from its manifest).

An earlier output of the same kind is replaced, but only the files deploytk wrote there: other
files in it are refused unless ``force``, and with ``force`` they are kept where they are.
Writes go to a temporary sibling that replaces the target only when complete; on any failure,
Ctrl-C included, the temporary folder and any parent folder the claim created are removed.

**One writer per output.** A claim takes an OS lock (``flock``) on ``.NAME.deploytk-lock`` beside the
target and holds it until the write is done or given up (``with claim_...(...) as out:``; the lock
dies with the process, so a killed writer never blocks the next one). A second writer is refused at
once, naming the process that holds it. Holding the lock also proves that the target's temporaries
(``.NAME.tmp-*``, ``.NAME.old-*``) belong to no live writer: a run killed with SIGKILL leaves them,
and the next claim removes them and says so (a ``DeploytkNotice``); ``deploytk clean PATH`` lists and
removes them without writing anything.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import os
import re
import secrets
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from deploytk.errors import DeploytkError, DeploytkNotice, param

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
    #: an earlier one is replaced only with ``force`` (a Triton model a server may be loading), not by a plain rerun
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


def _named(option: str, value) -> str:
    """An output as a message names it: ``option`` is the parameter that took it (`output=PATH`, deploytk.errors.param),
    or words that describe it ("digits root PATH")."""
    return param(option, value) if option.isidentifier() else f"{option} {value}"


def _another(option: str) -> str:
    """What to choose instead: the parameter (`output=`), or the words."""
    return param(option) if option.isidentifier() else option


def _check_path(path: Path, option: str) -> Path:
    """Refuse a path no output may take; return the nearest existing folder above it (checked writable)."""
    text = str(path)
    resolved = path.resolve()
    cwd = Path.cwd().resolve()
    if path.name in ("", ".", "..") or resolved == cwd or resolved in cwd.parents:
        where = "the root folder" if resolved == Path(resolved.anchor) else "the working folder or one of its parents"
        raise DeploytkError(
            f"{_named(option, text)} names {where}; deploytk writes an output under a name of its own and never replaces such a folder.",
            hint=f"Give a new name, e.g. {_named(option, Path(text) / 'out' if resolved != cwd else 'out')}.",
        )
    if path.is_symlink():
        raise DeploytkError(
            f"{_named(option, text)} is a symbolic link; deploytk does not write through or replace links.",
            hint=f"Give the real path ({resolved}) or another name.",
        )
    for above in path.absolute().parents:
        if above.exists() or above.is_symlink():
            if not above.is_dir():
                raise DeploytkError(f"{_named(option, text)}: {above} is a file, not a folder, so nothing can be written under it.")
            break
    _require_writable(above, _named(option, text))
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


# ---- one writer per output ------------------------------------------------------------------

#: the lock file beside an output ``NAME``: ``.NAME.deploytk-lock``
LOCK_SUFFIX = ".deploytk-lock"
#: what a writer leaves beside its target while it works (``_temp_name``): ``.NAME.tmp-<hex>`` (a file keeps its suffix
#: after the hex: ``.STEM.tmp-<hex>.SUFFIX``) and, for a moment while a folder is swapped, ``.NAME.old-<hex>``
_LEFTOVER = re.compile(r"^\.(?P<stem>.+)\.(?P<what>tmp|old)-(?P<hex>[0-9a-f]{16})(?P<suffix>.*)$")
_LOCK = re.compile(r"^\.(?P<name>.+)" + re.escape(LOCK_SUFFIX) + "$")


def lock_path(target: Path) -> Path:
    return target.parent / f".{target.name}{LOCK_SUFFIX}"


class OutputLock:
    """An exclusive ``flock`` on ``.NAME.deploytk-lock`` beside ``target``: the lock is the kernel's, so it is gone when
    its holder dies however it dies; the file says who holds it and is removed on release."""

    def __init__(self, target: Path):
        self.target = Path(target)
        self.path = lock_path(self.target)
        self._fd: int | None = None
        #: the folder's times before the lock file was made (``Claim.release`` puts them back after a failure)
        self.folder_times: os.stat_result | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, *, wait: bool = False) -> str | None:
        """Take the lock; return None, or (``wait=False``) the holder's description when another process has it."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "another process"
                os.close(fd)
                return holder
            except BaseException:
                os.close(fd)
                raise
            try:  # the file may have been released (and removed) between our open and our lock: lock the current one
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        command = " ".join(Path(a).name if i == 0 else a for i, a in enumerate(sys.argv))[:200]
        since = datetime.now(timezone.utc).isoformat(timespec="seconds")
        os.pwrite(fd, f"pid {os.getpid()} ({command}) since {since}\n".encode(), 0)
        self._fd = fd
        return None

    def probe(self) -> str | None:
        """Who holds the lock (None: nobody), without taking it or creating anything."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 512, 0).decode(errors="replace").strip() or "another process"
        finally:
            os.close(fd)
        return None

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()  # before unlocking: a waiter that opened this file sees it gone and opens the new one
        os.close(self._fd)
        self._fd = None


def leftovers_of(target: Path) -> list[Path]:
    """The temporaries writers of ``target`` leave beside it (any writer's: only call while holding its lock)."""
    target = Path(target)
    found = []
    with contextlib.suppress(OSError):
        for entry in target.parent.iterdir():
            m = _LEFTOVER.match(entry.name)
            if m and m["stem"] + m["suffix"] == target.name or m and m["stem"] == target.name and not m["suffix"]:
                found.append(entry)
    return sorted(found)


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        entry.unlink(missing_ok=True)


def _remove_leftovers(target: Path) -> None:
    """Called holding ``target``'s lock: nobody is writing it, so what its writers left is a killed run's."""
    stale = leftovers_of(target)
    for entry in stale:
        _remove(entry)
    if stale:
        warnings.warn(
            DeploytkNotice(
                f"removed {len(stale)} temporar{'y' if len(stale) == 1 else 'ies'} beside {target} left by an interrupted "
                f"write ({_listing(e.name for e in stale)})."
            ),
            stacklevel=3,
        )


def _lock_output(path: Path, option: str, what: str) -> tuple[OutputLock, list[Path]]:
    """Lock ``path`` for writing (making the folders above it, which the release removes again if still empty);
    refuse at once if another process writes it."""
    made = _created_parents(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = OutputLock(path)
    lock.folder_times = None if made else path.parent.stat()  # before the lock file changes them
    try:
        holder = lock.acquire()
    except BaseException:
        _remove_if_empty(made)
        raise
    if holder is not None:
        _remove_if_empty(made)
        raise DeploytkError(
            f"{_named(option, path)} is being written by another deploytk process ({holder}); two writers of one {what} would "
            "lose one's result, so this one was refused before any work and nothing was changed.",
            hint=f"Wait for that run to finish, or choose another {_another(option)}.",
        )
    _remove_leftovers(path)
    return lock, made


@dataclass
class Claim:
    """What every claimed output holds: the lock and the folders the claim made; ``release`` is idempotent, and
    ``with claim_...(...) as out:`` releases on every exit path (a successful ``write()`` releases too)."""

    lock: OutputLock | None = field(default=None, repr=False, compare=False, kw_only=True)
    made: list[Path] = field(default_factory=list, repr=False, compare=False, kw_only=True)

    def release(self, *, keep_folders: bool = False) -> None:
        """Give up the lock; ``keep_folders`` (the output was written) keeps the folders the claim made, else they go
        and the folder the lock file was made in gets its times back: a refused or failed command leaves it as it was."""
        if self.lock is not None:
            self.lock.release()
            times = self.lock.folder_times
            if not keep_folders and times is not None:
                with contextlib.suppress(OSError):
                    os.utime(self.lock.path.parent, ns=(times.st_atime_ns, times.st_mtime_ns))
            self.lock = None
        if not keep_folders:
            _remove_if_empty(self.made)
        self.made = []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@dataclass
class DirectoryOutput(Claim):
    """A claimed output folder: ``write()`` yields a temporary folder to fill; it becomes ``path`` when complete."""

    path: Path
    kind: DirectoryKind
    option: str
    force: bool
    #: files deploytk did not write that stay where they are (an earlier output with ``force``)
    kept: tuple[str, ...] = ()

    @contextlib.contextmanager
    def write(self) -> Iterator[Path]:
        """The temporary folder to fill; it replaces ``path`` when the block ends without an error. Either way the
        claim is released."""
        if self.lock is None:
            raise RuntimeError(f"the claim on {self.path} was released; claim it again to write it")
        claim = _check_directory(self.path, self.kind, self.option, self.force)  # the folder may have changed since
        target = self.path
        tmp = _temp_name(target.parent, f".{target.name}.tmp-")  # named before it exists: cleanup finds it whenever a signal lands
        made = _created_parents(target)
        written = False
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
            written = True
        except BaseException as err:
            if not _not_ours(err, tmp):
                shutil.rmtree(tmp, ignore_errors=True)
            _remove_if_empty(made)
            raise
        finally:
            self.release(keep_folders=written)


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


def claim_directory(path: Path, kind: DirectoryKind, *, option: str = "output", force: bool = False) -> DirectoryOutput:
    """Check that ``path`` may receive a ``kind`` folder (see the module doc) and lock it for this process; raise
    DeploytkError naming the path if not. Use it as ``with claim_directory(...) as out:`` (or ``out.release()``)."""
    path = Path(path)
    _check_directory(path, kind, option, force)
    lock, made = _lock_output(path, option, kind.name)
    try:
        claim = _check_directory(path, kind, option, force)  # again, holding the lock: a writer may just have finished
    except BaseException:
        Claim(lock=lock, made=made).release()
        raise
    claim.lock, claim.made = lock, made
    return claim


def _check_directory(path: Path, kind: DirectoryKind, option: str, force: bool) -> DirectoryOutput:
    path = Path(path)
    _check_path(path, option)
    if not path.exists():
        return DirectoryOutput(path=path, kind=kind, option=option, force=force)
    if not path.is_dir():
        raise DeploytkError(
            f"{_named(option, path)} is a file, not a {kind.name} folder; deploytk never overwrites a file it did not write "
            "(`force=True` does not either).",
            hint=f"Choose another {_another(option)}.",
        )
    present = _files_under(path)
    if not present:
        return DirectoryOutput(path=path, kind=kind, option=option, force=force)
    owned = kind.owned(path)
    if owned is None:
        raise DeploytkError(
            f"{_named(option, path)} is a folder holding files deploytk did not write ({_listing(present)}); it is not a {kind.name}. "
            f"deploytk writes a {kind.name} only into a new or empty folder or over an earlier {kind.name}, and `force=True` "
            "never deletes other files.",
            hint=f"Choose another {_another(option)}.",
        )
    foreign = present - owned
    if foreign and not force:
        raise DeploytkError(
            f"{_named(option, path)} is an earlier {kind.name} but also holds files deploytk did not write ({_listing(foreign)}); "
            "it was left as it is.",
            hint=f"Pass `force=True` to replace the {kind.name}'s own files and keep those where they are, "
            f"or choose another {_another(option)}.",
        )
    if kind.replace_needs_force and not force:
        raise DeploytkError(
            f"{_named(option, path)} already exists (an earlier {kind.name}); it was left as it is.",
            hint=f"Pass `force=True` to replace it (atomically), or choose another {_another(option)}.",
        )
    return DirectoryOutput(path=path, kind=kind, option=option, force=force, kept=tuple(sorted(foreign)))


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
class FileOutput(Claim):
    """A claimed output file: written through a temporary sibling, marked as deploytk's, replaced only when complete."""

    path: Path
    option: str
    #: who wrote it, e.g. "deploytk tune": the mark that lets a rerun replace it
    writer: str

    @contextlib.contextmanager
    def write(self) -> Iterator[Path]:
        """A temporary path with ``path``'s suffix (writers that choose the format by it) to fill; the caller marks it.
        Either way the claim is released when the block ends."""
        if self.lock is None:
            raise RuntimeError(f"the claim on {self.path} was released; claim it again to write it")
        written = False
        try:
            _check_file(self.path, self.writer, self.option)  # the file may have changed since
            with atomic_file(self.path) as tmp:
                yield tmp
            written = True
        finally:
            self.release(keep_folders=written)

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


def claim_file(path: Path, writer: str, *, option: str = "output") -> FileOutput:
    """Check that ``path`` may be written by ``writer`` (see the module doc) and lock it for this process; raise
    DeploytkError naming the path if not. Use it as ``with claim_file(...) as out:`` (or ``out.release()``)."""
    path = Path(path)
    _check_file(path, writer, option)
    lock, made = _lock_output(path, option, "file")
    try:
        claim = _check_file(path, writer, option)
    except BaseException:
        Claim(lock=lock, made=made).release()
        raise
    claim.lock, claim.made = lock, made
    return claim


def _check_file(path: Path, writer: str, option: str) -> FileOutput:
    path = Path(path)
    _check_path(path, option)
    if path.exists():
        if path.is_dir():
            raise DeploytkError(
                f"{_named(option, path)} is a folder; {writer} writes a file here.", hint=f"Give a file name, e.g. {path / 'out'}."
            )
        if not written_by_deploytk(path):
            raise DeploytkError(
                f"{_named(option, path)} exists and was not written by deploytk; it was left as it is (deploytk never overwrites "
                "a file it did not write).",
                hint=f"Choose another {_another(option)}, or move the file away yourself.",
            )
    return FileOutput(path=path, option=option, writer=writer)


def claim_yaml(path: Path, writer: str, *, option: str = "output") -> FileOutput:
    """``claim_file`` for a config: the name must end in .yaml or .yml (how a rerun recognises it, and what loads it)."""
    _check_file(Path(path), writer, option)  # what any output may not be comes first
    if Path(path).suffix.lower() not in (".yaml", ".yml"):
        raise DeploytkError(f"{_named(option, path)}: {writer} writes a YAML config; give a file name ending in .yaml or .yml.")
    return claim_file(path, writer, option=option)


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


# ---- derived files: a cache outside every artifact ------------------------------------------

#: where derived files go (dense baselines): ``$DEPLOYTK_CACHE``, else ``$XDG_CACHE_HOME/deploytk``, else ``~/.cache/deploytk``
CACHE_ENV = "DEPLOYTK_CACHE"


def cache_root() -> Path:
    """The cache folder: never inside an artifact, so a read-only model store profiles and quantizes, and an artifact
    holds only what its command wrote."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "deploytk"


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB chunks (manifests and cache records alike)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cached_file(section: str, name: str, make: Callable[[Path, str], None], what: str) -> Path:
    """``cache_root()/section/name``, made by ``make(temporary path, final name)`` when absent, and verified on every read
    against the sha256 recorded when it was made (``name.json``, which also covers files ``make`` wrote beside it
    under ``name``-prefixed names, such as ONNX external data). A missing, truncated or changed entry is rebuilt, with a
    ``DeploytkNotice`` when one was there. Concurrent callers wait for one another (the entry's lock)."""
    folder = cache_root() / section
    target, record = folder / name, folder / f"{name}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _require_writable(folder, f"the cache folder {folder}")
    except (OSError, DeploytkError) as err:
        reason = err.message if isinstance(err, DeploytkError) else f"{folder}: {err.strerror or err}"
        raise DeploytkError(
            f"{what} is kept in deploytk's cache folder, which cannot be written ({reason}).",
            hint=f"Set {CACHE_ENV} to a writable folder (e.g. export {CACHE_ENV}=/tmp/deploytk-cache).",
        ) from None
    lock = OutputLock(target)
    lock.acquire(wait=True)
    try:
        recorded = _read_record(record)
        if recorded is not None:
            bad = [f for f, sha in recorded.items() if not (folder / f).is_file() or sha256_file(folder / f) != sha]
            if not bad and name in recorded:
                return target
            warnings.warn(
                DeploytkNotice(f"the cached {what} ({folder / (bad or [name])[0]}) did not match its recorded sha256; rebuilt it."),
                stacklevel=3,
            )
        elif target.exists():
            warnings.warn(DeploytkNotice(f"the cached {what} ({target}) had no record of its sha256; rebuilt it."), stacklevel=3)
        record.unlink(missing_ok=True)
        for stale in folder.glob(f"{glob.escape(name)}*"):  # the entry and what was made beside it (not the hidden lock)
            _remove(stale)
        with atomic_file(target) as tmp:
            make(tmp, name)
        files = sorted(p.name for p in folder.glob(f"{glob.escape(name)}*") if p.is_file() and p != record)
        payload = {WRITTEN_BY: "deploytk cache", "what": what, "sha256": {f: sha256_file(folder / f) for f in files}}
        write_atomically(record, json.dumps(payload, indent=2) + "\n")
        return target
    finally:
        lock.release()


def _read_record(path: Path) -> dict[str, str] | None:
    try:
        data = json.loads(path.read_text())
        files = data["sha256"]
        return files if isinstance(files, dict) and all(isinstance(v, str) for v in files.values()) else None
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


# ---- what killed runs left behind -----------------------------------------------------------


def stale_entries(folder: Path, *, remove: bool = False) -> list[dict]:
    """What interrupted deploytk writers left under ``folder`` (``deploytk clean``): each target's temporaries and lock
    file, judged by trying its lock (a live writer holds it: its entries are listed as ``in use`` and never touched).
    ``remove``: delete the stale ones. Returns one record per entry: path, target, kind, bytes, state."""
    folder = Path(folder)
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        raise DeploytkError(f"{folder} {what}; give the folder an output was written into.")
    found: dict[Path, list[tuple[Path, str]]] = {}
    for root, dirs, files in os.walk(folder):
        here = Path(root)
        for name in dirs + files:
            leftover, lock = _LEFTOVER.match(name), _LOCK.match(name)
            if leftover:
                target = here / (leftover["stem"] + leftover["suffix"])
                found.setdefault(target, []).append((here / name, "temporary" if leftover["what"] == "tmp" else "replaced output"))
            elif lock:
                found.setdefault(here / lock["name"], []).append((here / name, "lock file"))
        dirs[:] = [d for d in dirs if not _LEFTOVER.match(d)]  # a temporary's own content is not listed on its own
    records = []
    for target, entries in sorted(found.items()):
        lock = OutputLock(target)
        holder = lock.acquire() if remove else lock.probe()
        try:
            for entry, kind in sorted(entries):
                size = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file()) if entry.is_dir() else entry.stat().st_size
                state = f"in use by {holder}" if holder is not None else "removed" if remove else "stale"
                if remove and holder is None and kind != "lock file":  # the lock file goes with our release
                    _remove(entry)
                records.append({"path": str(entry), "target": str(target), "kind": kind, "bytes": size, "state": state})
        finally:
            lock.release()
    return records
