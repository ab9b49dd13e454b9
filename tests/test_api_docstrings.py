"""Every parameter of the public API is documented (issue 55, item 4): the docstring's Google-style ``Args:`` section
names exactly the signature's parameters (``*args`` / ``**kwargs`` written as ``*name`` / ``**name``), so the generated
API reference lists each one and none that is gone."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import pytest

import deploytk.api
import deploytk.api.functions
from deploytk.api.artifact import Artifact, Runner

#: an entry of an Args section: ``name: text`` or ``name (type): text``, at the section's first indentation
ENTRY = re.compile(r"(\*{0,2}[A-Za-z_][A-Za-z0-9_]*)\s*(\([^)]*\))?:(\s|$)")


def documented(doc: str | None) -> set[str]:
    """The names the ``Args:`` section of ``doc`` documents (none where it has no such section); continuation lines,
    indented deeper than the entries, are skipped."""
    names: set[str] = set()
    lines = (doc or "").splitlines()
    for i, line in enumerate(lines):
        if line.strip() != "Args:":
            continue
        outer = len(line) - len(line.lstrip())
        entries = None
        for body in lines[i + 1 :]:
            if not body.strip():
                continue
            indent = len(body) - len(body.lstrip())
            if indent <= outer:
                break
            entries = indent if entries is None else entries
            if indent == entries:
                match = ENTRY.match(body.strip())
                assert match, f"not an Args entry (`name: what it takes`): {body.strip()!r}"
                names.add(match[1])
    return names


def parameters(fn: Callable[..., Any], *, method: bool = False) -> set[str]:
    """The signature's parameter names, ``*name`` / ``**name`` for the variadic ones, without ``self`` for a method."""
    params = list(inspect.signature(fn).parameters.values())
    if method:
        params = params[1:]
    prefix = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return {prefix.get(p.kind, "") + p.name for p in params}


def api_functions() -> list[Callable[..., Any]]:
    """What ``deploytk.api`` exports that is a function defined in deploytk.api.functions."""
    found = []
    for name in deploytk.api.__all__:
        obj = getattr(deploytk.api, name)
        if inspect.isfunction(obj) and obj.__module__ == deploytk.api.functions.__name__:
            found.append(obj)
    return found


def class_methods() -> list[tuple[type, str]]:
    """Each public method of Artifact and Runner that takes parameters besides ``self``."""
    return [
        (cls, name)
        for cls in (Artifact, Runner)
        for name, fn in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_") and parameters(fn, method=True)
    ]


def test_the_parser_reads_an_args_section():
    doc = """Summary.

    Args:
        model: what to export.
        r: tokens merged per block, on
            two lines.
        *args: more.
        **options (Any): method options.

    ```python
    x: 1
    ```
    """
    assert documented(inspect.cleandoc(doc)) == {"model", "r", "*args", "**options"}
    assert documented("No section here.") == set()


def test_every_api_function_is_collected():
    names = {fn.__name__ for fn in api_functions()}
    assert {"export", "load", "patch", "inspect", "tune", "calibrate", "visualize", "evaluate", "configs", "clean", "selftest"} <= names


@pytest.mark.parametrize("fn", api_functions(), ids=lambda fn: fn.__name__)
def test_api_function_args_name_every_parameter(fn):
    doc, signature = documented(inspect.getdoc(fn)), parameters(fn)
    assert doc == signature, (
        f"deploytk.{fn.__name__}: undocumented {sorted(signature - doc)}, documented but not in the signature {sorted(doc - signature)}"
    )


@pytest.mark.parametrize(("cls", "name"), class_methods(), ids=lambda v: v.__name__ if isinstance(v, type) else v)
def test_artifact_and_runner_methods_args_name_every_parameter(cls, name):
    fn = getattr(cls, name)
    doc, signature = documented(inspect.getdoc(fn)), parameters(fn, method=True)
    assert doc == signature, (
        f"{cls.__name__}.{name}: undocumented {sorted(signature - doc)}, documented but not in the signature {sorted(doc - signature)}"
    )
