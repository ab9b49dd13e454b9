"""What the Hugging Face transformers families share: their encoder layer taken apart, and loading ``hf:`` models.

Every vision encoder layer in transformers 5 has separate ``q_proj`` / ``k_proj`` / ``v_proj``
projections and an output projection, two pre-norms, an MLP and (DINOv2) LayerScale; only the
attribute names differ, so one ``HFBlock`` serves them all with the names its family gives.
transformers is an optional dependency (``deploytk[hf]``): nothing here imports it at module
level, and a family recognises its models by their class's module path.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from torch import nn

from deploytk.adapters.base import BlockParts, ModelFamily, adapt
from deploytk.adapters.preprocessing import from_torchvision, record_or_reason
from deploytk.errors import DeploytkError
from deploytk.inputs import InputKind, VideoInput

#: a config's ``model:`` that names a transformers model: ``hf:<hub id or save_pretrained folder>``
HF_PREFIX = "hf:"


class HFBlock(BlockParts):
    """A transformers encoder layer: ``x + ls1(attn(norm1(x)))`` then ``x + ls2(mlp(norm2(x)))`` (pre-norm)."""

    def __init__(self, layer: nn.Module, attn: str, norms: tuple[str, str], out: str, scales: tuple[str, str] | None = None):
        self.layer, self._attn, self._norms, self._out, self._scales = layer, attn, norms, out, scales
        module = getattr(layer, attn)
        if not all(hasattr(module, p) for p in ("q_proj", "k_proj", "v_proj")):
            import transformers  # optional: deploytk[hf]; loaded already if a model of it is here

            raise DeploytkError(
                f"{type(module).__name__} of transformers {transformers.__version__} has no separate q_proj / k_proj / v_proj; "
                "deploytk's transformers families are written against transformers 5 (5.24 and later).",
                hint="pip install 'deploytk[hf]'",
            )
        self.num_heads = int(getattr(module, "num_heads", None) or module.num_attention_heads)
        self.head_dim = int(module.head_dim)
        self.scale = float(getattr(module, "scaling", None) or module.scale)

    def _norm(self, which: int):
        return getattr(self.layer, self._norms[which])

    def _scaled(self, which: int, y):
        return getattr(self.layer, self._scales[which])(y) if self._scales else y

    def attn_input(self, x):
        return self._norm(0)(x)

    def qkv(self, h, which="qkv"):
        attn = getattr(self.layer, self._attn)
        b, n, _ = h.shape
        projections = {"q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj}
        return [projections[name](h).view(b, n, self.num_heads, self.head_dim).transpose(1, 2) for name in which]

    def attn_output(self, out, gate=None):
        b, _, n, _ = out.shape
        return getattr(getattr(self.layer, self._attn), self._out)(out.transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim))

    def attn_residual(self, x, out):
        return x + self._scaled(0, out)

    def mlp_residual(self, x):
        return x + self._scaled(1, self.layer.mlp(self._norm(1)(x)))


def image_grid(config) -> tuple[tuple[int, int], tuple[int, int]]:
    """(img_size, grid_size) as (H, W) pairs from a transformers vision config, whose image_size and patch_size are an int
    or a pair."""

    def pair(v) -> tuple[int, int]:
        return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))

    size, patch = pair(config.image_size), pair(config.patch_size)
    return size, (size[0] // patch[0], size[1] // patch[1])


class HFFamily(ModelFamily):
    """A transformers vision family: recognised by its classes' names in ``modules`` (``transformers.models.<module>.``)."""

    #: transformers model modules (``vit``, ``deit``) and the classes of them this family runs
    modules: ClassVar[tuple[str, ...]] = ()
    classes: ClassVar[tuple[str, ...]] = ()
    prefix = HF_PREFIX

    @classmethod
    def load(cls, name, *, img_size, model_kwargs, pretrained, checkpoint):
        """A transformers folder or Hub id holds the architecture (config.json) and the weights: ``model_kwargs`` and a
        separate ``checkpoint`` are refused, and so is an image size other than the config's (the position embedding is
        not resampled)."""
        if model_kwargs:
            raise DeploytkError(
                f"`model_kwargs` ({', '.join(model_kwargs)}) are for timm models; {name} is built from its own config.json."
            )
        if checkpoint:
            raise DeploytkError(
                f"`checkpoint` is for timm models; {name} loads its weights from its own folder (model.safetensors).",
                hint="Save the fine-tuned model with save_pretrained and point `model: hf:<that folder>` at it.",
            )
        model = load_hf(name)
        family = adapt(model)  # the family of the class config.json names (every transformers family shares the prefix)
        want = None if img_size is None else (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        if want and want != family.img_size:
            family.refuse_img_size(name, img_size)
        return model

    def refuse_img_size(self, name: str, img_size) -> None:
        """Refuse an ``export.img_size`` other than the model's own (``load``)."""
        size, shown = self.img_size, img_size if isinstance(img_size, int) else list(img_size)
        raise DeploytkError(
            f"`export.img_size` = {shown}, but {name} is built for {size[0]}x{size[1]} (its config.json's image_size); "
            "deploytk does not resample a transformers model's position embedding.",
            hint=f"Set `export.img_size: {size[0]}` or `export.img_size: null` (the model's own size).",
        )

    @classmethod
    def accepts(cls, model):
        module = type(model).__module__
        return any(module.startswith(f"transformers.models.{m}.") for m in cls.modules) and type(model).__name__ in cls.classes

    def as_loaded(self):
        """``load_hf`` builds with ``attn_implementation="eager"``; an object the caller built may use SDPA."""
        self.model.set_attn_implementation("eager")

    def save_source(self, folder):
        """``save_pretrained`` (config.json + model.safetensors): transformers rebuilds the class its config names."""
        self.model.save_pretrained(str(folder), safe_serialization=True)
        return {"model": HF_PREFIX + "{folder}", "model_kwargs": {}, "checkpoint": None}

    def image_processor_settings(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(mean, std) the family's image processor normalises with (transformers' defaults for the class)."""
        raise NotImplementedError

    def eval_transform(self):
        """The model's own image processor (``preprocessor_config.json`` in its folder or Hub repo, through
        ``AutoImageProcessor``) when it has one; otherwise a resize to ``img_size`` with the family's default mean/std."""
        processor = self._image_processor()
        if processor is not None:
            return lambda image: processor(images=image, return_tensors="pt")["pixel_values"][0]
        from torchvision import transforms  # torchvision comes with timm

        mean, std = self.image_processor_settings()
        return transforms.Compose(
            [
                transforms.Resize(self.img_size, interpolation=transforms.InterpolationMode.BICUBIC),
                transforms.ToTensor(),
                transforms.Normalize(mean, std),
            ]
        )

    def preprocess_record(self):
        if self.input_kind.kind != "image":  # a clip's frame sampling, a sound's filterbank: not recorded yet
            return super().preprocess_record()
        processor = self._image_processor()
        if processor is not None:  # deploytk.adapters.preprocessing says why
            return {
                "kind": None,
                "reason": f"not recorded: {type(processor).__name__} (the model's saved image processor) "
                "resizes with torchvision's tensor kernels, which deploytk's Pillow pipeline does not reproduce exactly",
            }
        return record_or_reason(lambda: from_torchvision(self.eval_transform(), f"the {self.name} family's default"))

    def normalization(self):
        processor = self._image_processor()
        if processor is not None and getattr(processor, "image_mean", None) is not None:
            return tuple(processor.image_mean), tuple(processor.image_std)
        return self.image_processor_settings()

    def saved_preprocessor(self, cls):
        """``cls.from_pretrained`` of the model's own folder or Hub id (its preprocessor_config.json: an image processor, a
        feature extractor); None when the model has none, or was not loaded from anywhere."""
        where = getattr(self.model, "name_or_path", "") or ""
        if not where:
            return None
        try:
            return cls.from_pretrained(where)
        except (OSError, ValueError):  # no preprocessor_config.json
            return None

    def _image_processor(self):
        """The saved image processor, checked to produce ``img_size``; None when the model has none."""
        if hasattr(self, "_processor"):
            return self._processor
        import transformers  # optional: deploytk[hf]; a model of it is loaded already

        self._processor = self.saved_preprocessor(transformers.AutoImageProcessor)  # None: the family's defaults
        if self._processor is not None:
            where = self.model.name_or_path
            from PIL import Image

            size = tuple(self._processor(images=Image.new("RGB", (7, 5)), return_tensors="pt")["pixel_values"].shape[-2:])
            if size != self.img_size:
                raise DeploytkError(
                    f"{where}'s image processor makes {size[0]}x{size[1]} images, but the model is built for "
                    f"{self.img_size[0]}x{self.img_size[1]}.",
                    hint="Save the processor that matches the model (its size / crop_size) with save_pretrained.",
                )
        return self._processor


