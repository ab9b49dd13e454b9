"""``MergedViT``: a Vision Transformer run with a token-reduction method at a static schedule.

The wrapper re-uses the model's own modules (so its state_dict and weights are the model's)
and re-implements only the forward pass, through the model's family adapter
(``deploytk.adapters``): the family embeds the image into tokens, each block is run by the
method (``Reduction.block``; by default attention, the method's ``reduce``, MLP) on the
block's parts, per-token sizes are carried to proportional attention and a size-weighted
average pool, and the family's head ends it. With the base ``Reduction`` (no reduction) it
computes exactly what the model computes. This is the PyTorch reference: the ground truth
every backend is held to.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import deploytk.ops  # noqa: F401  (registers torch.ops.deploytk.*)
from deploytk.adapters import BlockParts, ModelFamily, adapt
from deploytk.adapters.attention import attend, attention_probs
from deploytk.errors import DeploytkError
from deploytk.merging.outputs import DENSE_KINDS, OutputSpec, PatchSources
from deploytk.merging.reduction import MethodOptions, Reduction
from deploytk.merging.schedule import TokenSchedule, parse_r
from deploytk.ops import OPS


def aggregate_size(size: torch.Tensor, dest: torch.Tensor, tokens_out: int) -> torch.Tensor:
    """Sizes of the output tokens: the sum of the sizes merged into each."""
    return torch.ops.deploytk.token_aggregate(size, torch.ones_like(size), dest, tokens_out, False)


class BlockScope(nn.Module):
    """Runs one block of the method's loop inside a module of its own (``MergedViT.block_scopes``), so that fvcore files
    the ops the framework calls for the block (the attention, the matching ops), outside the block's own modules, under
    it instead of outside every block. No parameters, nothing in the state dict."""

    def forward(self, run, *args):
        return run(*args)


class MergedViT(nn.Module):
    """A ViT (any registered family) run with a token-reduction method (``reduction``) at its static schedule.

    ``prop_attn`` adds log(size) to the attention logits so merged tokens keep their weight.
    """

    def __init__(self, vit: nn.Module | ModelFamily, reduction: Reduction, prop_attn: bool = True, output: OutputSpec | None = None):
        super().__init__()
        family = adapt(vit)
        output = output or OutputSpec()
        if len(list(reduction.parameters())) and not family.takes_learned_reducers:
            raise DeploytkError(
                f"method {reduction.name} has trained layers of its own, loaded from checkpoints in the layout of the "
                f"TokenReduction models, which are timm ViTs; {family.architecture} ({family.name}) is not one.",
                hint="Use a method without trained layers on this model (`deploytk methods`: learned = no), or this method on a timm ViT.",
            )
        if reduction.needs_prop_attn and not prop_attn:
            raise DeploytkError(
                f"method {reduction.name} needs `merge.prop_attn: true`: it leaves empty token slots of size 0, "
                "which only proportional attention (log size = -inf) ignores."
            )
        #: the model itself (its modules keep their names under ``vit.``)
        self.vit = family.model
        #: its family's adapter: everything the forward asks of the model goes through it
        self.family = family
        self.reduction = reduction
        self.prop_attn = prop_attn
        #: class + distillation + register tokens
        self.protected = reduction.protected
        #: called as hook(op_name, args, dest) -> dest by every matching op; the validator records
        #: the reference's choices and replays a backend's through it (None: plain reference)
        self.dest_hook = None
        #: weights/activations dtype; ``merging.precision.to_precision`` lowers it (I/O stays fp32)
        self.compute_dtype = torch.float32
        #: without prop_attn, run fp16/bf16 attention as PyTorch's fused SDPA instead of the fp32
        #: softmax the export has: what a latency benchmark compares (the reference keeps False)
        self.fused_low_precision_attention = False
        #: what the forward returns (``export.output``), its kind resolved against the model's head
        self.output = _checked_output(output, family, reduction)
        self.output_kind = output.resolved(family.num_classes)
        #: blocks the output needs (a feature layer stops early)
        self.blocks_run = self.output.blocks_run(family.depth)
        _check_stem(family, reduction, self.blocks_run)
        patches_left = reduction.tokens_after(self.blocks_run) - self.protected
        if self.output_kind in DENSE_KINDS and patches_left < 1:
            what = "would be empty" if self.output_kind == "tokens" else "would give every patch a feature from before the last block"
            raise DeploytkError(
                f"`export.output: {self.output_kind}` {what}: method {reduction.name} leaves no token but the prefix tokens "
                f"after block {self.blocks_run - 1}.",
                hint=reduction.no_patches_left_hint() or "Set an earlier `export.feature_layer` or a milder schedule.",
            )
        #: one ``BlockScope`` per block, used while ``scoped_blocks`` (FLOP counting sets it; exports leave it off, so that
        #: their graphs' node metadata stays as it was)
        self.block_scopes = nn.ModuleList(BlockScope() for _ in range(family.depth))
        self.scoped_blocks = False
        #: the matching ops the current block called, while patches are followed (None otherwise)
        self._block_calls: list | None = None
        #: the method's ops can drop tokens (unmerge then keeps dropped patches' features; merging ops never need to)
        self._drops_tokens = any(OPS[name].drops_tokens for name in reduction.ops if name in OPS) or reduction.truncates

    @property
    def output_names(self) -> list[str]:
        """The graph's output names, in the order ``forward`` returns them."""
        kind = self.output_kind
        if kind == "logits":
            return ["logits"]
        if kind == "embedding":
            return [self.family.embedding_name]
        if kind == "patch_features":
            return ["patch_features"]
        return ["tokens", "token_sizes"] + (["patch_to_token"] if self.output.token_map else [])

    @property
    def output_tokens(self) -> int:
        """K of ``export.output: tokens``: the tokens after the last block run, the prefix tokens dropped unless kept."""
        k = self.reduction.tokens_after(self.blocks_run)
        return k if self.output.keep_prefix_tokens else k - self.protected

    @classmethod
    def dense(cls, vit: nn.Module | ModelFamily, prop_attn: bool = True, output: OutputSpec | None = None) -> MergedViT:
        """The same weights with no reduction (what every speedup and FLOP ratio is relative to)."""
        family = adapt(vit)
        return cls(family, Reduction(family, [], MethodOptions()), prop_attn, output)

    @property
    def schedule(self) -> TokenSchedule:
        return self.reduction.schedule

    @property
    def num_tokens(self) -> int:
        """Tokens entering the first block: prefix tokens + patches."""
        return self.reduction.num_tokens

    def forward(self, x: torch.Tensor):
        """A batch of the family's input kind -> the output ``export.output`` names (several outputs: a tuple in ``output_names`` order)."""
        family, out = self.family, self.output
        x = family.embed(x.to(self.compute_dtype))
        size = torch.ones(x.shape[0], x.shape[1], 1, dtype=torch.float32, device=x.device)  # always fp32
        keep_dropped = out.kind == "patch_features" and self._drops_tokens
        unmerging = out.kind == "patch_features"
        sources = PatchSources(x, self.protected, family.num_patches, keep_dropped, unmerging) if out.follows_patches else None
        for i in range(family.stem_blocks, self.blocks_run):  # a stem's blocks ran in ``embed``
            self._block_calls = [] if sources is not None else None
            x_in = x
            try:
                args = (self, i, family.blocks[i], x, size)
                x, size = self.block_scopes[i](self.reduction.block, *args) if self.scoped_blocks else self.reduction.block(*args)
            finally:
                calls, self._block_calls = self._block_calls, None
            if sources is not None:
                sources.after_block(i, x_in, x.shape[1], calls)
        if self.output_kind == "logits":
            return family.head(family.final_norm(x), size).float()
        if self.output_kind == "embedding":
            return family.pre_logits(family.final_norm(x), size).float()
        at_layer = out.feature_layer is not None  # a hidden state as is; else the model's own final features
        features = (lambda t: t) if at_layer else family.features
        if self.output_kind == "patch_features":
            return sources.unmerge(features(x), features).float()
        first = 0 if out.keep_prefix_tokens else self.protected
        tokens = (features(x)[:, first:].float(), size[:, first:, 0])
        return (*tokens, sources.token_of_patch(first)) if out.token_map else tokens

    # ---- what a method's block and reduction use -------------------------------------------

    def standard_block(self, i: int, blk: BlockParts, x, size):
        """One block: attention (+ residual), the method's ``reduce``, MLP (+ residual)."""
        attn_out, metric, cls_attn = self.attention(blk, blk.attn_input(x), size, self.reduction.wants_cls_attention(i))
        x = blk.attn_residual(x, attn_out)
        x, size = self.reduction.reduce(self, i, x, size, metric, cls_attn)
        return blk.mlp_residual(x), size

    def block_with_attention_map(self, blk: BlockParts, x, size):
        """One block without reduction, its attention run in plain ops so that the map is kept:
        (x, probs [B, H, N, N] fp32, the keys averaged over heads [B, N, D]), for methods that score tokens by the
        attention they received at the end of a block (K-Medoids, VisionZip)."""
        h = blk.attn_input(x)
        gate = blk.gate(h)
        q, k, v = blk.qkv(h)
        probs = attention_probs(blk.scale, q, k, size if self.prop_attn else None)
        x = blk.attn_residual(x, blk.attn_output(attend(probs, v), gate))
        return blk.mlp_residual(x), probs, k.mean(1)

    def match(self, op_name: str, *args):
        """A matching/selection op (-> ``dest``), routed through ``dest_hook`` when one is set.

        Its float inputs are cast to fp32: a discrete choice made on fp16 scores would flip
        on ties that fp32 resolves.
        """
        args = tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        dest = getattr(torch.ops.deploytk, op_name)(*args)
        dest = dest if self.dest_hook is None else self.dest_hook(op_name, args, dest)
        if self._block_calls is not None:
            self._block_calls.append((op_name, args, dest))
        return dest

    def attention(self, blk: BlockParts, x, size, cls_attention: bool = False):
        """The block's attention on its input ``x``, with proportional attention.

        Also returns the keys averaged over heads (ToMe's metric) and, if asked, the attention
        the class token pays every token (mean over heads) [B, N].
        """
        gate = blk.gate(x)
        q, k, v = blk.qkv(x)
        if self.prop_attn:
            out = torch.ops.deploytk.proportional_attention(q, k, v, size, float(blk.scale))
        elif q.dtype == torch.float32 or self.fused_low_precision_attention:
            out = F.scaled_dot_product_attention(q, k, v)
        else:  # low precision: keep the softmax in fp32, as ProportionalAttention does
            out = attend(attention_probs(blk.scale, q, k, None), v)
        cls_attn = attention_probs(blk.scale, q[:, :, :1], k, size if self.prop_attn else None)[:, :, 0].mean(1) if cls_attention else None
        return blk.attn_output(out, gate), k.mean(1), cls_attn


