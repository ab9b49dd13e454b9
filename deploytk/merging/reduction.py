"""``Reduction``, the base of every token-reduction method, and the registry methods join with ``@register_method``.

A method is one file in ``deploytk/reducers/``: its options (a pydantic model, validated from
``merge.options``), its static schedule (planned in its own ``__init__`` from the model and the
config) and what it does to the tokens of a block (``reduce``, between attention and MLP as in
ToMe, or a whole ``block`` of its own as MCTF needs). The framework (``MergedViT``) runs the
ViT and calls it; the ops it calls are the deploytk ops, so the method exports as is.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from torch import nn

from deploytk.adapters import BlockParts, ModelFamily
from deploytk.errors import DeploytkError
from deploytk.merging.schedule import TokenSchedule


class MethodOptions(BaseModel):
    """``merge.options`` of a method; unknown keys are errors. Field descriptions are the docs."""

    model_config = ConfigDict(extra="forbid")

    #: every method takes it: ``tune`` records where its schedule came from (not a setting; listed once in the docs)
    tuned: dict[str, Any] | None = Field(
        None, description="written by `deploytk tune`: the latency budget, backend, device and measured latency that chose this schedule"
    )


class Reduction(nn.Module):
    """A token-reduction method on a ViT of any family, seen through its ``ModelFamily`` adapter.
    The base class reduces nothing (the dense model).

    A subclass sets the class attributes, validates its model and plans ``self.schedule`` in its
    ``__init__`` (after ``super().__init__``), and overrides ``reduce`` or ``block``.
    """

    #: ``merge.method``
    name: ClassVar[str] = "none"
    #: one line for `deploytk methods` and the docs
    summary: ClassVar[str] = "no reduction"
    Options: ClassVar[type[MethodOptions]] = MethodOptions
    #: False: the method keeps ``merge.options.keep_rate`` of the tokens and rejects ``merge.r``
    uses_r: ClassVar[bool] = True
    #: what sets the token counts, for `deploytk methods` (None: ``merge.r``, or ``keep_rate`` at ``layers`` without r)
    schedule_knobs: ClassVar[str | None] = None
    #: the deploytk ops its export contains (checked against a trace in the tests)
    ops: ClassVar[tuple[str, ...]] = ()
    #: how tokens are reduced: merging, pruning, pruning + fusion, clustering
    kind: ClassVar[str] = "none"
    #: the method has trained parameters of its own (loaded with the checkpoint)
    learned: ClassVar[bool] = False
    #: where a learned method's parameters sit in a checkpoint (the official model class's attribute,
    #: e.g. ``cluster_layers``): keys under it load into this module, the rest into the timm ViT
    checkpoint_prefix: ClassVar[str | None] = None
    #: for a method whose learned layers are optional: the option that turns them on (``learned`` stays False)
    learned_when: ClassVar[str | None] = None
    #: a block may keep only its leading tokens, without a matching op (ATM's class-token-only last block)
    truncates: ClassVar[bool] = False
    #: the method's output tokens are learned mixtures of all patches: no patch -> token map (patch_features refused)
    soft_assignment: ClassVar[bool] = False
    #: the method leaves tokens of size 0 that only proportional attention ignores (``merge.prop_attn`` must be true)
    needs_prop_attn: ClassVar[bool] = False
    #: why a block's r can be less than ``merge.r`` asked (the export's note on a capped schedule; ``uses_r`` methods)
    cap_rule: ClassVar[str] = "a block cannot merge away more than half of its tokens (ToMe's rule, protected tokens not counted)"
    #: the schedule knob `deploytk tune` searches: ``r`` (per-layer merges), ``keep_rate`` or ``quantile`` (ATM's
    #: calibration statistic); None where the token counts are trained into the method's layers
    tune_knob: ClassVar[str | None] = None
    #: why ``tune`` cannot search a method without a knob, and what to do instead
    untunable_reason: ClassVar[str] = (
        "its token counts are trained into its layers (a different count needs different weights); fine-tune it at another keep rate"
    )
    #: the method's r is data-dependent: ``calibration_pass(model, images)`` returns the r each block takes on a batch,
    #: and `deploytk calibrate` fixes a quantile of it per block; ``calibration_statistic`` says so (``{q}``: the quantile)
    calibrated: ClassVar[bool] = False
    calibration_statistic: ClassVar[str] = ""

    def calibration_pass(self, model, images) -> list[int]:
        """The r each block takes on ``images`` when the method runs dynamically (``calibrated`` methods)."""
        raise NotImplementedError(f"method {self.name} has no data-dependent schedule to calibrate")

    def calibration_settings(self) -> dict:
        """The settings a calibration ran with, recorded beside its result (ATM: thresholds, split layer)."""
        return {}

    @classmethod
    def tuning_points(cls, options: MethodOptions) -> list[tuple[str, dict, dict]]:
        """Settings `tune` tries (each calibrated at the median) instead of quantiles of one calibration run:
        [(label, what the report shows, merge.options overrides)]; none by default."""
        return []

    def __init__(self, family: ModelFamily, r_per_layer: list[int], options: MethodOptions):
        super().__init__()
        self.options = options
        self.depth = family.depth
        #: class + distillation + register tokens: never merged or dropped
        self.protected = int(family.num_prefix_tokens)
        #: tokens entering the first block
        self.num_tokens = family.num_patches + self.protected
        self.schedule = TokenSchedule([0] * self.depth, [0] * self.depth, [self.num_tokens] * self.depth, self.protected)

    def block(self, model, i: int, blk: BlockParts, x, size):
        """Block ``i``: by default attention (+ residual), ``reduce``, MLP (+ residual)."""
        return model.standard_block(i, blk, x, size)

    def reduce(self, model, i: int, x, size, metric, cls_attn):
        """Reduce the tokens of block ``i`` after its attention: ``metric`` is the keys averaged over heads,
        ``cls_attn`` the class token's attention [B, N] when ``wants_cls_attention(i)``. Returns (x, size)."""
        return x, size

    def wants_cls_attention(self, i: int) -> bool:
        return False

    def tokens_after(self, blocks: int) -> int:
        """Tokens leaving the first ``blocks`` blocks (0: the embedding's), which a feature-layer output gives."""
        return self.schedule.tokens_out_of(blocks) if blocks else self.num_tokens

    def no_patches_left_hint(self) -> str | None:
        """What to change when the method leaves only the prefix tokens and the output needs patch tokens."""
        return None

    def flop_blocks(self) -> dict[str, int]:
        """Submodules of this method with FLOPs of their own -> the block they are counted in."""
        return {}

    @classmethod
    def parse_options(cls, options: dict | None, source: str = "merge.options") -> MethodOptions:
        try:
            return cls.Options.model_validate(options or {})
        except ValidationError as err:
            problems = []
            for e in err.errors():
                field = ".".join(str(p) for p in e["loc"])
                if e["type"] == "extra_forbidden":
                    allowed = ", ".join(n for n in cls.Options.model_fields if n != "tuned") or "none"  # tuned: written by tune
                    problems.append(f"unknown option `{source}.{field}` for method {cls.name} (allowed: {allowed})")
                else:
                    problems.append(f"`{source}.{field}` = {e.get('input')!r}: {e['msg']}")
            raise DeploytkError("; ".join(dict.fromkeys(problems)) + ".", hint="`deploytk methods` lists every method's options.") from None


def check_layers(layers, depth: int, method: str) -> list[int]:
    """Sorted distinct block indices, each in [0, depth)."""
    bad = [i for i in layers if not 0 <= i < depth]
    if bad:
        raise DeploytkError(
            f"`merge.options.layers` = {layers}: {method} block indices must be in [0, {depth - 1}] for this {depth}-block model."
        )
    return sorted(set(layers))


#: merge.method -> its Reduction class; filled by ``@register_method`` as ``deploytk.reducers`` loads
METHODS: dict[str, type[Reduction]] = {}


def register_method(cls: type[Reduction]) -> type[Reduction]:
    """Class decorator: make ``cls`` available as ``merge.method: <cls.name>``."""
    if not (isinstance(cls, type) and issubclass(cls, Reduction)) or cls.name in ("", Reduction.name):
        raise TypeError(f"@register_method needs a Reduction subclass with its own `name`; got {cls!r}.")
    if cls.name in METHODS and METHODS[cls.name] is not cls:
        raise TypeError(f"method name {cls.name!r} is registered twice ({METHODS[cls.name].__module__} and {cls.__module__}).")
    METHODS[cls.name] = cls
    return cls
