"""Build the model a config names, with its weights, and the merged reference from it.

The model's family builds it (``ModelFamily.load``: timm's ``create_model``, a transformers folder or Hub id);
weights then come from ``checkpoint`` (.safetensors, a .pth/.pt/.bin state_dict read with ``weights_only=True``,
or a format the family's own library reads: timm's JAX ``.npz``), from the family's own download
(``pretrained: true``, online only) or random initialisation (seeded, so every command rebuilds the same model).
"""

from __future__ import annotations

import copy
import uuid
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from deploytk.adapters import ModelFamily, adapt, family_named
from deploytk.config import DeployConfig
from deploytk.errors import DeploytkError, file_problem
from deploytk.merging.merged_vit import MergedViT, build_merged
from deploytk.reducers import METHODS

RANDOM_INIT_SEED = 0
#: ``model: memory:<id>``: a model object handed to the Python API, held by this process (``hold``)
MEMORY_PREFIX = "memory:"
#: the objects ``hold`` keeps, by name: each is a copy, so nothing the caller does to their model changes the reference
_HELD: dict[str, nn.Module] = {}


def hold(model: nn.Module) -> str:
    """Keep ``model`` (already a copy) for this process under a new ``memory:`` name that a config's ``model`` can give."""
    name = f"{MEMORY_PREFIX}{type(model).__name__}-{uuid.uuid4().hex[:12]}"
    _HELD[name] = model
    return name


def is_held(name: str) -> bool:
    return name in _HELD


def _held_copy(cfg: DeployConfig) -> nn.Module:
    model = _HELD.get(cfg.model)
    if model is None:
        raise DeploytkError(
            f"`model: {cfg.model}` names a Python model object that another process held; it cannot be rebuilt here.",
            hint="Pass the model object to deploytk in the process that holds it, or name a model deploytk can build "
            "(a timm name, hf:<folder>).",
        )
    return copy.deepcopy(model).eval()  # every reference gets its own: casting to a precision changes a model in place


def create_vit(cfg: DeployConfig) -> nn.Module:
    """The plain model with the config's weights, in eval mode: built by the family its name names (timm's, or one named
    by prefix such as ``hf:``), then the ``checkpoint`` file loaded into it."""
    if cfg.model.startswith(MEMORY_PREFIX):
        model = _held_copy(cfg)
        if cfg.checkpoint:
            load_checkpoint(model, Path(cfg.checkpoint), cfg.merge.reduction.checkpoint_prefix)
        return model
    family = family_named(cfg.model)
    torch.manual_seed(RANDOM_INIT_SEED)
    model = family.load(
        cfg.model,
        img_size=cfg.export.img_size if isinstance(cfg.export.img_size, int) else cfg.export.hw,
        model_kwargs=dict(cfg.model_kwargs),
        pretrained=cfg.pretrained,
        checkpoint=cfg.checkpoint,
    )
    if cfg.checkpoint:
        load_checkpoint(model, Path(cfg.checkpoint), cfg.merge.reduction.checkpoint_prefix)
    return model.eval()


def create_model(cfg: DeployConfig) -> ModelFamily:
    """The config's model with its weights, seen through its family's adapter."""
    return adapt(create_vit(cfg))


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    problem = file_problem(path, "a weights file")
    if problem:
        raise DeploytkError(f"checkpoint {path} {problem} (`checkpoint` / `checkpoint=`).")
    try:
        if path.suffix == ".safetensors":
            state = load_file(str(path), device="cpu")
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise DeploytkError(
            f"checkpoint {path} could not be read ({type(err).__name__}: {str(err).splitlines()[0][:200]}).",
            hint="Expected a .safetensors file, a torch state_dict saved with torch.save (loaded with weights_only=True) "
            "or, for a timm ViT, a Google JAX/Flax .npz.",
        ) from None
    for key in ("model", "state_dict", "model_ema"):
        if isinstance(state, dict) and key in state and isinstance(state[key], dict):
            state = state[key]
            break
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise DeploytkError(f"checkpoint {path} does not hold a state_dict (a mapping of parameter names to tensors).")
    return state


