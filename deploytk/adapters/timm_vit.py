"""The timm ``VisionTransformer`` family (vit_*, deit_*, deit3_*, the register and GAP variants, ...).

Pre-norm ``Block`` and post-norm ``ResPostBlock``, LayerScale, q/k norms, gated attention,
class / distillation / register tokens, and the token, average, max and avgmax pools; the
forward is timm's own, taken apart (``VisionTransformer.forward_features`` and
``forward_head``).
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import json
from copy import deepcopy
from pathlib import Path

import timm
import torch.nn.functional as F
from timm.data import create_transform, resolve_data_config
from timm.layers import Attention, AttentionPoolLatent
from timm.models import clean_state_dict
from timm.models.vision_transformer import Block, ResPostBlock, VisionTransformer, checkpoint_filter_fn
from torch import nn

try:  # timm's own record of what timm.create_model was given, for rebuilding the model (timm 1.0.2x on)
    from timm.models import get_model_args
except ImportError:  # an earlier timm 1.0: the arguments are read from the modules
    get_model_args = None

from deploytk.adapters.attention import attend, attention_probs
from deploytk.adapters.base import POOLS, BlockParts, ModelFamily, pool_tokens, register_family
from deploytk.adapters.preprocessing import from_torchvision, record_or_reason
from deploytk.errors import DeploytkError

_QKV = {"q": 0, "k": 1, "v": 2}


class TimmBlock(BlockParts):
    """A timm ``Block`` / ``ResPostBlock`` with a standard ``Attention``. Modules are looked up on every call, so that a
    precision cast that wraps the norms (``merging.precision``) is seen."""

    def __init__(self, blk: nn.Module):
        self.blk = blk
        self.post_norm = isinstance(blk, ResPostBlock)
        self.num_heads = int(blk.attn.num_heads)
        self.head_dim = int(blk.attn.head_dim)
        self.scale = blk.attn.scale

    def attn_input(self, x):
        return x if self.post_norm else self.blk.norm1(x)

    def qkv(self, h, which="qkv"):
        attn = self.blk.attn
        b, n, _ = h.shape
        if which == "qkv":  # timm's own projection, in one matmul
            heads = attn.qkv(h).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        else:  # only the rows asked for (MCTF computes q, k before its fusion and v after)
            c = attn.attn_dim
            lo, hi = _QKV[which[0]] * c, (_QKV[which[-1]] + 1) * c
            bias = attn.qkv.bias[lo:hi] if attn.qkv.bias is not None else None
            out = F.linear(h, attn.qkv.weight[lo:hi], bias)
            heads = out.reshape(b, n, len(which), attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        norms = {"q": attn.q_norm, "k": attn.k_norm, "v": None}
        return [norms[name](t) if norms[name] is not None else t for name, t in zip(which, heads, strict=True)]

    def gate(self, h):
        attn = self.blk.attn
        return attn.gate(h).sigmoid() if getattr(attn, "gate", None) is not None else None

    def attn_output(self, out, gate=None):
        attn = self.blk.attn
        b, _, n, _ = out.shape
        out = attn.norm(out.transpose(1, 2).reshape(b, n, attn.attn_dim))
        if gate is not None:
            out = out * gate
        return attn.proj_drop(attn.proj(out))

    def attn_residual(self, x, out):
        blk = self.blk
        return x + blk.drop_path1(blk.norm1(out) if self.post_norm else blk.ls1(out))

    def mlp_residual(self, x):
        blk = self.blk
        mlp_out = blk.norm2(blk.mlp(x)) if self.post_norm else blk.ls2(blk.mlp(blk.norm2(x)))
        return x + blk.drop_path2(mlp_out)


@register_family
class TimmViT(ModelFamily):
    name = "timm"
    takes_learned_reducers = True
    summary = "timm VisionTransformer (vit_*, deit_*, deit3_*, registers, GAP; pre- and post-norm blocks)"

    @classmethod
    def load(cls, name, *, img_size, model_kwargs, pretrained, checkpoint):
        """``timm.create_model`` with ``img_size`` and ``model_kwargs``; ``hf-hub:timm/...`` names take the architecture
        from the Hub repo. Offline, ``pretrained`` fails fast (huggingface_hub would retry for about a minute)."""
        hub = name.startswith("hf-hub:")  # timm's own syntax: the architecture and pretrained_cfg come from the Hub repo
        if not hub and not timm.is_model(name):
            close = difflib.get_close_matches(name, timm.list_models(), n=3)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise DeploytkError(f"unknown timm model {name!r} (`model`).{hint}")
        kwargs = dict(model_kwargs)
        if "img_size" in kwargs:
            raise DeploytkError("`model_kwargs.img_size` is not allowed: set `export.img_size` instead.")
        if img_size:
            kwargs["img_size"] = img_size
        offline = (pretrained or hub) and not hub_reachable()
        try:
            with _hub_offline(offline):
                model = timm.create_model(name, pretrained=pretrained, **kwargs)
        except TypeError as err:  # non-ViT models reject img_size; unknown model_kwargs land here too
            bad = [k for k in model_kwargs if k in str(err)]
            if bad:
                raise DeploytkError(f"timm model {name!r} does not accept `model_kwargs.{bad[0]}` ({err}).") from None
            if "img_size" in str(err):
                raise DeploytkError(
                    f"model {name!r} is not a timm VisionTransformer; deploytk supports the "
                    "VisionTransformer family (vit_*, deit_*, deit3_*, ...)."
                ) from None
            raise
        except Exception as err:
            if hub and not pretrained:
                why = "the Hugging Face Hub cannot be reached and the repo's config.json is not in the local cache" if offline else str(err)
                raise DeploytkError(
                    f"timm could not read the Hub repo of {name!r} (`model`): {why.rstrip('.')}.",
                    hint="Online once (or with the repo in the Hugging Face cache), or name the timm architecture itself "
                    "(`deit_small_patch16_224`) and pass its weights with `checkpoint:`.",
                ) from None
            if pretrained:
                why = (
                    "the Hugging Face Hub cannot be reached from this machine and they are not in the local cache"
                    if offline
                    else str(err).rstrip(".")
                )
                raise DeploytkError(
                    f"timm could not load pretrained weights for {name!r} (`pretrained: true`): {why}.",
                    hint="Offline, pass the weights with `checkpoint=` / `checkpoint:` instead of `pretrained: true`.",
                ) from None
            raise
        if not isinstance(model, VisionTransformer):
            raise DeploytkError(
                f"model {name!r} is a {type(model).__name__}, not a timm VisionTransformer; deploytk supports "
                "the VisionTransformer family (vit_*, deit_*, deit3_*, ...)."
            )
        _require_whole_patches(model, name, img_size)
        return model.eval()

    @classmethod
    def accepts(cls, model):
        return isinstance(model, VisionTransformer)

    def check(self):
        vit = self.model
        overridden = [  # timm's own subclasses (the distilled DeiT) are what this adapter is written for
            name
            for name in ("forward", "forward_features", "forward_head", "_pos_embed", "pool")
            if getattr(type(vit), name, None) is not getattr(VisionTransformer, name, None)
        ]
        if isinstance(vit, VisionTransformer) and overridden and not type(vit).__module__.startswith("timm."):
            raise DeploytkError(
                f"{type(vit).__qualname__} overrides VisionTransformer.{overridden[0]}; deploytk rebuilds timm's forward from "
                "the model's blocks, norms and head, so the subclass's own computation would not be what it exports.",
                hint="Export the VisionTransformer the subclass wraps, or a model whose forward is timm's.",
            )
        for i, blk in enumerate(vit.blocks):
            if type(blk) not in (Block, ResPostBlock):
                raise DeploytkError(
                    f"block {i} is a {type(blk).__name__}; deploytk supports timm's Block and ResPostBlock "
                    "(parallel blocks are not supported)."
                )
            if type(blk.attn) is not Attention:
                raise DeploytkError(f"block {i} uses {type(blk.attn).__name__}; deploytk supports timm's standard Attention.")
        pool = getattr(vit, "attn_pool", None)
        if pool is not None:
            if type(pool) is not AttentionPoolLatent or pool.pos_embed is not None or pool.pool not in ("token", "avg"):
                raise DeploytkError(
                    f"global_pool={vit.global_pool!r} with {type(pool).__name__} (pos_embed={pool.pos_embed is not None}, "
                    f"pool={getattr(pool, 'pool', None)!r}) is not supported: deploytk runs timm's AttentionPoolLatent without a "
                    "position embedding of its own (SigLIP's `map` head), pooled by its first latent or their mean."
                )
        elif vit.global_pool not in POOLS:
            raise DeploytkError(f"global_pool={vit.global_pool!r} is not supported; allowed: token, avg, avgmax, max, map, ''.")
        if getattr(vit, "dynamic_img_size", False):
            raise DeploytkError("dynamic_img_size=True models are not supported: export needs a fixed image size.")
        self.blocks = [TimmBlock(b) for b in vit.blocks]
        self.num_prefix_tokens = int(vit.num_prefix_tokens)
        self.has_class_token = getattr(vit, "cls_token", None) is not None
        self.has_dist_token = getattr(vit, "dist_token", None) is not None
        self.grid_size = tuple(int(v) for v in vit.patch_embed.grid_size)
        img = vit.patch_embed.img_size
        self.img_size = (int(img), int(img)) if isinstance(img, int) else (int(img[0]), int(img[1]))
        self.embed_dim = int(vit.embed_dim)
        self.mlp_dim = int(vit.blocks[0].mlp.fc1.out_features)
        self.pool = "attention" if pool is not None else vit.global_pool
        self.num_classes = int(vit.num_classes)
        self.num_features = int(vit.num_features)
        self.architecture = (getattr(vit, "pretrained_cfg", None) or {}).get("architecture", type(vit).__name__)

    def embed(self, images):
        vit = self.model
        return vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(images))))

    def final_norm(self, x):
        return self.model.norm(x)

    def head(self, x, size):
        vit = self.model
        if self.has_dist_token:  # distilled DeiT: average both heads
            return (vit.head(vit.head_drop(x[:, 0])) + vit.head_dist(vit.head_drop(x[:, 1]))) / 2
        return vit.head(vit.head_drop(self.pre_logits(x, size)))

    def pre_logits(self, x, size):
        """timm's ``forward_head(pre_logits=True)``: the pool and ``fc_norm`` (a distilled DeiT: both tokens averaged)."""
        vit = self.model
        if self.has_dist_token:
            return (x[:, 0] + x[:, 1]) / 2
        skip = 0 if vit.pool_include_prefix else self.num_prefix_tokens
        pooled = self._attention_pool(x[:, skip:], size[:, skip:]) if self.pool == "attention" else pool_tokens(x, size, self.pool, skip)
        return vit.fc_norm(pooled)

    def _attention_pool(self, x, size):
        """timm's AttentionPoolLatent (SigLIP's `map` head) with log(size) on its latent queries' logits: over merged
        tokens the latents attend proportionally, as the blocks do (plain ops, fp32 softmax)."""
        pool = self.model.attn_pool
        b, n, _ = x.shape
        latents = pool.latent.expand(b, -1, -1)
        q = pool.q(latents).reshape(b, pool.latent_len, pool.num_heads, pool.head_dim).transpose(1, 2)
        k, v = pool.kv(x).reshape(b, n, 2, pool.num_heads, pool.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = pool.q_norm(q), pool.k_norm(k)
        out = attend(attention_probs(pool.scale, q, k, size), v).transpose(1, 2).reshape(b, pool.latent_len, -1)
        out = pool.proj_drop(pool.proj(out))
        if pool.mlp is not None:
            out = out + pool.mlp(pool.norm(out))
        return out[:, 0] if pool.pool == "token" else out.mean(1)

    def block_path(self, i):
        return f"blocks.{i}"

    def patch_embedding_path(self):
        return "patch_embed"

    def eval_transform(self):
        """timm's eval transform (``resolve_data_config`` + ``create_transform``) at the model's own input size: a model
        built with another ``img_size`` keeps its pretrained_cfg's 224, which would not fit it. Resize ratio (crop_pct),
        interpolation, mean and std stay timm's."""
        return create_transform(**resolve_data_config({"input_size": self.input_kind.shape}, model=self.model))

    def preprocess_record(self):
        return record_or_reason(lambda: from_torchvision(self.eval_transform(), "timm.data.create_transform"))

    def normalization(self):
        data = resolve_data_config({}, model=self.model)
        return tuple(data["mean"]), tuple(data["std"])

    def convert_checkpoint(self, state):
        """timm's own conversion for ViT checkpoints, as ``timm.create_model(..., pretrained=True)`` applies it:
        ``module.`` prefixes removed (``clean_state_dict``), then ``checkpoint_filter_fn``: OpenAI / OpenCLIP CLIP,
        original DINOv2 and other layouts mapped to timm's keys, the position embedding resampled to this model's grid
        (bicubic, antialiased) and the patch embedding to its patch size."""
        try:
            return checkpoint_filter_fn(clean_state_dict(state), self.model)
        except Exception as err:
            first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
            raise DeploytkError(
                f"timm's checkpoint conversion for {self.architecture} failed on this checkpoint ({type(err).__name__}: {first})."
            ) from None

    def read_checkpoint(self, path):
        """Google's JAX/Flax ``.npz`` checkpoints (AugReg, big_vision) through timm's own reader (``load_pretrained``,
        which also resamples the position embedding), into a copy of this model; its state dict then loads strictly."""
        if path.suffix != ".npz":
            return None
        copy = deepcopy(self.model)
        try:
            copy.load_pretrained(str(path))
        except Exception as err:
            first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
            raise DeploytkError(
                f"checkpoint {path} could not be read as a JAX/Flax ViT checkpoint by timm ({type(err).__name__}: {first}).",
                hint="A .npz must hold a Google ViT checkpoint (keys such as embedding/kernel, Transformer/encoderblock_0/...) "
                f"of the architecture {self.architecture}.",
            ) from None
        heads = self._npz_head_sizes(path)
        if self.num_classes and self.num_classes not in heads:  # timm's reader then leaves the random head in place
            found = f"a head of {heads[0]} classes" if heads else "no classifier head"
            raise DeploytkError(
                f"checkpoint {path} has {found}, and {self.architecture} here has {self.num_classes} classes: timm's .npz reader "
                "would keep the randomly initialised head.",
                hint="Set `model_kwargs: {num_classes: "
                + (f"{heads[0]}" if heads else "0")
                + "}`"
                + ("" if heads else " (the backbone's pooled features)")
                + ".",
            )
        return copy.state_dict()

    @staticmethod
    def _npz_head_sizes(path) -> list[int]:
        """The class counts of the classifier heads (``.../head/bias``) in a JAX .npz."""
        import numpy as np

        with np.load(path) as w:
            return [int(w[k].shape[-1]) for k in w.files if k.endswith("head/bias")]

    def reads_natively(self, path) -> bool:
        return path.suffix == ".npz"

    def plain(self):
        return self.model

    def save_source(self, folder):
        """The weights as model.safetensors and timm's recipe: the architecture its ``pretrained_cfg`` names and the
        constructor arguments that rebuild the object (``constructor_arguments``; the image size travels as
        ``export.img_size``)."""
        reason = timm_rebuild_problem(self.model)
        if reason:
            return reason
        vit = self.model
        kwargs = constructor_arguments(vit)
        for key, value in kwargs.items():
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                return (
                    f"its constructor argument {key}={value!r} is not a plain value, so deploytk cannot store it for another "
                    "process (timm also takes a layer by name, such as act_layer='gelu' or norm_layer='layernorm')"
                )
        save_state(vit, folder)
        return {"model": vit.pretrained_cfg["architecture"], "model_kwargs": kwargs, "checkpoint": STATE_FILE}


#: the weights of a stored model object (``save_source``)
STATE_FILE = "model.safetensors"


def timm_rebuild_problem(model: nn.Module) -> str | None:
    """Why ``timm.create_model`` cannot rebuild ``model`` by name (None: it can): a class of the caller's own, or an
    object built without timm's registry (no ``pretrained_cfg`` naming an architecture)."""
    cls = type(model)
    arch = (getattr(model, "pretrained_cfg", None) or {}).get("architecture")
    if not cls.__module__.startswith("timm."):
        return f"its class {cls.__module__}.{cls.__qualname__} is not one timm builds by name"
    if not arch or not timm.is_model(arch):
        return "it was not made by timm.create_model (its pretrained_cfg names no timm architecture)"
    return None


def constructor_arguments(vit: VisionTransformer) -> dict:
    """The arguments that rebuild ``vit`` as ``timm.create_model(architecture, **arguments)``, without ``img_size`` (it
    travels as ``export.img_size``). Where timm recorded them (``timm.create_model`` keeps what it was given, and
    ``reset_classifier`` what it changed: ``timm.models.get_model_args``, with the head's current classes and pooling),
    timm's record; else they are read from the modules (``_arguments_of_modules``). The rebuild is checked against the
    object, so one missed is reported at export, never exported wrong."""
    if get_model_args is not None and hasattr(vit, "_model_args"):
        found = dict(get_model_args(vit))
    else:
        found = _arguments_of_modules(vit)
    found.pop("img_size", None)
    return found


def _arguments_of_modules(vit: VisionTransformer) -> dict:
    """The ``VisionTransformer`` arguments that shape ``vit``'s weights and forward, read from its modules (a model timm
    kept no record of: one made by calling the architecture's function, or by an earlier timm). timm builds ``norm`` after
    the blocks only when ``final_norm`` and not ``fc_norm``, and ``fc_norm`` after the pool only when both: an average-pooled
    model has ``final_norm=True, fc_norm=True``."""
    blk = vit.blocks[0]
    norm, fc_norm = not isinstance(vit.norm, nn.Identity), not isinstance(vit.fc_norm, nn.Identity)
    found = {
        "num_classes": int(vit.num_classes),
        "global_pool": vit.global_pool,
        "patch_size": int(vit.patch_embed.patch_size[0]),
        "in_chans": int(vit.patch_embed.proj.in_channels),
        "embed_dim": int(vit.embed_dim),
        "depth": len(vit.blocks),
        "num_heads": int(blk.attn.num_heads),
        "mlp_ratio": blk.mlp.fc1.out_features / vit.embed_dim,
        "qkv_bias": blk.attn.qkv.bias is not None,
        "qk_norm": not isinstance(blk.attn.q_norm, nn.Identity),
        "proj_bias": blk.attn.proj.bias is not None,
        "scale_attn_norm": not isinstance(blk.attn.norm, nn.Identity),
        "scale_mlp_norm": not isinstance(getattr(blk.mlp, "norm", nn.Identity()), nn.Identity),
        "class_token": getattr(vit, "cls_token", None) is not None,
        "reg_tokens": int(getattr(vit, "num_reg_tokens", 0)),
        "no_embed_class": bool(vit.no_embed_class),
        "pos_embed": "learn" if getattr(vit, "pos_embed", None) is not None else "none",
        "pool_include_prefix": bool(getattr(vit, "pool_include_prefix", False)),
        "pre_norm": not isinstance(vit.norm_pre, nn.Identity),
        "final_norm": norm or fc_norm,
        "fc_norm": fc_norm,
    }
    if not isinstance(blk.ls1, nn.Identity):
        found["init_values"] = 1e-5  # LayerScale exists; its values come with the weights
    accepted = inspect.signature(VisionTransformer.__init__).parameters
    return {k: v for k, v in found.items() if k in accepted}


def save_state(model: nn.Module, folder) -> None:
    """``model``'s state dict as ``folder``/model.safetensors (tensors copied apart: safetensors refuses shared ones)."""
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}, str(Path(folder) / STATE_FILE))


def _require_whole_patches(model: VisionTransformer, name: str, img_size) -> None:
    """timm's patch embedding is a Conv2d with stride = patch size and no padding: an image size that is not a multiple
    of it loses its last rows and columns without a word, so it is refused here."""
    patch = tuple(int(p) for p in model.patch_embed.patch_size)
    size = tuple(int(v) for v in model.patch_embed.img_size)
    if all(v % p == 0 for v, p in zip(size, patch, strict=True)):
        return
    lost = max(v % p for v, p in zip(size, patch, strict=True))
    p = max(patch)
    value = img_size if isinstance(img_size, int) else list(size)
    side = next(v for v, q in zip(size, patch, strict=True) if v % q)
    near = sorted({side // p * p, -(-side // p) * p} - {0})
    raise DeploytkError(
        f"`export.img_size` = {value} is not a multiple of {name}'s patch size {p}: timm's patch embedding (a Conv2d "
        f"with stride {p}, no padding) would drop the last {lost} pixel rows and columns of every image without a word.",
        hint=f"Use {' or '.join(map(str, near))}" + (" for that side." if not isinstance(value, int) else "."),
    )


def hub_reachable(timeout_s: float = 3.0) -> bool:
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
