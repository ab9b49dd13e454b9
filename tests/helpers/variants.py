"""The generated model matrix: models built the way users build them, drawn with a seed instead of picked by hand.

A ``Variant`` is a family's model with constructor options users set (pooling, ``fc_norm``, class token, prefix
tokens, registers, geometry, depth, width), an initialisation (the library's own default, or a larger-scale seeded
one) and a token-reduction method with a schedule. Its ``code`` is the Python that builds the model: the tests run
exactly that text, so a failure prints a reproduction a user can paste (``Variant.reproduction``).

``draw(size, seed)`` deals the families out in turn and draws each one's options and method from ``random.Random(seed)``;
the same size and seed always give the same variants. Hand-picked configs hid defects that only default
initialisations (zero class tokens and position embeddings: exact ties), other pooling and norm placements, two prefix
tokens and non-square geometries show; drawing keeps the suite from picking.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field

#: the training-free methods (the learned ones need their trained layers' checkpoint; ATM its calibration)
METHODS = ("tome", "mctf", "pitome", "evit", "topk", "ats", "crucial", "heuristic", "kmedoids", "dpcknn", "visionzip")
#: methods that read the class token's attention or keep it apart, so the model needs one
NEEDS_CLASS_TOKEN = frozenset({"evit", "topk", "ats", "crucial", "visionzip"})


@dataclass(frozen=True)
class Variant:
    """One drawn model and method. ``code`` builds ``model`` (imports included); ``call`` is how users read its output
    from an input ``x`` (the r=0 comparison's ground truth)."""

    family: str
    code: str
    call: str
    init: str
    method: str
    schedule: dict = field(default_factory=dict)
    #: whether the model has a class token (the methods that need one are drawn only where it has one)
    class_token: bool = True
    #: a part of the one-paragraph error export must refuse this variant with (None: it must export and validate)
    refusal: str | None = None
    #: ``export.output`` (None: the model's own output)
    output_kind: str | None = None

    @property
    def id(self) -> str:
        text = repr((self.code, self.init, self.method, sorted(self.export_arguments.items())))
        return f"{self.family}-{self.method}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"

    @property
    def init_code(self) -> str:
        if self.init == "default":
            return "# initialisation: the library's own (model as constructed)"
        seed = int(self.init.split(":")[1])
        return (
            f"g = torch.Generator().manual_seed({seed})  # initialisation: seeded, larger scale than the library's\n"
            "for name, p in sorted(model.named_parameters()):\n"
            "    p.data = torch.randn(p.shape, generator=g) * 0.2 + float('norm' in name and name.endswith('weight'))"
        )

    def build(self):
        """Run ``code`` and ``init_code``; the model in eval mode."""
        namespace: dict = {}
        exec("import torch\n" + self.code + "\n" + self.init_code, namespace)
        return namespace["model"].eval()

    def export_call(self, output: str = "out") -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.export_arguments.items())
        return f"deploytk.export(model, {output!r}, method={self.method!r}{args})"

    @property
    def export_arguments(self) -> dict:
        """``deploytk.export``'s keywords but the method: the schedule and the output kind."""
        return self.schedule | ({"output_kind": self.output_kind} if self.output_kind else {})

    def reproduction(self) -> str:
        """The variant as a script a user can paste: build, initialise, export, validate in a new process."""
        return "\n".join(
            [
                "import deploytk, torch",
                self.code,
                self.init_code,
                "model.eval()",
                self.export_call(),
                "# then, in a new process: deploytk validate out --backend ort,openvino",
            ]
        )


# ---- families: each draws (code, call, has a class token, square patch grid) from rng ---------------------------------------------------


def _geometry(rng: random.Random, patch: int) -> tuple[int, int]:
    """A small image size, non-square and not a multiple of the default about half of the time."""
    return rng.choice([(4, 4), (6, 4), (4, 7), (5, 6), (3, 5)]) if patch else (0, 0)


def _timm(rng: random.Random) -> tuple[str, str, bool, bool]:
    arch = rng.choice(
        [
            "vit_tiny_patch16_224",
            "deit3_small_patch16_224",  # LayerScale, no_embed_class
            "vit_base_patch16_clip_224",  # pre_norm, quick GELU
            "vit_base_patch16_reg4_gap_256",  # registers, no class token, avg pool
            "vit_small_patch14_dinov2",  # LayerScale, dinov2 layout
            "vit_base_patch16_siglip_224",  # map head, no class token
        ]
    )
    patch = 8
    rows, cols = _geometry(rng, patch)
    kw: dict = {"img_size": (rows * patch, cols * patch) if rows != cols else rows * patch, "patch_size": patch}
    kw |= {"embed_dim": rng.choice([32, 48, 64]), "depth": rng.choice([2, 3, 4]), "num_heads": 2, "mlp_ratio": 2.0}
    kw["num_classes"] = rng.choice([0, 7])
    if arch == "vit_base_patch16_siglip_224":
        kw["global_pool"] = rng.choice(["map", "avg"])
        class_token = False
    elif arch == "vit_base_patch16_reg4_gap_256":
        kw["reg_tokens"] = rng.choice([1, 4])
        class_token = rng.random() < 0.5
        kw["class_token"] = class_token
        kw["global_pool"] = rng.choice(["avg", "token"] if class_token else ["avg", "max", "avgmax"])
    else:
        class_token = rng.random() < 0.75
        pools = ["token", "avg", "avgmax", "max", ""] if class_token else ["avg", "max", "avgmax", ""]  # '': no pooling
        if not class_token:
            kw["class_token"] = False
        kw["global_pool"] = rng.choice(pools)
        if rng.random() < 0.3:
            kw["reg_tokens"] = rng.choice([1, 4])
    if rng.random() < 0.4:
        kw["fc_norm"] = rng.choice([True, False])
    if rng.random() < 0.2:
        kw["qk_norm"] = True
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    return f"import timm\nmodel = timm.create_model({arch!r}, {args})", "model(x)", class_token, rows == cols


