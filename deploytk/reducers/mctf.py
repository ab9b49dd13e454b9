"""``mctf``: multi-criteria token fusion with one-step-ahead attention (Lee et al., CVPR 2024), inference form.

Unlike ToMe, MCTF fuses *before* the block's attention: it computes the attention map of the
unfused tokens, matches on the block's input tokens with similarity x informativeness x
size (``deploytk.MctfMatch``), fuses by attention- and size-weighted pooling
(``TokenAggregate``), and reuses the map, fused the same way, as the block's attention
("one-step-ahead", approximated as the official code does). Defaults are the official
``run/eval_deit_*_mctf.sh`` settings (blocks 1-11, taus 1/20/40, bidirectional).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, StrictBool, StrictFloat, StrictInt

from deploytk.adapters.attention import attend, attention_probs
from deploytk.errors import DeploytkError
from deploytk.merging.merged_vit import aggregate_size
from deploytk.merging.reduction import MethodOptions, Reduction, check_layers, register_method
from deploytk.merging.schedule import TokenSchedule

Number = StrictFloat | StrictInt


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


def mctf_cap(r: int, tokens: int, protected: int, min_tokens: int) -> int:
    """MCTF's per-layer r: keep >= min_tokens tokens, then ToMe's (tokens - protected) // 2 cap."""
    if tokens - r < min_tokens:
        r = tokens - min_tokens
    return max(0, min(r, (tokens - protected) // 2))


@register_method
class MCTF(Reduction):
    tune_knob = "r"
    name = "mctf"
    kind = "merging"
    summary = "MCTF: multi-criteria (similarity, informativeness, size) bidirectional fusion with one-step-ahead attention"
    Options = MCTFOptions
    ops = ("MctfMatch", "TokenAggregate")
    cap_rule = (
        "a block cannot merge away more than half of its tokens (protected tokens not counted) nor leave fewer than "
        "`merge.options.min_tokens`"
    )

    def __init__(self, family, r_per_layer: list[int], options: MCTFOptions):
        super().__init__(family, r_per_layer, options)
        self.layers = check_layers(options.layers if options.layers is not None else range(1, self.depth), self.depth, "mctf")
        if options.one_step_ahead != "exact" and family.post_norm:
            raise DeploytkError(
                "mctf supports pre-norm blocks only (this model's blocks are post-norm); use one_step_ahead: exact or method tome."
            )
        requested = [r if i in self.layers else 0 for i, r in enumerate(r_per_layer)]
        tokens, effective, t = [], [], self.num_tokens
        for r in requested:
            tokens.append(t)
            e = mctf_cap(r, t, self.protected, options.min_tokens) if r > 0 else 0
            effective.append(e)
            t -= e
        self.schedule = TokenSchedule(requested, effective, tokens, self.protected)

    def block(self, model, i, blk, x, size):
        r = self.schedule.effective_r[i]
        if r == 0:
            return model.standard_block(i, blk, x, size)
        mode = self.options.one_step_ahead
        keep_size = size if model.prop_attn else None
        if mode == "off":  # plain block with an explicit attention map, fusion after the MLP
            h = blk.attn_input(x)
            q, k, v = blk.qkv(h, "qkv")
            probs = attention_probs(blk.scale, q, k, keep_size)
            x = blk.mlp_residual(blk.attn_residual(x, blk.attn_output(attend(probs, v), blk.gate(h))))
            x, size, _, _ = self._fuse(model, x, size, probs, r)
            return x, size
        q, k = blk.qkv(blk.attn_input(x), "qk")
        probs = attention_probs(blk.scale, q, k, keep_size)
        x, size, dest, weight = self._fuse(model, x, size, probs, r)
        h = blk.attn_input(x)
        if mode == "approx":  # one-step-ahead: the fused map stands in for the next attention map
            (v,) = blk.qkv(h, "v")
            out = blk.attn_output(one_step_ahead(probs, v, dest, weight), blk.gate(h))
        else:
            out = model.attention(blk, h, size)[0]
        return blk.mlp_residual(blk.attn_residual(x, out)), size

    def _fuse(self, model, x, size, probs, r: int):
        """Match and fuse: (x, size, dest, the fusion weights)."""
        o = self.options
        n_out = x.shape[1] - r
        received = probs.mean(dim=(1, 2))  # attention each token receives
        taus = (float(o.tau_sim), float(o.tau_info), float(o.tau_size))
        dest = model.match("mctf_match", x, received, size, r, self.protected, *taus, o.bidirection)
        if o.pooling == "attention":
            weight = received[..., None] * size / size.amax(dim=1, keepdim=True)
        elif o.pooling == "size":
            weight = size
        else:
            weight = torch.ones_like(size)
        return torch.ops.deploytk.token_aggregate(x, weight, dest, n_out, True), aggregate_size(size, dest, n_out), dest, weight


def one_step_ahead(probs, v, dest, weight):
    """MCTF's approximate next attention applied to v: [B, H, T, D] values of the fused tokens.

    The official approximation fuses the unfused map ``probs`` [B, H, N, N]: its key columns
    summed per output slot (A^T), its query rows averaged with the fusion weights (W), then
    (W P A^T) v. The same product is computed as W (P (A^T v)): A^T v gives every token its
    slot's value (a gather), P (A^T v) is a plain attention product at N tokens, and W is one
    TokenAggregate of it. Exact in real arithmetic; in floats it differs by rounding (1e-6 of the
    logits), and it needs H*N*D + T*N*C multiply-adds where the map's fusion took T*N*H*(N + T):
    for DeiT-S at N=197 a third.
    """
    b, heads, t, d = v.shape
    n = dest.shape[1]
    rows = v.transpose(1, 2).reshape(b * t, heads * d)  # [B*T, C]
    offsets = torch.arange(b, device=dest.device)[:, None] * t
    v_tokens = rows.index_select(0, (dest + offsets).reshape(-1)).reshape(b, n, heads, d).transpose(1, 2)  # [B, H, N, D]
    y = attend(probs, v_tokens).transpose(1, 2).reshape(b, n, heads * d)
    fused = torch.ops.deploytk.token_aggregate(y, weight, dest, t, True)  # [B, T, C]
    return fused.reshape(b, t, heads, d).transpose(1, 2)
