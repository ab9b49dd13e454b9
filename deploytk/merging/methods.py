"""The reference models of the methods beyond ToMe, on the same block structure as ToMe's.

Each is a ``MergedViT`` subclass: it fixes its per-layer token counts at construction (the
static schedule the export is built for) and implements the layer's reduction with the
deploytk ops (a matching op -> ``dest``, then ``token_aggregate``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from deploytk.errors import DeploytkError
from deploytk.merging import atm
from deploytk.merging.mctf import mctf_cap
from deploytk.merging.options import ATMOptions, KeepRateOptions, MCTFOptions
from deploytk.merging.patch import MergedViT, aggregate_size, attend, attention_output, attention_probs
from deploytk.merging.pruning import keep_count
from deploytk.merging.schedule import TokenSchedule

_ops = torch.ops.deploytk


def _check_layers(layers, depth: int, method: str) -> list[int]:
    bad = [i for i in layers if not 0 <= i < depth]
    if bad:
        raise DeploytkError(
            f"`merge.options.layers` = {layers}: {method} block indices must be in [0, {depth - 1}] for this {depth}-block model."
        )
    return sorted(set(layers))


class MCTFViT(MergedViT):
    """MCTF: fuse before the block's attention using the attention map of the unmerged tokens."""

    def __init__(self, vit: nn.Module, r_per_layer: list[int], prop_attn: bool, options: MCTFOptions):
        self.options = options
        depth = len(vit.blocks)
        layers = _check_layers(options.layers if options.layers is not None else range(1, depth), depth, "mctf")
        self.layers = layers
        super().__init__(vit, [r if i in layers else 0 for i, r in enumerate(r_per_layer)], prop_attn)
        if options.one_step_ahead != "exact" and any(type(b).__name__ == "ResPostBlock" for b in vit.blocks):
            raise DeploytkError(
                "mctf supports pre-norm blocks only (this model uses ResPostBlock); use one_step_ahead: exact or method tome."
            )

    def _plan(self, requested: list[int], num_tokens: int) -> TokenSchedule:
        tokens, effective, t = [], [], num_tokens
        for r in requested:
            tokens.append(t)
            e = mctf_cap(r, t, self.protected, self.options.min_tokens) if r > 0 else 0
            effective.append(e)
            t -= e
        return TokenSchedule(list(requested), effective, tokens, self.protected)

    def expected_custom_ops(self) -> dict[str, int]:
        merging = sum(1 for r in self.schedule.effective_r if r > 0)
        plain = len(self.vit.blocks) - merging
        exact = self.options.one_step_ahead == "exact"
        per_merge = 2 + (2 if self.options.one_step_ahead == "approx" else 0)  # x, size (+ attention cols, rows)
        return {
            "MctfMatch": merging,
            "TokenAggregate": per_merge * merging,
            "ProportionalAttention": (plain + (merging if exact else 0)) if self.prop_attn else 0,
        }

    def _block(self, i, blk, x, size):
        r = self.schedule.effective_r[i]
        if r == 0:
            return super()._block(i, blk, x, size)
        attn, mode = blk.attn, self.options.one_step_ahead
        if mode == "off":  # plain block with an explicit attention map, fusion after the MLP
            h = blk.norm1(x)
            q, k, v = _split_qkv(attn, h, "qkv")
            probs = attention_probs(attn, q, k, size if self.prop_attn else None)
            x = x + blk.drop_path1(blk.ls1(attention_output(attn, attend(probs, v), _gate(attn, h))))
            x = x + blk.drop_path2(blk.ls2(blk.mlp(blk.norm2(x))))
            x, size, _ = self._fuse(x, size, probs, r, attn_next=False)
            return x, size
        q, k = _split_qkv(attn, blk.norm1(x), "qk")
        probs = attention_probs(attn, q, k, size if self.prop_attn else None)
        x, size, probs_next = self._fuse(x, size, probs, r, attn_next=mode == "approx")
        h = blk.norm1(x)
        if mode == "approx":  # one-step-ahead: the fused map stands in for the next attention map
            (v,) = _split_qkv(attn, h, "v")
            out = attention_output(attn, attend(probs_next, v), _gate(attn, h))
        else:
            out = self._attention(attn, h, size)[0]
        x = x + blk.drop_path1(blk.ls1(out))
        return x + blk.drop_path2(blk.ls2(blk.mlp(blk.norm2(x)))), size

    def _fuse(self, x, size, probs, r: int, attn_next: bool):
        o = self.options
        n_out = x.shape[1] - r
        received = probs.mean(dim=(1, 2))  # attention each token receives
        dest = self._match(
            "mctf_match", x, received, size, r, self.protected, float(o.tau_sim), float(o.tau_info), float(o.tau_size), o.bidirection
        )
        if o.pooling == "attention":
            weight = received[..., None] * size / size.amax(dim=1, keepdim=True)
        elif o.pooling == "size":
            weight = size
        else:
            weight = torch.ones_like(size)
        x_new = _ops.token_aggregate(x, weight, dest, n_out, True)
        size_new = aggregate_size(size, dest, n_out)
        probs_next = None
        if attn_next:
            b, h, n, _ = probs.shape
            cols = probs.permute(0, 3, 1, 2).reshape(b, n, h * n)  # key axis first: sum the fused keys
            cols = _ops.token_aggregate(cols, torch.ones_like(size), dest, n_out, False)
            rows = cols.reshape(b, n_out, h, n).permute(0, 3, 2, 1).reshape(b, n, h * n_out)  # query axis first
            rows = _ops.token_aggregate(rows, weight, dest, n_out, True)  # weighted mean of the fused queries
            probs_next = rows.reshape(b, n_out, h, n_out).permute(0, 2, 1, 3)
        return x_new, size_new, probs_next