def _timm_distilled(rng: random.Random) -> tuple[str, str, bool, bool]:
    rows, cols = _geometry(rng, 8)
    kw = {"img_size": (rows * 8, cols * 8), "patch_size": 8, "embed_dim": rng.choice([32, 64]), "depth": rng.choice([2, 3])}
    kw |= {"num_heads": 2, "num_classes": 7}
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    return f"import timm\nmodel = timm.create_model('deit_tiny_distilled_patch16_224', {args})", "model(x)", True, rows == cols


def _hf_image(rng: random.Random) -> tuple[str, str, bool, bool]:
    cls, config, call, class_token, extra = rng.choice(
        [
            ("ViTForImageClassification", "ViTConfig", "model(pixel_values=x).logits", True, {"num_labels": 6}),
            ("ViTModel", "ViTConfig", "model(pixel_values=x).pooler_output", True, {}),
            ("DeiTForImageClassificationWithTeacher", "DeiTConfig", "model(pixel_values=x).logits", True, {"num_labels": 6}),
            ("DeiTForImageClassification", "DeiTConfig", "model(pixel_values=x).logits", True, {"num_labels": 6}),
            ("Dinov2Model", "Dinov2Config", "model(pixel_values=x).pooler_output", True, {}),
            (
                "Dinov2WithRegistersModel",
                "Dinov2WithRegistersConfig",
                "model(pixel_values=x).pooler_output",
                True,
                {"num_register_tokens": rng.choice([1, 4])},
            ),
            ("CLIPVisionModel", "CLIPVisionConfig", "model(pixel_values=x).pooler_output", True, {}),
            ("CLIPVisionModelWithProjection", "CLIPVisionConfig", "model(pixel_values=x).image_embeds", True, {"projection_dim": 24}),
            ("SiglipVisionModel", "SiglipVisionConfig", "model(pixel_values=x).pooler_output", False, {}),
        ]
    )
    width = rng.choice([32, 48, 64])
    kw = {"hidden_size": width, "num_hidden_layers": rng.choice([2, 3, 4]), "num_attention_heads": 2}
    kw |= {"intermediate_size": 2 * width} if config != "Dinov2Config" and config != "Dinov2WithRegistersConfig" else {"mlp_ratio": 2}
    kw |= {"image_size": 8 * rng.choice([4, 5, 6]), "patch_size": 8} | extra
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    return f"import transformers\nmodel = transformers.{cls}(transformers.{config}({args}))", call, class_token, True


def _hf_video(rng: random.Random) -> tuple[str, str, bool, bool]:
    width = rng.choice([32, 64])
    layers = {"hidden_size": width, "num_hidden_layers": rng.choice([2, 3]), "num_attention_heads": 2, "intermediate_size": 2 * width}
    if rng.random() < 0.5:
        cls, call = rng.choice(
            [
                ("VideoMAEForVideoClassification", "model(pixel_values=x).logits"),
                # deploytk's embedding of a VideoMAEModel is the mean of its tokens (adapters/hf_videomae.py)
                ("VideoMAEModel", "model(pixel_values=x).last_hidden_state.mean(1)"),
            ]
        )
        kw = layers | {"image_size": 32, "patch_size": 8, "num_frames": rng.choice([4, 6]), "tubelet_size": 2}
        if cls == "VideoMAEForVideoClassification":
            kw |= {"num_labels": 5, "use_mean_pooling": rng.random() < 0.8}
        args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
        return f"import transformers\nmodel = transformers.{cls}(transformers.VideoMAEConfig({args}))", call, False, True
    cls, call = rng.choice(
        [("VivitForVideoClassification", "model(pixel_values=x).logits"), ("VivitModel", "model(pixel_values=x).pooler_output")]
    )
    kw = layers | {"image_size": 32, "num_frames": 4, "tubelet_size": [2, 8, 8]} | ({"num_labels": 5} if "Classification" in cls else {})
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    return f"import transformers\nmodel = transformers.{cls}(transformers.VivitConfig({args}))", call, True, True


