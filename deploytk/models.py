"""Build the timm model a config names, with its weights, and the merged reference from it.

Weights come from ``checkpoint`` (.safetensors, a .pth/.pt/.bin state_dict read with ``weights_only=True``,
or a format the family's own library reads: timm's JAX ``.npz``), from timm's own download (``pretrained: true``, online only) or
random initialisation (seeded, so every command rebuilds the same model).
"""

from __future__ import annotations

import contextlib
import difflib
from pathlib import Path

import timm
import torch
from safetensors.torch import load_file
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from deploytk.config import DeployConfig
from deploytk.errors import DeploytkError
from deploytk.families import ModelFamily, adapt, family_named
from deploytk.merging.merged_vit import MergedViT, build_merged
from deploytk.methods import METHODS

RANDOM_INIT_SEED = 0


def create_vit(cfg: DeployConfig) -> nn.Module:
    """The plain model with the config's weights, in eval mode: a timm model, or one of a family named by prefix (``hf:``)."""
    family = family_named(cfg.model)
    if family is not None:
        return _create_named(cfg, family)
    hub = cfg.model.startswith("hf-hub:")  # timm's own syntax: the architecture and pretrained_cfg come from the Hub repo
    if not hub and not timm.is_model(cfg.model):
        close = difflib.get_close_matches(cfg.model, timm.list_models(), n=3)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise DeploytkError(f"unknown timm model {cfg.model!r} (`model`).{hint}")
    kwargs = dict(cfg.model_kwargs)
    if "img_size" in kwargs:
        raise DeploytkError("`model_kwargs.img_size` is not allowed: set `export.img_size` instead.")
    if cfg.export.img_size:
        kwargs["img_size"] = cfg.export.img_size if isinstance(cfg.export.img_size, int) else cfg.export.hw
    torch.manual_seed(RANDOM_INIT_SEED)
    offline = (cfg.pretrained or hub) and not _hub_reachable()
    try:
        with _hub_offline(offline):
            model = timm.create_model(cfg.model, pretrained=cfg.pretrained, **kwargs)
    except TypeError as err:  # non-ViT models reject img_size; unknown model_kwargs land here too
        bad = [k for k in cfg.model_kwargs if k in str(err)]
        if bad:
            raise DeploytkError(f"timm model {cfg.model!r} does not accept `model_kwargs.{bad[0]}` ({err}).") from None
        if "img_size" in str(err):
            raise DeploytkError(
                f"model {cfg.model!r} is not a timm VisionTransformer; deploytk supports the "
                "VisionTransformer family (vit_*, deit_*, deit3_*, ...)."
            ) from None
        raise
    except Exception as err:
        if hub and not cfg.pretrained:
            why = "the Hugging Face Hub cannot be reached and the repo's config.json is not in the local cache" if offline else str(err)
            raise DeploytkError(
                f"timm could not read the Hub repo of {cfg.model!r} (`model`): {why.rstrip('.')}.",
                hint="Online once (or with the repo in the Hugging Face cache), or name the timm architecture itself "
                "(`deit_small_patch16_224`) and pass its weights with `checkpoint:`.",
            ) from None
        if cfg.pretrained:
            why = (
                "the Hugging Face Hub cannot be reached from this machine and they are not in the local cache"
                if offline
                else str(err).rstrip(".")
            )
            raise DeploytkError(
                f"timm could not load pretrained weights for {cfg.model!r} (`pretrained: true`): {why}.",
                hint="Offline, pass the weights with --checkpoint / `checkpoint:` instead of `pretrained: true`.",
            ) from None
        raise
    if not isinstance(model, VisionTransformer):
        raise DeploytkError(
            f"model {cfg.model!r} is a {type(model).__name__}, not a timm VisionTransformer; deploytk supports "
            "the VisionTransformer family (vit_*, deit_*, deit3_*, ...)."
        )
    _require_whole_patches(model, cfg)
    if cfg.checkpoint:
        load_checkpoint(model, Path(cfg.checkpoint), cfg.merge.reduction.checkpoint_prefix)
    return model.eval()


def create_model(cfg: DeployConfig) -> ModelFamily:
    """The config's model with its weights, seen through its family's adapter."""
    return adapt(create_vit(cfg))


def _create_named(cfg: DeployConfig, family: type[ModelFamily]) -> nn.Module:
    """A model its family loads whole (a transformers folder or Hub id holds the architecture and the weights)."""
    if cfg.model_kwargs:
        raise DeploytkError(
            f"`model_kwargs` ({', '.join(cfg.model_kwargs)}) are for timm models; {cfg.model} is built from its own config.json."
        )
    if cfg.checkpoint:
        raise DeploytkError(
            f"`checkpoint` is for timm models; {cfg.model} loads its weights from its own folder (model.safetensors).",
            hint="Save the fine-tuned model with save_pretrained and point `model: hf:<that folder>` at it.",
        )
    torch.manual_seed(RANDOM_INIT_SEED)
    model = family.load(cfg.model)
    size = adapt(model).img_size
    if cfg.export.hw and cfg.export.hw != size:
        raise DeploytkError(
            f"`export.img_size` = {cfg.export.img_size}, but {cfg.model} is built for {size[0]}x{size[1]} (its config.json's "
            "image_size); deploytk does not resample a transformers model's position embedding.",
            hint=f"Set `export.img_size: {size[0]}` or `export.img_size: null` (the model's own size).",
        )
    return model


def _require_whole_patches(model: VisionTransformer, cfg: DeployConfig) -> None:
    """timm's patch embedding is a Conv2d with stride = patch size and no padding: an image size that is not a multiple
    of it loses its last rows and columns without a word, so it is refused here."""
    patch = tuple(int(p) for p in model.patch_embed.patch_size)
    size = tuple(int(v) for v in model.patch_embed.img_size)
    if all(v % p == 0 for v, p in zip(size, patch, strict=True)):
        return
    lost = max(v % p for v, p in zip(size, patch, strict=True))
    p = max(patch)
    value = cfg.export.img_size if isinstance(cfg.export.img_size, int) else list(size)
    side = next(v for v, q in zip(size, patch, strict=True) if v % q)
    near = sorted({side // p * p, -(-side // p) * p} - {0})
    raise DeploytkError(
        f"`export.img_size` = {value} is not a multiple of {cfg.model}'s patch size {p}: timm's patch embedding (a Conv2d "
        f"with stride {p}, no padding) would drop the last {lost} pixel rows and columns of every image without a word.",
        hint=f"Use {' or '.join(map(str, near))}" + (" for that side." if not isinstance(value, int) else "."),
    )


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the Hugging Face Hub answers a TCP connection within ``timeout_s`` (or a proxy is configured, which may
    reach it). Offline, huggingface_hub retries with back-off for about a minute before it gives up."""
    import os
    import socket
    import threading
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # offline already, or the proxy decides
    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    answered = []

    def probe():  # in a thread: name resolution has no timeout of its own
        try:
            socket.create_connection((host, 443), timeout=timeout_s).close()
            answered.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return bool(answered)


@contextlib.contextmanager
def _hub_offline(offline: bool):
    """huggingface_hub's offline mode while timm loads (the local cache still serves), if ``offline``."""
    if not offline:
        yield
        return
    from huggingface_hub import constants

    saved, constants.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE, True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise DeploytkError(f"checkpoint {path} does not exist (`checkpoint` / --checkpoint).")
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
    native = family.read_checkpoint(path) if path.is_file() else None
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
        learned = split_checkpoint(read_state_dict(path), method.checkpoint_prefix)[1]
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