def build_merged(
    method: type[Reduction], vit: nn.Module | ModelFamily, r_spec, prop_attn: bool, options: MethodOptions, output: OutputSpec | None = None
) -> MergedViT:
    """``vit`` with ``method`` at the schedule ``r_spec`` (an int, a per-block list or (r, inflection)), giving ``output``."""
    family = adapt(vit)
    return MergedViT(family, method(family, parse_r(family.depth, r_spec, family.architecture), options), prop_attn, output)


def _check_stem(family: ModelFamily, reduction: Reduction, blocks_run: int) -> None:
    """Refuse a reduction or an output inside blocks the family runs as its stem (``stem_blocks``), with what to set."""
    stem = family.stem_blocks
    if not stem:
        return
    where = f"{family.architecture} runs blocks 0..{stem - 1} on its two token scales side by side and fuses them before block {stem}"
    if blocks_run < stem:
        raise DeploytkError(
            f"`export.feature_layer` stops after {blocks_run} blocks, inside the multi-scale stem: {where}.",
            hint=f"Take a feature layer from {stem} on (the fused tokens are the output of block {stem - 1}), or the final features.",
        )
    early = [i for i in range(stem) if reduction.schedule.effective_r[i]]
    if early:
        knob = (
            "a per-block `merge.r` list starting with " + ", ".join(["0"] * stem)
            if reduction.uses_r
            else f"`merge.options.layers` >= {stem}"
        )
        raise DeploytkError(
            f"method {reduction.name} would reduce tokens in block(s) {early}, inside the multi-scale stem: {where}; no method "
            "reduces there.",
            hint=f"Set {knob} (the paper reduces in blocks 3, 6, 9 of DeiT).",
        )


