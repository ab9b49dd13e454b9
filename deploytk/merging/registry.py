"""The one registry of token-reduction methods: config name -> options and reference builder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError
from torch import nn

from deploytk.errors import DeploytkError
from deploytk.merging.options import ATMOptions, KeepRateOptions, MCTFOptions, MethodOptions, ToMeOptions
from deploytk.merging.patch import MergedViT, build_schedule


@dataclass(frozen=True)
class Method:
    name: str
    summary: str
    options: type[MethodOptions]
    #: (timm vit, r spec, prop_attn, validated options) -> reference model
    build: Callable[[nn.Module, object, bool, MethodOptions], MergedViT]
    uses_r: bool = True  # keep-rate methods do not read merge.r
    ops: tuple[str, ...] = ()

    def parse_options(self, options: dict, source: str = "merge.options") -> MethodOptions:
        try:
            return self.options.model_validate(options or {})
        except ValidationError as err:
            problems = []
            for e in err.errors():
                field = ".".join(str(p) for p in e["loc"])
                if e["type"] == "extra_forbidden":
                    problems.append(
                        f"unknown option `{source}.{field}` for method {self.name} (allowed: {', '.join(self.options.model_fields) or 'none'})"
                    )
                else:
                    problems.append(f"`{source}.{field}` = {e.get('input')!r}: {e['msg']}")
            raise DeploytkError("; ".join(dict.fromkeys(problems)) + ".", hint="`deploytk methods` lists every method's options.") from None


def _tome(vit, r_spec, prop_attn, opts):
    return MergedViT(vit, build_schedule(vit, r_spec), prop_attn=prop_attn)


def _mctf(vit, r_spec, prop_attn, opts):
    from deploytk.merging.methods import MCTFViT

    return MCTFViT(vit, build_schedule(vit, r_spec), prop_attn, opts)


def _atm(vit, r_spec, prop_attn, opts):
    from deploytk.merging.methods import ATMViT

    return ATMViT(vit, build_schedule(vit, r_spec), prop_attn, opts)


def _select(mode):
    def build(vit, r_spec, prop_attn, opts):
        from deploytk.merging.methods import SelectViT

        return SelectViT(vit, mode, prop_attn, opts)

    return build


METHODS: dict[str, Method] = {
    m.name: m
    for m in [
        Method(
            "tome",
            "ToMe: bipartite soft matching on attention keys, size-weighted merge after attention",
            ToMeOptions,
            _tome,
            ops=("ToMeMatch", "TokenAggregate"),
        ),
        Method(
            "mctf",
            "MCTF: multi-criteria (similarity, informativeness, size) bidirectional fusion with one-step-ahead attention",
            MCTFOptions,
            _mctf,
            ops=("MctfMatch", "TokenAggregate"),
        ),
        Method(
            "atm",
            "ATM: layer-wise similarity thresholds and size-distinctive matching; r calibrated with `deploytk calibrate`",
            ATMOptions,
            _atm,
            ops=("ToMeMatch", "SizeSplitMatch", "TokenAggregate"),
        ),
        Method(
            "topk",
            "Top-K: keep the tokens the class token attends to most, drop the rest",
            KeepRateOptions,
            _select("topk"),
            uses_r=False,
            ops=("TopKSelect", "TokenAggregate"),
        ),
        Method(
            "evit",
            "EViT: keep the top tokens by class attention, fuse the rest into one token",
            KeepRateOptions,
            _select("evit"),
            uses_r=False,
            ops=("TopKSelect", "TokenAggregate"),
        ),
        Method(
            "crucial",
            "Crucial-token merge: each non-crucial token joins its most similar crucial (top class-attention) token",
            KeepRateOptions,
            _select("crucial"),
            uses_r=False,
            ops=("CrucialMatch", "TokenAggregate"),
        ),
    ]
}


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise DeploytkError(
            f"unknown merge method {name!r} (`merge.method`); available: {', '.join(METHODS)}.",
            hint="`deploytk methods` lists them with their options.",
        ) from None