def _hf_audio(rng: random.Random) -> tuple[str, str, bool, bool]:
    width = rng.choice([32, 64])
    kw = {"hidden_size": width, "num_hidden_layers": rng.choice([2, 3, 4]), "num_attention_heads": 2, "intermediate_size": 4 * width}
    kw |= {"patch_size": 16, "frequency_stride": rng.choice([10, 16]), "time_stride": rng.choice([10, 12])}
    kw |= {"max_length": rng.choice([64, 100, 128]), "num_mel_bins": rng.choice([32, 48, 64])}
    rows = (kw["num_mel_bins"] - 16) // kw["frequency_stride"] + 1
    cols = (kw["max_length"] - 16) // kw["time_stride"] + 1
    cls, call = rng.choice(
        [("ASTForAudioClassification", "model(input_values=x).logits"), ("ASTModel", "model(input_values=x).pooler_output")]
    )
    if "Classification" in cls:
        kw["num_labels"] = 6
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    return f"import transformers\nmodel = transformers.{cls}(transformers.ASTConfig({args}))", call, True, rows == cols


def _multiscale(rng: random.Random) -> tuple[str, str, bool, bool]:
    depth = rng.choice([3, 4])
    kw = {"img_size": 32, "patch_size": 4, "embed_dim": rng.choice([32, 48]), "depth": depth, "num_heads": 2, "num_classes": 7}
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    return (
        "import timm\nfrom deploytk.adapters.multiscale_vit import MultiScaleViT\n"
        f"model = MultiScaleViT(timm.create_model('deit_tiny_patch16_224', {args}), fusion_block={rng.choice([1, 2])})",
        "model(x)",
        True,
        True,
    )


#: family -> its draw; dealt out in this order
FAMILIES: dict[str, Callable[[random.Random], tuple[str, str, bool, bool]]] = {
    "timm": _timm,
    "hf-image": _hf_image,
    "hf-video": _hf_video,
    "hf-audio": _hf_audio,
    "timm-distilled": _timm_distilled,
    "multiscale": _multiscale,
}


def _depth(code: str) -> int:
    for key in ("num_hidden_layers=", "depth="):
        if key in code:
            return int(code.split(key, 1)[1].split(",")[0].split(")")[0])
    raise ValueError(code)


def _schedule(method: str, depth: int, first: int, rng: random.Random) -> dict:
    """A schedule for ``method`` on a ``depth``-block model whose first reducible block is ``first`` (after a multi-scale
    stem); K-Medoids weights tokens by the previous block's attention, so it starts at block 1."""
    blocks = list(range(max(first, method == "kmedoids"), depth))
    layers = sorted(rng.sample(blocks, rng.randint(1, min(2, len(blocks)))))
    if method == "tome":
        r = rng.choice([1, 2, 4, 8, 200, "list"])
        return {"r": [0] * first + [rng.choice([1, 2, 3]) for _ in range(depth - first)] if r == "list" or first else r}
    if method == "mctf":
        return {"r": rng.choice([1, 2, 4])} | ({"layers": layers} if first else {})
    if method == "pitome":
        return {"keep_rate": rng.choice([0.9, 0.75])} | ({"layers": layers} if first else {})
    if method == "heuristic":
        return {"keep_rate": rng.choice([0.5, 0.7]), "layers": layers, "pattern": rng.choice(["l1", "l2", "linf"])}
    if method == "visionzip":
        return {"dominant": rng.choice([4, 6]), "contextual": 2, "layer": -1}
    return {"keep_rate": rng.choice([0.5, 0.7]), "layers": layers}


def _refusal(code: str, method: str, square: bool) -> str | None:
    """What export must refuse the variant for: the limits deploytk states (anything else must export and validate)."""
    if "use_mean_pooling=False" in code and "VideoMAEForVideoClassification" in code:
        return "use_mean_pooling=False"  # the classifier reads one patch token, which reduction merges away
    if method == "heuristic" and not square:
        return "square patch grid"  # the study's radial pattern
    return None


def draw(size: int, seed: int) -> list[Variant]:
    """``size`` variants, the families and the methods dealt out in turn, everything else drawn from ``seed``."""
    rng = random.Random(seed)
    names = list(FAMILIES)
    methods = list(METHODS)
    rng.shuffle(methods)
    variants = []
    for k in range(size):
        family = names[k % len(names)]
        code, call, class_token, square = FAMILIES[family](rng)
        init = rng.choice(["default", f"seeded:{rng.randint(0, 999)}"])
        # the methods dealt out in turn too (a shuffled order), skipping those the model cannot take
        turn = [methods[(k + j) % len(methods)] for j in range(len(methods))]
        method = next(m for m in turn if class_token or m not in NEEDS_CLASS_TOKEN)
        first = int(code.split("fusion_block=")[1][0]) if "fusion_block=" in code else 0
        schedule = _schedule(method, _depth(code), first, rng)
        # the dense outputs users set: always for a model that pools nothing (its own output is one row per token, which
        # reduction changes: export refuses it, see test_a_model_that_pools_nothing_is_refused...), else now and then
        dense = "global_pool=''" in code or rng.random() < 0.2
        output_kind = rng.choice(["tokens", "patch_features"]) if dense else None
        refusal = _refusal(code, method, square)
        variants.append(Variant(family, code, call, init, method, schedule, class_token, refusal, output_kind))
    return variants