class HFVideoFamily(HFFamily):
    """A transformers video family: its input is a clip of ``frames`` frames (``VideoInput``), preprocessed by the
    family's image processor (``processor_class``) applied to the clip's frames."""

    #: the transformers image processor class the family's clips go through
    processor_class: ClassVar[str] = ""
    frames: int

    @property
    def input_kind(self) -> InputKind:
        return VideoInput.of_size(self.frames, self.img_size)

    def eval_transform(self):
        """A clip's frames (H x W x 3 uint8, ``input_kind.read``) -> ``[T, 3, H, W]`` through the model's saved processor,
        or ``processor_class`` with its defaults at the model's size when it has none."""
        processor = self._video_processor()
        return lambda frames: processor(list(frames), return_tensors="pt")["pixel_values"][0]

    def normalization(self):
        """(mean, std) of the processor's output relative to pixels in [0, 1]: its rescale (ViViT's to [-1, 1], with
        ``offset``) folded into its normalisation, so that ``x * std + mean`` is the frame the model saw."""
        processor = self._video_processor()
        k = 255 * float(processor.rescale_factor) if processor.do_rescale else 255.0  # rescaled = k * pixel - shift
        shift = 1.0 if processor.do_rescale and getattr(processor, "offset", False) else 0.0
        mean = processor.image_mean if processor.do_normalize else (0.0, 0.0, 0.0)
        std = processor.image_std if processor.do_normalize else (1.0, 1.0, 1.0)
        return tuple((shift + float(m)) / k for m in mean), tuple(float(s) / k for s in std)

    def _video_processor(self):
        if getattr(self, "_processor", None) is None:
            import transformers  # optional: deploytk[hf]; a model of it is loaded already

            cls = getattr(transformers, self.processor_class)
            processor = self.saved_preprocessor(cls)
            if processor is None:  # the defaults at the model's size
                h, w = self.img_size
                processor = cls(size={"shortest_edge": min(h, w)}, crop_size={"height": h, "width": w})
            self._processor = processor
        return self._processor


