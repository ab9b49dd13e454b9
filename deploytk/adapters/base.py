"""``ModelFamily``: what the token-reduction framework needs from a Vision Transformer, and the registry of families.

``MergedViT`` and every method talk to a model only through its family's adapter: how an
image becomes tokens (patches plus prefix tokens: class, distillation, registers), one
block's parts (``BlockParts``: the attention's q/k/v in heads, its output projection, the
residual branches with their norms and LayerScale, the MLP), the final norm and the head
with its pooling. The adapter keeps the family's own modules (its state_dict and weights
stay the family's) and holds no parameters of its own. A new family is one file in
``deploytk/adapters/`` with ``@register_family``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from deploytk.errors import DeploytkError
from deploytk.inputs import ImageInput, InputKind, PatchGrid

#: the pooling kinds ``pool_tokens`` knows: the class token, size-weighted average, max, their mix, or none (all tokens)
POOLS = ("token", "avg", "avgmax", "max", "")


class BlockParts:
    """One encoder block taken apart into the pieces the methods recombine.

    A pre-norm block is ``x + attn(norm1(x))`` then ``x + mlp(norm2(x))`` (LayerScale on each
    branch where the family has it); a post-norm block is ``x + norm1(attn(x))`` then
    ``x + norm2(mlp(x))``. ``post_norm`` says which.
    """

    post_norm: bool = False
    num_heads: int
    head_dim: int
    #: the softmax scale of q k^T (1/sqrt(head_dim) for every family so far)
    scale: float

    def attn_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the attention reads: norm1(x) pre-norm, x post-norm."""
        raise NotImplementedError

    def qkv(self, h: torch.Tensor, which: str = "qkv") -> list[torch.Tensor]:
        """The projections named in ``which`` (a run of "qkv": "qkv", "qk", "v") as [B, H, N, D], after any q/k norms."""
        raise NotImplementedError

    def gate(self, h: torch.Tensor) -> torch.Tensor | None:
        """A gated attention's sigmoid gate on its input; None for an ungated one."""
        return None

    def attn_output(self, out: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        """Attention values [B, H, N, D] -> the attention branch's output [B, N, C] (merge heads, gate, projection)."""
        raise NotImplementedError

    def attn_residual(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """x plus the attention branch (its LayerScale pre-norm, its norm post-norm)."""
        raise NotImplementedError

    def mlp_residual(self, x: torch.Tensor) -> torch.Tensor:
        """x plus the MLP branch."""
        raise NotImplementedError


class ModelFamily:
    """The adapter of one family of Vision Transformers around a model object of that family."""

    #: the family's name (`deploytk families`, the manifest)
    name: ClassVar[str] = ""
    #: one line for `deploytk families` and the docs
    summary: ClassVar[str] = ""
    #: a config's ``model:`` starting with this names a model of this family (``hf:``); None: timm's model names
    prefix: ClassVar[str | None] = None
    #: the learned reducers' checkpoints (the TokenReduction layout) hold this family's parameter names
    takes_learned_reducers: ClassVar[bool] = False
    #: how a config's ``model:`` names this family's models, for `deploytk families` (None: ``<prefix><folder|Hub id>``)
    model_syntax: ClassVar[str | None] = None

    @classmethod
    def load(
        cls, name: str, *, img_size: int | tuple[int, int] | None, model_kwargs: dict, pretrained: bool, checkpoint: str | None
    ) -> nn.Module:
        """The model ``name`` (with ``prefix``) names, in eval mode, built from a config's ``model``, ``export.img_size``
        (None: the model's own), ``model_kwargs`` and ``pretrained``; ``checkpoint``, a weights file ``deploytk.models``
        loads into it afterwards, is given so that a family whose models hold their own weights can refuse it. Random
        weights are seeded by the caller."""
        raise NotImplementedError

    def __init__(self, model: nn.Module):
        self.model = model
        self.check()

    @classmethod
    def accepts(cls, model: nn.Module) -> bool:
        """Whether ``model`` is an object of this family (checked before ``check`` refuses what the family cannot run)."""
        raise NotImplementedError

    def check(self) -> None:
        """Refuse, with the reason, a model of this family whose forward the adapter would not reproduce."""

    # ---- shape of the token sequence ----------------------------------------------------

    #: blocks, in order
    blocks: list[BlockParts]
    #: class + distillation + register tokens: never merged or dropped
    num_prefix_tokens: int
    has_class_token: bool
    #: a distilled DeiT's second prefix token (its head averages the two heads)
    has_dist_token: bool = False
    #: leading blocks that ``embed`` runs itself, where the tokens are not one sequence (the multi-scale ViT's two token
    #: groups before their fusion): no method reduces there and no output is taken from there; the rest are ``blocks``
    stem_blocks: int = 0
    #: patch grid (rows, cols) and input size (H, W) the model was built for (a video's: of one frame)
    grid_size: tuple[int, int]
    img_size: tuple[int, int]
    #: a video's tubelet groups along time (its frames / the tubelet's): the patches are ``time_groups`` grids, time first
    time_groups: int = 1
    embed_dim: int
    #: the MLP's hidden width (``tune`` estimates a schedule's FLOPs from it)
    mlp_dim: int
    #: "token", "avg", "avgmax", "max", "" (see ``POOLS``) or "attention" (a learned query attends over the tokens)
    pool: str
    #: the model's classes (0: no head; the output is the pooled feature of width ``num_features``)
    num_classes: int
    num_features: int
    #: the architecture's name for messages (timm's ``architecture``, transformers' class)
    architecture: str
    #: the name of the pooled output (``export.output: embedding``): transformers' output field, ``embedding`` for timm
    embedding_name: str = "embedding"

    @property
    def depth(self) -> int:
        return len(self.blocks)

    @property
    def num_patches(self) -> int:
        return self.time_groups * self.grid_size[0] * self.grid_size[1]

    @property
    def input_kind(self) -> InputKind:
        """What one sample of the model's input is (``deploytk.inputs``): an RGB image of ``img_size`` unless the family
        says otherwise (a video family: a clip of frames; an audio family: a spectrogram)."""
        return ImageInput.of_size(self.img_size)

    @property
    def patch_grid(self) -> PatchGrid:
        """How the input is cut into patch tokens (what ``visualize`` maps onto the sample): ``time_groups`` grids of
        ``grid_size`` tiling the input, unless the family's patches overlap."""
        return PatchGrid(self.grid_size[0], self.grid_size[1], self.time_groups)

    @property
    def post_norm(self) -> bool:
        return any(b.post_norm for b in self.blocks)

    # ---- the forward pass, in pieces ----------------------------------------------------

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """A batch of ``input_kind`` -> the tokens entering block ``stem_blocks`` (0 but for a stem) [B, prefix + patches, C]."""
        raise NotImplementedError

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def head(self, x: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
        """The final-normed tokens and their sizes -> the model's output (a merged token weighs ``size`` in an average pool)."""
        raise NotImplementedError

    def pre_logits(self, x: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
        """The final-normed tokens -> the pooled feature a classifier reads (``export.output: embedding``); a model
        without a head outputs it already."""
        if self.num_classes:
            raise NotImplementedError(f"{type(self).__name__} has a head but no pre_logits")
        return self.head(x, size)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The last block's output as the model itself returns its token features (timm's ``forward_features``,
        transformers' ``last_hidden_state``): the final norm, unless the family applies it to the pooled token only."""
        return self.final_norm(x)

    def flop_parts(self) -> dict[str, str]:
        """Modules outside the blocks whose FLOPs `inspect` reports on their own (label -> module name in the model)."""
        return {}

    def block_path(self, i: int) -> str:
        """Block ``i``'s module name inside the model (where fvcore files its FLOPs)."""
        raise NotImplementedError

    def patch_embedding_path(self) -> str:
        """The patch embedding's module name inside the model (bf16 keeps its convolution in fp32)."""
        raise NotImplementedError

    def eval_transform(self):
        """The family's own eval preprocessing: one sample as ``input_kind.read`` decodes it (an image: a PIL image) -> the
        model's input for it (one sample of ``input_kind.shape``)."""
        raise NotImplementedError

    def input_transform(self):
        """What every command preprocesses a decoded file with: the recorded pipeline (``preprocess_record``, applied by
        ``deploytk.inputs.preprocess``, the implementation a deployed artifact runs) where the family has one, else its
        own ``eval_transform``. The two agree within 1e-6 (tests/test_preprocess.py)."""
        from deploytk.inputs.preprocess import ImagePipeline

        record = self.preprocess_record()
        return ImagePipeline.from_record(record).apply if record.get("kind") == "image" else self.eval_transform()

    def preprocess_record(self) -> dict[str, Any]:
        """``eval_transform`` as data (``deploytk.inputs.preprocess``), recorded in the manifest so the artifact applies
        it without this family's library; ``{"kind": None, "reason": ...}`` where it has no data form yet."""
        return {"kind": None, "reason": f"not recorded: the {self.name} family's preprocessing has no data form yet"}

    def normalization(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(mean, std) per RGB channel of ``eval_transform`` (visualize undoes them to draw what the model saw)."""
        raise NotImplementedError

    def reads_natively(self, path) -> bool:
        """Whether ``read_checkpoint`` reads ``path`` (such a file holds the model's weights only, no learned reducer's)."""
        return False

    def read_checkpoint(self, path) -> dict[str, torch.Tensor] | None:
        """A checkpoint file in a format only the family's own library reads (timm: JAX ``.npz``), as this model's state
        dict; None: a state dict file (.safetensors, .pth), read by ``deploytk.models``."""
        return None

    def convert_checkpoint(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A checkpoint's state dict in this model's own layout and shapes (the family's own converter), before the strict
        load that refuses whatever still does not fit."""
        return state

    def plain(self) -> nn.Module:
        """The model as users call it, reduced to one output tensor: the dense baseline exported beside a merged graph."""
        raise NotImplementedError

    def as_loaded(self) -> None:  # noqa: B027 (most families' loaders set nothing)
        """Set on a model object handed over from Python what this family's ``load`` sets on the models it builds, so
        both run alike (transformers: the eager attention, the one deploytk's plain-op attention reproduces)."""

    def save_source(self, folder: Path) -> dict | str:
        """Write into ``folder`` what rebuilds this model object in another process (the Python API's in-memory models),
        and return the recipe: ``model`` (a config's ``model:``, ``{folder}`` standing for the folder), ``model_kwargs``
        and ``checkpoint`` (a file in ``folder``, or None). A string instead says why this object cannot be rebuilt; its
        reference then exists only in the process that holds it."""
        return f"the {self.name} family has no way to store a model object"


def pool_tokens(x: torch.Tensor, size: torch.Tensor, pool: str, skip: int) -> torch.Tensor:
    """Pool [B, N, C] tokens to [B, C] as ``pool`` says, leaving out the first ``skip`` (prefix) tokens for the non-token
    pools; a merged token counts ``size`` times in the average (summed in fp32)."""
    if pool == "token":
        return x[:, 0]
    if not pool:
        return x
    x, size = x[:, skip:], size[:, skip:]
    if pool == "max":  # sizes play no part: nothing of them may reach the graph (its last size aggregation is then dead)
        return x.amax(dim=1)
    avg = ((x * size).sum(dim=1) / size.sum(dim=1)).to(x.dtype)
    if pool == "avg":
        return avg
    return 0.5 * (x.amax(dim=1) + avg)  # avgmax


#: family name -> its adapter class; filled by ``@register_family`` as ``deploytk.adapters`` loads
FAMILIES: dict[str, type[ModelFamily]] = {}


def register_family(cls: type[ModelFamily]) -> type[ModelFamily]:
    """Class decorator: make ``cls`` an adapter ``adapt`` can choose."""
    if not (isinstance(cls, type) and issubclass(cls, ModelFamily)) or not cls.name:
        raise TypeError(f"@register_family needs a ModelFamily subclass with its own `name`; got {cls!r}.")
    if cls.name in FAMILIES and FAMILIES[cls.name] is not cls:
        raise TypeError(f"family name {cls.name!r} is registered twice ({FAMILIES[cls.name].__module__} and {cls.__module__}).")
    FAMILIES[cls.name] = cls
    return cls


def family_named(name: str) -> type[ModelFamily]:
    """The family a config's ``model:`` names: the one whose ``prefix`` starts it, else the family of unprefixed names
    (timm's)."""
    prefixed = next((f for f in FAMILIES.values() if f.prefix and name.startswith(f.prefix)), None)
    return prefixed or next(f for f in FAMILIES.values() if f.prefix is None)


def adapt(model: nn.Module | ModelFamily) -> ModelFamily:
    """The adapter of the family ``model`` belongs to (an adapter is returned as is)."""
    if isinstance(model, ModelFamily):
        return model
    for family in FAMILIES.values():
        if family.accepts(model):
            return family(model)
    raise DeploytkError(
        f"model class {type(model).__name__} belongs to no model family deploytk knows "
        f"({', '.join(f'{name}: {f.summary}' for name, f in FAMILIES.items())})."
    )
