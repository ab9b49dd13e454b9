"""The export config: a YAML file validated on load (unknown keys are errors).

Every validation failure becomes one DeploytkError naming the field, the bad value and
what is allowed (with the YAML line for syntax errors).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from deploytk.adapters.hf_common import HF_PREFIX
from deploytk.errors import DeploytkError, file_problem
from deploytk.merging.outputs import DENSE_KINDS, OutputSpec
from deploytk.merging.reduction import MethodOptions, Reduction
from deploytk.ready_made import DEFAULT_CONFIG
from deploytk.ready_made import find as find_ready_made
from deploytk.reducers import get_method


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RInflection(_Strict):
    """ToMe's (r, inflection) schedule: linear from int(r*(1-inflection)) to 2r minus that."""

    r: StrictInt = Field(ge=0, description="the mean tokens merged per block")
    inflection: StrictFloat | StrictInt = Field(
        0.0, description="the slope: 0 a constant r, -1 ToMe's decreasing schedule (from 2r down to 0), 1 increasing"
    )


RSpec = StrictInt | list[StrictInt] | RInflection
#: one side of the input image, in pixels
Side = Annotated[StrictInt, Field(ge=16)]


class MergeConfig(_Strict):
    """``merge:``: the token-reduction method and its schedule.

    Each field's ``description`` is its documentation: the docs' config reference is generated from it."""

    method: str = Field("tome", description="a registered method name (`deploytk methods`)")
    r: RSpec = Field(
        16,
        description="tokens merged per block: an int (every block), one int per block, or {r: INT, inflection: FLOAT}; "
        "not used by the keep-rate methods",
    )
    prop_attn: StrictBool = Field(True, description="proportional attention: log(token size) added to the attention logits")
    options: dict[str, Any] = Field(
        {}, description="method-specific options, validated by the method (unknown keys are errors; see `deploytk methods`)"
    )
    #: (method name, options as JSON) -> (its Reduction class, its parsed options): looked up once, not per layer
    _resolved: tuple[tuple[str, str], type[Reduction], MethodOptions] | None = PrivateAttr(default=None)

    @property
    def reduction(self) -> type[Reduction]:
        """The method's class, looked up by name once per config."""
        return self._resolve()[0]

    @property
    def parsed_options(self) -> MethodOptions:
        """``options`` validated by the method (its Options model)."""
        return self._resolve()[1]

    def _resolve(self) -> tuple[type[Reduction], MethodOptions]:
        key = (self.method, json.dumps(self.options, sort_keys=True, default=str))  # a copy with other options re-resolves
        if self._resolved is None or self._resolved[0] != key:
            method = get_method(self.method)
            self._resolved = (key, method, method.parse_options(self.options))
        return self._resolved[1], self._resolved[2]


