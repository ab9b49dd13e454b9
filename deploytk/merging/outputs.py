"""What a reduced model outputs (``export.output``), and the patch -> token map that dense outputs need.

- ``logits``: the classifier's output (a model with a head);
- ``embedding``: the pooled feature before the head (the output of a head-less model: DINOv2, CLIP/SigLIP towers);
- ``patch_features``: one feature per patch of the full grid ``[B, P, C]`` for dense heads (segmentation, depth).
  A merged patch takes the feature of the token that holds it (ToMe for Stable Diffusion's *unmerge*, here a
  plain Gather through the composed map); a dropped patch keeps the hidden state its token had entering the
  block that dropped it, put through the same final norm (K-Medoids drops at the end of a block: its non-medoids
  keep their state from before that block). A patch
  fused into EViT's extra token follows that token like a merged one: the model carries its information there;
- ``tokens``: the reduced token set ``[B, K, C]`` (K static), each token's size ``[B, K]`` (a size-0 token is an
  empty slot ATS or K-Medoids left: mask it) and, optionally, the patch -> token map ``[B, P]`` (-1: dropped).

``feature_layer`` (dense kinds) counts like transformers' ``hidden_states``: 0 is the embedding, i the output of
block i-1, negative from the end (-1: the last block, -2: the penultimate layer LLaVA takes); None is the family's
own final feature (timm's ``forward_features``, transformers' ``last_hidden_state``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deploytk.errors import DeploytkError
from deploytk.ops import spec_for

#: the kinds that end in token features rather than a pooled vector
DENSE_KINDS = ("patch_features", "tokens")


@dataclass(frozen=True)
class OutputSpec:
    """``export.output`` and its settings, as the reference runs them (``kind`` None: the model's own output)."""

    kind: str | None = None
    feature_layer: int | None = None
    keep_prefix_tokens: bool = False
    token_map: bool = False

    def resolved(self, num_classes: int) -> str:
        """The kind, with None made the model's own: logits with a head, the embedding without."""
        return self.kind or ("logits" if num_classes else "embedding")

    @property
    def follows_patches(self) -> bool:
        """Whether the forward tracks where every patch goes (unmerge, the patch -> token map)."""
        return self.kind == "patch_features" or (self.kind == "tokens" and self.token_map)

    def blocks_run(self, depth: int) -> int:
        """How many blocks the output needs (a feature layer before the last stops there)."""
        layer = self.feature_layer
        if layer is None:
            return depth
        if not -(depth + 1) <= layer <= depth:
            raise DeploytkError(
                f"`export.feature_layer` = {layer} is outside this {depth}-block model's layers: allowed 0..{depth} "
                f"(0: the embedding, i: the output of the first i blocks) or -{depth + 1}..-1 (from the end; -1: the last block's output)."
            )
        return layer if layer >= 0 else depth + 1 + layer


class PatchSources:
    """Where every patch of the input is, token by token, while a reduced model runs (traced into the graph).

    ``owner`` [B, P]: the token that holds each patch now; ``alive`` [B, P]: False once the patch was dropped;
    ``last`` [B, P, C]: a dropped patch's hidden state entering the block that dropped it (None: not kept, for methods
    whose ops never drop a token: ToMe, MCTF, DPC-KNN... unmerge is then one Gather).
    Each block's matching/selection op gives ``dest`` (each input token's output slot, as the op's spec says:
    slots after the protected prefix for ops that see patches only; the slot past the last is the drop bucket).
    """

    def __init__(self, x: torch.Tensor, protected: int, patches: int, keep_features: bool, unmerging: bool = False):
        b = x.shape[0]
        self.protected = protected
        #: the output is unmerged features (a patch dropped without ``last`` kept would get a wrong one)
        self.unmerging = unmerging
        self.owner = (torch.arange(patches, device=x.device) + protected).expand(b, patches)
        self.alive = torch.ones(b, patches, dtype=torch.bool, device=x.device)
        self.last = torch.zeros(b, patches, x.shape[-1], dtype=x.dtype, device=x.device) if keep_features else None

    def after_block(self, i: int, x_in: torch.Tensor, tokens_out: int, calls: list) -> None:
        """Follow block ``i`` (its input ``x_in``, ``tokens_out`` tokens out, the matching ops it called)."""
        if len(calls) > 1:
            raise DeploytkError(f"block {i} made {len(calls)} matching/selection choices; patch maps follow one per block.")
        n_in = x_in.shape[1]
        if calls:
            op, args, dest = calls[0]
            spec = spec_for(op)
            offset = self.protected if spec.dest_covers_patches_only else 0
            before = self.owner < offset
            slot = dest.long().gather(1, (self.owner - offset).clamp(min=0))
            stays = before | (slot < tokens_out - offset)
            moved = torch.where(before, self.owner, offset + slot)
        elif tokens_out < n_in:  # no choice, fewer tokens: the leading ones stay (ATM's last block keeps the class token)
            if self.unmerging and self.last is None:
                raise DeploytkError(f"internal: block {i} keeps its leading tokens only, and the method does not say it truncates.")
            stays, moved = self.owner < tokens_out, self.owner
        else:
            return
        dropped = self.alive & ~stays
        if self.last is not None:
            held = x_in.gather(1, self.owner[..., None].expand(-1, -1, x_in.shape[-1]))
            self.last = torch.where(dropped[..., None], held, self.last)
        self.alive = self.alive & stays
        self.owner = torch.where(self.alive, moved, torch.zeros_like(moved))

    def unmerge(self, x: torch.Tensor, last_features) -> torch.Tensor:
        """[B, P, C]: every patch's token feature from ``x``; a dropped patch's from ``last_features(self.last)``."""
        out = x.gather(1, self.owner[..., None].expand(-1, -1, x.shape[-1]))
        if self.last is None:
            return out
        return torch.where(self.alive[..., None], out, last_features(self.last))

    def token_of_patch(self, first: int) -> torch.Tensor:
        """[B, P] int64: the output token index of every patch (token indices start after ``first`` dropped ones); -1: dropped."""
        return torch.where(self.alive, self.owner - first, torch.full_like(self.owner, -1))