def _gate(attn, h):
    return attn.gate(h).sigmoid() if getattr(attn, "gate", None) is not None else None


def _split_qkv(attn, h, which: str):
    """Only the projections needed (q,k before fusion; v after), as MCTF computes them."""
    c = attn.attn_dim
    w, bias = attn.qkv.weight, attn.qkv.bias
    parts = {"q": slice(0, c), "k": slice(c, 2 * c), "v": slice(2 * c, 3 * c)}
    lo = parts[which[0]].start
    hi = parts[which[-1]].stop
    out = F.linear(h, w[lo:hi], bias[lo:hi] if bias is not None else None)
    b, n, _ = h.shape
    heads = out.reshape(b, n, len(which), attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    res = []
    for name, t in zip(which, heads):
        res.append(attn.q_norm(t) if name == "q" else attn.k_norm(t) if name == "k" else t)
    return res


class ATMViT(MergedViT):
    """ATM with a static (calibrated) schedule: ToMe layers, then size-distinctive layers, CLS-only last."""

    def __init__(self, vit: nn.Module, r_per_layer: list[int], prop_attn: bool, options: ATMOptions):
        self.options = options
        depth = len(vit.blocks)
        self.split_layer = options.split_layer if options.split_layer is not None else depth - depth // 4
        if self.split_layer > depth:
            raise DeploytkError(f"`merge.options.split_layer` = {self.split_layer} is past the last block ({depth - 1}).")
        self.cls_only = options.cls_only_last and vit.global_pool == "token" and getattr(vit, "dist_token", None) is None
        if options.cls_only_last and not self.cls_only and vit.global_pool != "token":
            raise DeploytkError(
                f"`merge.options.cls_only_last` needs a class-token-pooled model; {vit.default_cfg.get('architecture', 'this model')} pools with {vit.global_pool!r}. Set cls_only_last: false."
            )
        self.dynamic_r: list[int] | None = None  # set during calibration
        self.thresholds = atm.thresholds(depth, float(options.alpha), float(options.beta), float(options.theta_min))
        super().__init__(vit, r_per_layer, prop_attn)

    def _plan(self, requested, num_tokens):
        sched = super()._plan(requested, num_tokens)
        if not self.cls_only:
            return sched
        eff = sched.effective_r[:-1] + [sched.tokens[-1] - 1]
        return TokenSchedule(sched.requested_r[:-1] + [eff[-1]], eff, sched.tokens, sched.protected)

    def expected_custom_ops(self) -> dict[str, int]:
        eff = self.schedule.effective_r
        last = len(eff) - 1 if self.cls_only else len(eff)
        tome = sum(1 for i in range(min(self.split_layer, last)) if eff[i] > 0)
        split = sum(1 for i in range(self.split_layer, last) if eff[i] > 0)
        return {
            "ToMeMatch": tome,
            "SizeSplitMatch": split,
            "TokenAggregate": 2 * (tome + split),
            "ProportionalAttention": len(eff) if self.prop_attn else 0,
        }

    def _reduce(self, i, x, size, metric, cls_attn):
        if self.cls_only and i == len(self.vit.blocks) - 1:
            if self.dynamic_r is not None:
                self.dynamic_r.append(0)  # not a merge: the schedule handles the CLS-only block itself
            return x[:, :1], size[:, :1]  # only the class token feeds the head
        size_split = i >= self.split_layer
        if self.dynamic_r is not None:  # calibration: ATM's batch-adaptive r
            above = atm.count_above(metric, size, self.protected, self.thresholds[i], size_split)
            r = min(int(above.float().mean().floor()), (x.shape[1] - self.protected) // 2)
            self.dynamic_r.append(r)
        else:
            r = self.schedule.effective_r[i]
        if r <= 0:
            return x, size
        if not size_split:
            return self._tome_merge(x, size, metric, r)
        n_out = x.shape[1] - r
        dest = self._match("size_split_match", metric, size, r, self.protected)
        return _ops.token_aggregate(x, size, dest, n_out, True), aggregate_size(size, dest, n_out)

    @torch.no_grad()
    def calibration_pass(self, images: torch.Tensor) -> list[int]:
        """Run ATM dynamically on one batch; return the r it chose per layer."""
        self.dynamic_r = []
        try:
            self(images)
            return self.dynamic_r
        finally:
            self.dynamic_r = None


class SelectViT(MergedViT):
    """Top-K pruning, EViT fusion or crucial-token merging by CLS attention at chosen blocks."""

    def __init__(self, vit: nn.Module, mode: str, prop_attn: bool, options: KeepRateOptions):
        self.mode, self.options = mode, options
        if getattr(vit, "cls_token", None) is None:
            raise DeploytkError(f"method {mode} ranks tokens by the class token's attention, but this model has no class token.")
        depth = len(vit.blocks)
        self.layers = _check_layers(options.layers, depth, mode)
        super().__init__(vit, [0] * depth, prop_attn)

    def _plan(self, requested, num_tokens):
        tokens, removed, t = [], [], num_tokens
        self.keep = []
        for i in range(len(requested)):
            tokens.append(t)
            keep = keep_count(t, self.protected, float(self.options.keep_rate))
            active = i in self.layers and 1 <= keep < t - self.protected - (1 if self.mode == "evit" else 0)
            self.keep.append(keep if active else None)
            out = t if not active else self.protected + keep + (1 if self.mode == "evit" else 0)
            removed.append(t - out)
            t = out
        return TokenSchedule(removed, removed, tokens, self.protected)

    def expected_custom_ops(self) -> dict[str, int]:
        active = sum(1 for k in self.keep if k is not None)
        return {
            "CrucialMatch" if self.mode == "crucial" else "TopKSelect": active,
            "TokenAggregate": 2 * active,
            "ProportionalAttention": len(self.vit.blocks) if self.prop_attn else 0,
        }

    def _wants_cls_attention(self, i):
        return self.keep[i] is not None

    def _reduce(self, i, x, size, metric, cls_attn):
        keep = self.keep[i]
        if keep is None:
            return x, size
        p = self.protected
        ones = torch.ones_like(size)
        if self.mode == "crucial":
            dest = self._match("crucial_match", metric, cls_attn, keep, p)
            n_out = p + keep
            return _ops.token_aggregate(x, cls_attn[..., None], dest, n_out, True), aggregate_size(size, dest, n_out)
        dest = self._match("topk_select", cls_attn, keep, p)
        if self.mode == "evit":  # the rest fused into one last token: sum of a_i x_i (EViT)
            n_out = p + keep + 1
            weight = torch.where((dest == p + keep)[..., None], cls_attn[..., None], ones)
            return _ops.token_aggregate(x, weight, dest, n_out, False), aggregate_size(size, dest, n_out)
        n_out = p + keep
        return _ops.token_aggregate(x, ones, dest, n_out, False), aggregate_size(size, dest, n_out)


__all__ = ["MCTFViT", "ATMViT", "SelectViT"]
