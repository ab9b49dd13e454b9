"""Per-method options (``merge.options`` in the config), validated strictly.

Defaults are each method's published evaluation settings where one exists (MCTF: the
official ``run/eval_deit_*_mctf.sh``; EViT: keep rate 0.7 at blocks 3, 6, 9).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

Number = StrictFloat | StrictInt


class MethodOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ToMeOptions(MethodOptions):
    """ToMe has no options beyond merge.r / merge.prop_attn."""


class MCTFOptions(MethodOptions):
    layers: list[StrictInt] | None = Field(None, description="blocks that merge (0-based); default: all but the first (official)")
    tau_sim: Number = Field(1.0, ge=0, description="temperature of the similarity criterion (0 = off)")
    tau_info: Number = Field(20.0, ge=0, description="temperature of the informativeness criterion (0 = off)")
    tau_size: Number = Field(40.0, ge=0, description="temperature of the size criterion (0 = off)")
    bidirection: StrictBool = Field(True, description="bidirectional bipartite matching (r//2 A->B, rest B->A)")
    pooling: Literal["attention", "size", "mean"] = Field(
        "attention", description="fusion weights: attention x size (official), size, or plain mean"
    )
    one_step_ahead: Literal["approx", "exact", "off"] = Field(
        "approx",
        description="approx: reuse the fused attention map (official); exact: recompute attention after fusion; off: fuse after the MLP",
    )
    min_tokens: StrictInt = Field(10, ge=1, description="never reduce below this many tokens")


class ATMOptions(MethodOptions):
    alpha: Number = Field(0.9, ge=-1, le=1, description="initial similarity threshold (layer 1)")
    beta: Number = Field(0.04, ge=0, description="threshold decay rate: theta_l = max(alpha - (exp(beta*(l-1)) - 1), theta_min)")
    theta_min: Number = Field(0.4, ge=-1, le=1, description="threshold floor")
    split_layer: StrictInt | None = Field(None, ge=0, description="first block with size-distinctive matching; default: depth - depth // 4")
    cls_only_last: StrictBool = Field(True, description="keep only the class token in the last block (token-pooled models)")
    calibration: dict[str, Any] | None = Field(None, description="written by `deploytk calibrate`: how merge.r was derived")


class KeepRateOptions(MethodOptions):
    layers: list[StrictInt] = Field([3, 6, 9], description="blocks that reduce (0-based)")
    keep_rate: Number = Field(0.7, gt=0, le=1, description="fraction of non-protected tokens kept at each of those blocks, in (0, 1]")