class ExportSettings(_Strict):
    """``export:``: batch size, input size, opset, precision."""

    batch_size: StrictInt = Field(default=8, ge=1, description="the example batch the export traces; the batch axis stays dynamic")
    img_size: Side | tuple[Side, Side] | None = Field(
        224, description="one int (square) or [H, W], multiples of the patch size; null: the model's own size"
    )
    opset: Literal[18] = Field(
        18, description="the one opset deploytk exports and tests (`build` with `attention_impl=native` raises it to 23 itself, op by op)"
    )
    precision: Literal["fp32", "fp16", "bf16"] = Field("fp32", description="the graph's precision (it lives in the exported graph)")
    output: Literal["logits", "embedding", "patch_features", "tokens"] | None = Field(
        None,
        description="what the graph outputs (deploytk.merging.outputs); null: the model's own (logits with a head, else its embedding)",
    )
    feature_layer: StrictInt | None = Field(
        None,
        description="patch_features / tokens: the hidden state after this many blocks (transformers' hidden_states index; -2: "
        "the penultimate layer LLaVA takes); null: the model's own final features",
    )
    keep_prefix_tokens: StrictBool = Field(
        False, description="tokens: keep the class / distillation / register tokens in front of the reduced patch tokens"
    )
    token_map: StrictBool = Field(False, description="tokens: a second output [B, P] with the token that holds each patch (-1: dropped)")

    def output_spec(self) -> OutputSpec:
        return OutputSpec(self.output, self.feature_layer, self.keep_prefix_tokens, self.token_map)

    @property
    def hw(self) -> tuple[int, int] | None:
        """``img_size`` as (H, W); None: the model's own."""
        size = self.img_size
        return None if size is None else (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


class DeployConfig(_Strict):
    """The whole export config (one YAML file)."""

    model: str = Field(
        "deit_small_patch16_224",
        description="a timm VisionTransformer-family name, or hf:<folder or Hub id> (transformers; `deploytk families`)",
    )
    model_kwargs: dict[str, StrictInt | StrictFloat | StrictBool | StrictStr] = Field(
        {}, description="extra keyword arguments for timm.create_model (num_classes, patch_size, embed_dim, ...)"
    )
    checkpoint: str | None = Field(
        None,
        description="a .safetensors / .pth state_dict or a JAX .npz, relative to the config file's folder; null: random weights (seeded)",
    )
    pretrained: StrictBool = Field(False, description="true: timm's own download of the weights (online only)")
    merge: MergeConfig = Field(MergeConfig(), description="the token-reduction method and its schedule")
    export: ExportSettings = Field(ExportSettings(), description="batch size, input size, opset, precision and output")

    @model_validator(mode="after")
    def _transformers_models_take_their_own_size(self) -> DeployConfig:
        """A transformers model (``hf:``) is built at its config.json's size and deploytk does not resample it, so
        ``export.img_size`` left out means that size (null), not the 224 of timm's names; an audio model has no image
        size at all."""
        if self.model.startswith(HF_PREFIX) and "img_size" not in self.export.model_fields_set:
            self.export = self.export.model_copy(update={"img_size": None})
        return self

    def r_spec(self) -> int | list[int] | tuple[int, float]:
        """The r spec in the form ``merging.schedule.parse_r`` takes."""
        r = self.merge.r
        if isinstance(r, RInflection):
            return (r.r, float(r.inflection))
        return r


_ALLOWED = {
    "r": "a non-negative int, a list of non-negative ints (one per block) or {r: INT, inflection: FLOAT}",
    "method": "a registered method name (see `deploytk methods`)",
    "precision": "fp32, fp16 or bf16",
    "opset": "18, the opset deploytk exports and tests (TensorRT's native attention raises it to 23 at build time)",
    "batch_size": "an int >= 1",
    "img_size": "an int >= 16 (square), [H, W] (each >= 16) or null (the model's default)",
    "output": "logits, embedding, patch_features, tokens or null (the model's own output)",
    "feature_layer": "an int (a hidden_states index: 0 the embedding, i the output of the first i blocks, negative from the end) or null",
}


def _format_validation_error(err: ValidationError, source: str) -> DeploytkError:
    problems = []
    errors = err.errors()
    nested = {".".join(map(str, e["loc"][:1])) for e in errors if len(e["loc"]) > 2}  # a union's deeper branch failed too
    for e in errors:
        if e["type"] == "int_type" and ".".join(map(str, e["loc"][:1])) in nested and isinstance(e.get("input"), list):
            continue  # a list given where an int OR a list is allowed: the list branch's error says what is wrong
        loc = [str(p) for p in e["loc"] if not str(p).startswith(("int", "list[", "tuple[", "constrained-", "RInflection", "function-"))]
        field = ".".join(loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            parent = _model_at(loc[:-1])
            allowed = ", ".join(parent.model_fields) if parent else "see the docs"
            problems.append(f"unknown key `{field}` (allowed keys here: {allowed})")
            continue
        top = next((p for p in reversed(loc) if p in _ALLOWED), None)
        allowed = f"; allowed: {_ALLOWED[top]}" if top else ""
        problems.append(f"`{field}` = {e.get('input')!r}: {e['msg']}{allowed}")
    problems = list(dict.fromkeys(problems))
    return DeploytkError(f"invalid config {source}: " + "; ".join(problems) + ".")


def _model_at(path: list[str]):
    model = DeployConfig
    for p in path:
        field = model.model_fields.get(p)
        if field is None or not isinstance(field.annotation, type) or not issubclass(field.annotation, BaseModel):
            return None
        model = field.annotation
    return model


def config_from_dict(data: dict, source: str = "(in memory)") -> DeployConfig:
    if not isinstance(data, dict):
        raise DeploytkError(f"invalid config {source}: expected a mapping of keys (model, merge, export, ...), got {type(data).__name__}.")
    try:
        cfg = DeployConfig.model_validate(data)
    except ValidationError as err:
        raise _format_validation_error(err, source) from None
    num_classes = cfg.model_kwargs.get("num_classes")
    if num_classes is not None and (not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 0):
        # timm builds no head for num_classes <= 0, while a negative count would still be reported as a logits model
        raise DeploytkError(
            f"invalid config {source}: `model_kwargs.num_classes` = {num_classes!r}; allowed: an int >= 1 (the classes of the "
            "head: a logits model) or 0 (no head: the model outputs its pooled embedding)."
        )
    r = cfg.merge.r
    if isinstance(r, int) and r < 0 or isinstance(r, list) and any(v < 0 for v in r):
        raise DeploytkError(f"invalid config {source}: `merge.r` = {r!r}: r must not be negative; allowed: {_ALLOWED['r']}.")
    try:
        method = cfg.merge.reduction  # looked up and its options parsed here, once
    except DeploytkError as err:
        raise DeploytkError(f"invalid config {source}: {err.message}", hint=err.hint) from None
    export = cfg.export
    misplaced = [
        (key, kinds)
        for key, kinds, given in (
            ("feature_layer", DENSE_KINDS, export.feature_layer is not None),
            ("keep_prefix_tokens", ("tokens",), export.keep_prefix_tokens),
            ("token_map", ("tokens",), export.token_map),
        )
        if given and export.output not in kinds
    ]
    if misplaced:
        key, kinds = misplaced[0]
        current = export.output or "the model's own (logits or embedding)"
        raise DeploytkError(
            f"invalid config {source}: `export.{key}` is for `export.output: {' / '.join(kinds)}`, and the output is "
            f"{current}; it would do nothing.",
            hint=f"Set `export.output: {kinds[0]}` or remove `export.{key}`.",
        )
    if not method.uses_r and "r" in cfg.merge.model_fields_set:
        raise DeploytkError(
            f"invalid config {source}: method {method.name} does not use `merge.r` (its `merge.options` set the token counts: "
            f"{method.schedule_knobs or '`keep_rate` at `layers`'}); remove `merge.r`."
        )
    return cfg


def config_to_dict(cfg: DeployConfig) -> dict:
    """The resolved config as plain data that ``config_from_dict`` accepts again (for manifests)."""
    data = cfg.model_dump(mode="json")
    if not cfg.merge.reduction.uses_r:
        data["merge"].pop("r", None)
    return data


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping: plain YAML keeps the last silently, so a config
    with `r: 4` and, lines below, `r: 8` would export with 8 and nobody the wiser."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` may be overridden by the mapping's own keys
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class says what is wrong with it
                    continue
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key `{key}` (first given at line {first}); give each key once", key_node.start_mark
                    )
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def load_config(path: str | Path) -> DeployConfig:
    """Read and validate a YAML config (UTF-8 text; a key given twice in one mapping is refused). ``path`` may also be a
    ready-made config's name (``deit_small_tome_r16``) where no such file is in the working folder."""
    path = Path(path)
    problem = file_problem(path)
    if problem == "does not exist" and find_ready_made(path) is not None:
        path, problem = find_ready_made(path), None
    if problem:
        raise DeploytkError(
            f"config file {path} {problem}.",
            hint="Pass a YAML file, or a ready-made config's name such as deit_small_tome_r16 (`deploytk configs` lists them).",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DeploytkError(
            f"config {path} is not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start}); a config is a YAML text file.",
            hint="Pass a YAML file, or a ready-made config's name such as deit_small_tome_r16 (`deploytk configs` lists them).",
        ) from None
    except OSError as err:
        raise DeploytkError(f"config {path} cannot be read: {err.strerror or err}.") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise DeploytkError(f"config {path} is not valid YAML{where}: {problem}.") from None
    if data is None:  # an empty file, or comments only: not a silent "use every default"
        raise DeploytkError(
            f"config {path} is empty: it names no model or merge method.",
            hint="Write at least `model: <timm ViT name>` and `merge: {method: tome, r: 16}`; "
            f"the ready-made {DEFAULT_CONFIG.name} ({DEFAULT_CONFIG}) is a complete example.",
        )
    return _hf_folder_from_config_folder(_checkpoint_from_config_folder(config_from_dict(data, str(path)), path), path)


def _checkpoint_from_config_folder(cfg: DeployConfig, path: Path) -> DeployConfig:
    """A relative ``checkpoint`` in a config file names a file relative to that file's folder (so a config works from any
    working directory); it is made absolute here, once."""
    if not cfg.checkpoint or Path(cfg.checkpoint).expanduser().is_absolute():
        return cfg
    resolved = (path.parent / cfg.checkpoint).resolve()
    if not resolved.exists() and Path(cfg.checkpoint).exists():
        relative = os.path.relpath(Path(cfg.checkpoint).resolve(), path.parent.resolve())
        raise DeploytkError(
            f"config {path}: `checkpoint: {cfg.checkpoint}` is read relative to the config's folder ({resolved} does not "
            "exist); the file it meant is relative to the working directory.",
            hint=f"Write `checkpoint: {relative}` (or an absolute path).",
        )
    return cfg.model_copy(update={"checkpoint": str(resolved)})


def _hf_folder_from_config_folder(cfg: DeployConfig, path: Path) -> DeployConfig:
    """``model: hf:<relative folder>`` in a config file names a folder relative to that file's folder, like ``checkpoint``;
    it is made absolute here, so the manifest records where the weights are and the artifact works from any folder.
    A Hub id (``owner/name``) that is no folder there stays as it is."""
    if not cfg.model.startswith(HF_PREFIX):
        return cfg
    ref = cfg.model[len(HF_PREFIX) :]
    if not ref or Path(ref).expanduser().is_absolute():
        return cfg
    resolved = (path.parent / ref).resolve()
    if resolved.is_dir():
        return cfg.model_copy(update={"model": HF_PREFIX + str(resolved)})
    if Path(ref).is_dir():
        relative = os.path.relpath(Path(ref).resolve(), path.parent.resolve())
        raise DeploytkError(
            f"config {path}: `model: {cfg.model}` is read relative to the config's folder ({resolved} is not a folder); the "
            "folder it meant is relative to the working directory.",
            hint=f"Write `model: {HF_PREFIX}{relative}` (or an absolute path).",
        )
    return cfg


def absolute_hf_folder(model: str) -> str:
    """``hf:<folder>`` given on the command line (relative to the working folder) as an absolute ``hf:`` path; anything
    else as it is."""
    if model.startswith(HF_PREFIX) and Path(model[len(HF_PREFIX) :]).expanduser().is_dir():
        return HF_PREFIX + str(Path(model[len(HF_PREFIX) :]).expanduser().resolve())
    return model


def portable(data: dict, destination: Path) -> dict:
    """Config data about to be written to ``destination``: its checkpoint relative to that file's folder, as it is read."""
    checkpoint = data.get("checkpoint")
    if checkpoint and Path(checkpoint).is_absolute():
        data = {**data, "checkpoint": os.path.relpath(checkpoint, Path(destination).resolve().parent)}
    return data


#: a command-line override -> the export setting it lands in (``export.<name>``)
EXPORT_OVERRIDES = {"precision": "precision", "output_kind": "output", "img_size": "img_size", "feature_layer": "feature_layer"}


def apply_overrides(cfg: DeployConfig, **overrides) -> DeployConfig:
    """Apply CLI overrides (model, method, r, checkpoint, precision, output_kind, img_size, feature_layer) and re-validate."""
    data = cfg.model_dump(exclude_unset=True)  # unset stays unset (keep-rate methods reject an explicit r)
    for key, value in overrides.items():
        if value is None:
            continue
        if key in ("method", "r"):
            data.setdefault("merge", {})[key] = value
        elif key == "model":
            data[key] = absolute_hf_folder(value)
        elif key in EXPORT_OVERRIDES:
            data.setdefault("export", {})[EXPORT_OVERRIDES[key]] = parse_img_size(value) if key == "img_size" else value
        else:
            data[key] = value
    return config_from_dict(data, "(after command-line overrides)")


def parse_img_size(value):
    """`img_size` as the command line gives it: '224' (square) or '224,320' (H,W); anything else as it is."""
    if not isinstance(value, str):
        return value
    try:
        sides = [int(v) for v in value.split(",")]
    except ValueError:
        raise DeploytkError(f"`img_size={value!r}` is not an image size; allowed: one int (224) or H,W (224,320).") from None
    if len(sides) not in (1, 2):
        raise DeploytkError(f"`img_size={value!r}` has {len(sides)} sides; allowed: one int (224) or H,W (224,320).")
    return sides[0] if len(sides) == 1 else sides


def parse_r_option(text: str):
    """`r=SPEC` as text: '16', '8,8,4,...' (one per block) or '16:-1' (r:inflection)."""
    try:
        if ":" in text:
            r, inflection = text.split(":", 1)
            return {"r": int(r), "inflection": float(inflection)}
        if "," in text:
            return [int(v) for v in text.split(",") if v.strip()]
        return int(text)
    except ValueError:
        raise DeploytkError(
            f"`r={text!r}` is not a valid r spec; allowed: an int (16), one r per block (8,8,4,...) or r:inflection (16:-1)."
        ) from None


def load_config_with_overrides(path: str | Path, **overrides) -> DeployConfig:
    """A config file with command-line overrides (``r`` as text, as the CLI takes it) applied and validated."""
    cfg = load_config(path)
    if overrides.get("r") is not None:
        overrides["r"] = parse_r_option(overrides["r"])
    return apply_overrides(cfg, **overrides)