def _checked_output(output: OutputSpec, family: ModelFamily, reduction: Reduction) -> OutputSpec:
    """``output`` if this model and method can give it; else the reason, as an error."""
    kind = output.resolved(family.num_classes)
    if kind == "logits" and not family.num_classes:
        raise DeploytkError(
            f"`export.output: logits` needs a classifier head; {family.architecture} has none.",
            hint=f"Use `export.output: embedding` (its {family.embedding_name}), `patch_features` or `tokens`.",
        )
    reduces = reduction.schedule.tokens_out != reduction.num_tokens
    if kind in ("logits", "embedding") and family.pool == "" and reduces:
        raise DeploytkError(
            f"{family.architecture} pools nothing (`global_pool=''`): its output ({kind}) is one row per token, and method "
            f"{reduction.name} leaves {reduction.schedule.tokens_out} of its {reduction.num_tokens} tokens, so the rows would "
            "no longer be the model's.",
            hint="Use `export.output: tokens` (the reduced tokens with their sizes) or `export.output: patch_features` (a "
            "feature per patch of the full grid), or build the model with a pooling head (global_pool='token', 'avg', ...).",
        )
    if output.follows_patches and reduction.soft_assignment:
        what = "patch_features" if kind == "patch_features" else "`export.token_map`"
        raise DeploytkError(
            f"{what} needs to know which token holds each patch, and method {reduction.name} has no such map: its learned "
            "layer makes every output token a mixture of all patches.",
            hint="Use `export.output: tokens` without `token_map` with this method, or a merging/pruning method (`deploytk methods`).",
        )
    return output