def split_checkpoint(state: dict[str, torch.Tensor], prefix: str | None) -> tuple[dict, dict]:
    """(the timm ViT's keys, a learned method's keys under ``prefix.``); both keep their names."""
    if not prefix:
        return state, {}
    mine = {k: v for k, v in state.items() if k.startswith(prefix + ".")}
    return {k: v for k, v in state.items() if k not in mine}, mine


def load_checkpoint(model: nn.Module, path: Path, skip_prefix: str | None = None) -> None:
    """Load a checkpoint's timm keys strictly (``skip_prefix.*`` belongs to a learned method)."""
    family = adapt(model)
    native = family.read_checkpoint(path) if path.is_file() and family.reads_natively(path) else None
    state = native if native is not None else family.convert_checkpoint(split_checkpoint(read_state_dict(path), skip_prefix)[0])
    learned_by: dict[str, list[str]] = {}  # checkpoint prefix -> the learned methods that save their layers there
    for m in METHODS.values():
        if m.checkpoint_prefix:
            learned_by.setdefault(m.checkpoint_prefix, []).append(m.name)
    found = sorted({p for p in learned_by if any(k.startswith(p + ".") for k in state)})
    hint = None
    if found:
        hint = (
            f"The checkpoint carries `{found[0]}.*`, the trained layers of a learned reducer "
            f"({', '.join(learned_by[found[0]])}): set `merge.method` to the one it was fine-tuned with."
        )
    load_strict(model, state, path, hint)


def load_strict(model: nn.Module, state: dict[str, torch.Tensor], path: Path, hint: str | None = None) -> None:
    """Load ``state`` into ``model`` strictly, naming any missing/unexpected/mis-shaped parameter."""
    own = model.state_dict()
    mismatched = [(k, tuple(state[k].shape), tuple(v.shape)) for k, v in own.items() if k in state and state[k].shape != v.shape]
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    problems = []
    if mismatched:
        k, got, want = mismatched[0]
        more = f" (and {len(mismatched) - 1} more)" if len(mismatched) > 1 else ""
        problems.append(f"parameter {k!r} has shape {list(got)} in the checkpoint but {list(want)} in the model{more}")
    if missing:
        problems.append(f"{len(missing)} parameter(s) missing from the checkpoint, e.g. {missing[:3]}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected parameter(s), e.g. {unexpected[:3]}")
    if problems:
        raise DeploytkError(
            f"checkpoint {path} does not match model {type(model).__name__}: " + "; ".join(problems) + ".",
            hint=hint or "Check that `model` names the architecture the checkpoint was trained with (and its img_size).",
        )
    model.load_state_dict(state, strict=True)


def build_reference(cfg: DeployConfig, vit: nn.Module | None = None) -> MergedViT:
    """The merged PyTorch reference for a config (the ground truth for every backend).

    A learned method's layers load from the checkpoint's keys under its ``checkpoint_prefix``
    (the official model class's layout); without a checkpoint they are seeded random.
    """
    method = cfg.merge.reduction
    vit = vit if vit is not None else create_vit(cfg)
    torch.manual_seed(RANDOM_INIT_SEED + 1)  # the learned layers' random init, whatever built the ViT
    merged = build_merged(method, vit, cfg.r_spec(), cfg.merge.prop_attn, cfg.merge.parsed_options, cfg.export.output_spec())
    if cfg.checkpoint and method.checkpoint_prefix:
        path = Path(cfg.checkpoint)
        native = merged.family.reads_natively(path)  # a family's own format (timm's .npz) holds no reducer's layers
        learned = {} if native else split_checkpoint(read_state_dict(path), method.checkpoint_prefix)[1]
        if learned or len(merged.reduction.state_dict()):
            load_strict(
                merged.reduction,
                learned,
                path,
                hint=f"Method {method.name} loads its trained layers from the checkpoint keys `{method.checkpoint_prefix}.*`, as "
                "the official TokenReduction model class saves them, for the configured `merge.options` (`layers` and "
                "`keep_rate` set their number and shapes"
                + (f"; they exist only with `{method.learned_when}`" if method.learned_when else "")
                + "). A checkpoint without them was not fine-tuned with this method.",
            )
    return merged.eval()
