"""Old keyword spellings that still work for one release (``deploytk.vocabulary.RENAMED``): a call with one gets the
new name's behaviour and one ``DeploytkNotice`` that says the new name."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from deploytk.errors import DeploytkError, DeploytkNotice
from deploytk.vocabulary import RENAMED, RENAMED_VALUES

F = TypeVar("F", bound=Callable[..., Any])


def old_names(command: str) -> Callable[[F], F]:
    """Let ``command``'s API function take the old keywords of ``RENAMED[command]`` (and the old values of
    ``RENAMED_VALUES``) as their new ones."""
    renamed = RENAMED.get(command, {})
    values = {new: mapping for (cmd, new), mapping in RENAMED_VALUES.items() if cmd == command}

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            for old, new in renamed.items():
                if old not in kwargs:
                    continue
                if new in kwargs:
                    raise DeploytkError(f"`{old}=` and `{new}=` are the same keyword (`{old}=` is its old name); pass `{new}=` only.")
                warnings.warn(DeploytkNotice(f"`{old}=` is now `{new}=` (the old name goes in the next release)."), stacklevel=2)
                kwargs[new] = kwargs.pop(old)
            for name, mapping in values.items():
                if isinstance(kwargs.get(name), str) and kwargs[name] in mapping:
                    old_value = kwargs[name]
                    kwargs[name] = mapping[old_value]
                    warnings.warn(
                        DeploytkNotice(f"`{name}={old_value}` is now `{name}={kwargs[name]}` (the old value goes in the next release)."),
                        stacklevel=2,
                    )
            return fn(*args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap
