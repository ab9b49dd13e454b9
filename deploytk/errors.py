"""One exception type for every user-facing failure.

The CLI turns a DeploytkError into a one-paragraph message and a non-zero exit, with no
traceback; anything else is a bug and keeps its traceback.
"""

from pathlib import Path


class DeploytkError(Exception):
    """A problem the user can fix: names the bad field/value and what is allowed."""

    def __init__(self, message: str, *, hint: str | None = None):
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message} {hint}")


class DeploytkNotice(UserWarning):
    """Something the user should know that did not stop the work (a killed run's temporaries removed, a corrupt cache
    entry rebuilt): a warning to a Python caller, a ``note:`` line on stderr from the CLI."""


def file_problem(path: Path, expected: str = "a file") -> str | None:
    """Why ``path`` cannot be read as ``expected`` ("does not exist", "is a directory, not a file", ...), or None: a
    folder given where a file belongs is not reported as missing."""
    path = Path(path)
    if path.is_file():
        return None
    if path.is_dir():
        return f"is a directory, not {expected}"
    return "is not a regular file" if path.exists() else "does not exist"
