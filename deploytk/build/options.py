"""`deploytk build` options, validated before anything is built (TensorRT builds take minutes)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from deploytk.errors import DeploytkError, param

Impl = Literal["plugin", "native"]


class BuildOptions(BaseModel):
    """What a build varies; recorded verbatim in the engine manifest.

    ``batch`` is the optimization profile (min, opt, max) of the dynamic batch dimension.
    ``merge_impl``: ``plugin`` runs the matching ops (ToMeMatch, MctfMatch, ...) and
    TokenAggregate as deploytk's AOT plugins; ``native`` lets TensorRT inline their
    standard-op function bodies. ``attention_impl``:
    ``plugin`` = deploytk's ProportionalAttention kernel; ``native`` = TensorRT's fused
    attention (the ONNX ``Attention`` op with log(size) as additive mask). ``baseline``: also
    build the unmerged model with the same options, the reference of `profile` on the trt backend.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch: tuple[int, int, int] = (1, 8, 64)
    merge_impl: Impl = "plugin"
    attention_impl: Impl = "plugin"
    opt_level: int = 3
    timing_cache: str | None = None
    baseline: bool = True

    @field_validator("batch")
    @classmethod
    def _ordered(cls, v):
        if not (1 <= v[0] <= v[1] <= v[2]):
            raise ValueError("min,opt,max must satisfy 1 <= min <= opt <= max")
        return v

    @field_validator("opt_level")
    @classmethod
    def _level(cls, v):
        if not 0 <= v <= 5:
            raise ValueError("must be 0..5 (TensorRT's builder_optimization_level)")
        return v


def parse_batch(spec: str) -> tuple[int, int, int]:
    """'1,8,64' -> (1, 8, 64); a single value 'N' means a fixed batch (N, N, N)."""
    try:
        values = [int(v) for v in spec.split(",")]
    except ValueError:
        raise DeploytkError(f"`batch_sizes={spec!r}` is not a list of integers; use min,opt,max such as 1,8,64 (or one value).") from None
    if len(values) == 1:
        values *= 3
    if len(values) != 3:
        raise DeploytkError(f"`batch_sizes={spec!r}` has {len(values)} values; use min,opt,max such as 1,8,64 (or one value).")
    return tuple(values)


def build_options(batch: str = "1,8,64", **kwargs) -> BuildOptions:
    """BuildOptions from the values as text (``batch`` as '1,8,64'), with pydantic's complaint turned into one deploytk error."""
    try:
        return BuildOptions(batch=parse_batch(batch), **kwargs)
    except ValidationError as err:
        first = err.errors()[0]
        field, value = ".".join(str(p) for p in first["loc"]), first.get("input")
        field = "batch_sizes" if field == "batch" else field  # the profile's keyword (deploytk.vocabulary)
        shown = ",".join(map(str, value)) if isinstance(value, list | tuple) else repr(value) if isinstance(value, str) else value
        raise DeploytkError(f"{param(field, shown)}: {first['msg'].removeprefix('Value error, ')}.") from None