class OutputOf(nn.Module):
    """A transformers model reduced to one output tensor: its output ``key`` (``logits``, ``image_embeds``,
    ``pooler_output``), or the class token of ``last_hidden_state`` (``key`` None) for a model without a pooler.
    ``argument``: the forward's input keyword (``pixel_values``; an audio model's ``input_values``)."""

    def __init__(self, model: nn.Module, key: str | None, argument: str = "pixel_values"):
        super().__init__()
        self.model, self.key, self.argument = model, key, argument

    def forward(self, inputs):
        out = self.model(**{self.argument: inputs})
        return out.last_hidden_state[:, 0] if self.key is None else getattr(out, self.key)


def _hub_unreachable(ref: str) -> str | None:
    """Why the Hub cannot serve ``ref`` now (offline mode, or its host does not answer within seconds); None when it can
    or when the local cache already holds the model."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants, try_to_load_from_cache

    try:
        if isinstance(try_to_load_from_cache(ref, "config.json"), str):
            return None
    except Exception:  # not a valid repo id: the Hub would refuse it too, with its own message
        return None
    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=3).close()
    except OSError as err:
        return f"{url.hostname} cannot be reached ({err.strerror or err})"
    return None


def load_hf(name: str) -> nn.Module:
    """``hf:<folder or hub id>`` -> the transformers model its config's ``architectures`` names, in eval mode, with the
    eager attention (the one whose numbers deploytk's plain-op attention reproduces)."""
    try:
        import transformers  # optional: deploytk[hf]
    except ImportError:
        raise DeploytkError(
            f"model {name!r} is a Hugging Face transformers model, and transformers is not installed.",
            hint="pip install 'deploytk[hf]'",
        ) from None
    ref = name[len(HF_PREFIX) :]
    local = Path(ref).expanduser()
    if not local.is_dir() and (not ref or ref.startswith((".", "/", "~")) or ref.count("/") > 1):
        raise DeploytkError(f"`model: {name}`: {ref or '(empty)'} is neither a folder nor a Hugging Face Hub id (owner/name).")
    where = str(local) if local.is_dir() else ref
    offline = None if local.is_dir() else _hub_unreachable(ref)
    if offline:  # transformers would retry the Hub for half a minute and then blame the config
        raise DeploytkError(
            f"`model: {name}`: there is no folder {local.absolute()}, the Hub id {ref} is not in the local Hugging Face "
            f"cache, and the Hub cannot be asked: {offline}.",
            hint="Point `model: hf:<folder>` at a folder written by save_pretrained (a relative folder in a config is read "
            "from the config's folder), or download the model where the Hub can be reached.",
        )
    try:
        config = transformers.AutoConfig.from_pretrained(where)
    except Exception as err:
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        raise DeploytkError(
            f"`model: {name}`: transformers could not read its config ({first}).",
            hint="Give a folder written by save_pretrained (config.json + model.safetensors) or a Hub id; "
            "offline, only a folder or the local cache serves.",
        ) from None
    architectures = list(getattr(config, "architectures", None) or [])
    if not architectures:
        raise DeploytkError(f"`model: {name}`: its config.json names no `architectures`, so the model class is unknown.")
    cls = getattr(transformers, architectures[0], None)
    if cls is None:
        raise DeploytkError(f"`model: {name}`: transformers {transformers.__version__} has no class {architectures[0]}.")
    transformers.logging.disable_progress_bar()  # deploytk reports its own progress; stderr stays for errors
    return cls.from_pretrained(where, attn_implementation="eager").eval()
