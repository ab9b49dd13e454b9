"""The one registry of token-reduction methods: config name -> how to build the reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from deploytk.errors import DeploytkError
from deploytk.merging.patch import MergedViT, build_schedule


@dataclass(frozen=True)
class Method:
    name: str
    summary: str
    build: Callable[[nn.Module, object, bool], MergedViT]  # (timm vit, r spec, prop_attn)


def _build_tome(vit: nn.Module, r_spec, prop_attn: bool) -> MergedViT:
    return MergedViT(vit, build_schedule(vit, r_spec), prop_attn=prop_attn)


METHODS: dict[str, Method] = {
    "tome": Method("tome", "ToMe bipartite soft matching on attention keys, size-weighted merge", _build_tome),
}


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise DeploytkError(
            f"unknown merge method {name!r} (`merge.method`); available: {', '.join(sorted(METHODS))}."
        ) from None
