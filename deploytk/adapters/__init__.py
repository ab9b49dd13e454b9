"""The model families, one adapter file each (``timm_vit.py``, ...), found here.

Every module in this package is imported, so each family's ``@register_family`` runs; a new
family is a new file and nothing here changes. ``adapt(model)`` finds a model's adapter.
"""

from __future__ import annotations

import importlib
import pkgutil

from deploytk.adapters.base import FAMILIES, BlockParts, ModelFamily, adapt, family_named, pool_tokens, register_family

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")


def describe_families() -> list[dict]:
    """Every family: how a config names its models, the classes it runs, whether the learned reducers apply."""
    return [
        {
            "name": f.name,
            "summary": f.summary,
            "model": f.model_syntax or (f"{f.prefix}<folder|Hub id>" if f.prefix else "timm name or hf-hub:timm/..."),
            "classes": list(getattr(f, "classes", ())) or ["VisionTransformer"],
            "learned_reducers": f.takes_learned_reducers,
        }
        for f in FAMILIES.values()
    ]


__all__ = ["describe_families", "FAMILIES", "BlockParts", "ModelFamily", "adapt", "family_named", "pool_tokens", "register_family"]
