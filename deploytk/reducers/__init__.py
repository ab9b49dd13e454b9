"""The token-reduction methods, one file each, found here (``merge.method`` names them).

Every module in this package is imported, so a method's ``@register_method`` runs; a new
method is a new file and nothing here changes. ``METHODS`` maps ``merge.method`` to the class.
"""

from __future__ import annotations

import importlib
import pkgutil

from deploytk.errors import DeploytkError
from deploytk.merging.reduction import METHODS, Reduction

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
_listed = dict(sorted(METHODS.items()))  # by name, whatever order the files imported each other in
METHODS.clear()
METHODS.update(_listed)


def get_method(name: str) -> type[Reduction]:
    try:
        return METHODS[name]
    except KeyError:
        raise DeploytkError(
            f"unknown merge method {name!r} (`merge.method`); available: {', '.join(METHODS)}.",
            hint="`deploytk methods` lists them with their options.",
        ) from None


def describe_methods() -> list[dict]:
    """Every method with its options (type, default, description) and ops: `deploytk methods` and the docs table."""
    report = []
    for m in METHODS.values():
        opts = [
            {"name": name, "type": str(f.annotation).replace("typing.", ""), "default": f.default, "description": f.description or ""}
            for name, f in m.Options.model_fields.items()
            if name != "tuned"  # every method's, written by `deploytk tune`: documented once
        ]
        report.append(
            {
                "name": m.name,
                "summary": m.summary,
                "kind": m.kind,
                "learned": m.learned,
                "checkpoint_prefix": m.checkpoint_prefix,
                "learned_when": m.learned_when,
                "uses_r": m.uses_r,
                "schedule": m.schedule_knobs or ("`merge.r`" if m.uses_r else "`keep_rate` at `layers`"),
                "tune_knob": m.tune_knob,
                "ops": list(m.ops),
                "options": opts,
            }
        )
    return report


__all__ = ["METHODS", "get_method", "describe_methods"]
