"""One exception type for every user-facing failure.

The CLI turns a DeploytkError into a one-paragraph message and a non-zero exit, with no
traceback; anything else is a bug and keeps its traceback.

Messages name a library function's parameters, never a CLI flag: a Python caller passed keywords, not flags. A
parameter is its keyword and value in single backticks, `num_images=0` (what ``param("num_images", 0)`` returns), or
`data=` with nothing after the "=" where no value is meant; the value is written as the message wants it shown (``!r``
for a name the user typed, a path as it is, True for a switch). Config keys keep their own form, `merge.r` or
`export.output: kind`: no "=" directly after a backticked name. When the CLI prints an error it rewrites each marked
parameter of the running command into that command's flag (the option declared for the parameter, value kept; True
gives the switch itself, False its off switch where it has one); a parameter the command does not have stays as
written. ``PARAMETER`` is the pattern both sides use.
"""

import re
from pathlib import Path

#: a marked parameter: `keyword=value` (value may be empty); lowercase keywords only, not inside ``double backticks``
PARAMETER = re.compile(r"(?<!`)`([a-z_][a-z0-9_]*)=([^`]*)`(?!`)")


def param(name: str, value: object = "") -> str:
    """A parameter named in a message, marked as ``PARAMETER`` finds it: ``param("num_images", 0)`` is `num_images=0`."""
    return f"`{name}={value}`"


class DeploytkError(Exception):
    """A problem the user can fix: names the bad field/value and what is allowed.

    Catch this one type around any deploytk call; ``str(err)`` is the message and its hint, the one paragraph the CLI
    prints. Its fields, for code that reacts to the error rather than showing it:

    Attributes:
        message: what is wrong, without the hint.
        hint: what to do about it, or None.
        parameter: the keyword the error is about (``num_images``), or None where it is about no one parameter (a
            file, a config key); where not given, the first parameter the message marks (`num_images=0`).
        value: the value given for ``parameter`` (as the caller passed it where given, else as the message shows it),
            or None.
    """

    def __init__(self, message: str, *, hint: str | None = None, parameter: str | None = None, value: object = None):
        self.message = message
        self.hint = hint
        marked = PARAMETER.search(message)
        if parameter is None and marked is not None:
            parameter, value = marked.group(1), (marked.group(2) or None) if value is None else value
        self.parameter = parameter
        self.value = value
        super().__init__(message if hint is None else f"{message} {hint}")


class DeploytkNotice(UserWarning):
    """Something the user should know that did not stop the work (a killed run's temporaries removed, a corrupt cache
    entry rebuilt): a warning to a Python caller, a ``note:`` line on stderr from the CLI."""


class ExportNotice(DeploytkNotice):
    """What an export says about the artifact it wrote (its ``notes``): a schedule capped to what the model can take, a
    reference that cannot be rebuilt in another process. ``deploytk.export`` warns each; the CLI prints them with the export."""


class NotRebuildableWarning(ExportNotice):
    """The exported model object cannot be rebuilt in another process (``Artifact.rebuild_problem`` says why): its PyTorch
    reference exists only in the process that exported it, so only that process can validate, inspect or evaluate the
    artifact against it."""


def file_problem(path: Path, expected: str = "a file") -> str | None:
    """Why ``path`` cannot be read as ``expected`` ("does not exist", "is a directory, not a file", ...), or None: a
    folder given where a file belongs is not reported as missing."""
    path = Path(path)
    if path.is_file():
        return None
    if path.is_dir():
        return f"is a directory, not {expected}"
    return "is not a regular file" if path.exists() else "does not exist"
