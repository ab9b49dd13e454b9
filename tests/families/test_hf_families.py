"""Hugging Face transformers families: each class built from a config with seeded random weights and saved with
save_pretrained (no download), then loaded through `model: hf:<folder>`.

- with no reduction, deploytk's reference and its exported graph (ONNX Runtime and OpenVINO) equal the model's own
  forward, called as users call it, within 1e-5;
- the same weights as a HF ViTForImageClassification and as a timm ViT give the same ToMe and MCTF outputs through
  deploytk (an independent check of the adapter, not only of the export);
- the training-free methods export and validate on every family where they apply, and refuse where they do not.
"""

import numpy as np
import pytest
import timm
import torch
import transformers

from deploytk.backends import get_backend
from deploytk.backends.ort import ort_session
from deploytk.config import config_from_dict
from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import Artifact
from deploytk.exporter.pipeline import run_export
from deploytk.merging.merged_vit import build_merged
from deploytk.models import build_reference, create_vit
from deploytk.reducers import get_method
from deploytk.validate.validator import run_validation

from helpers import seeded_init

SIZE = dict(hidden_size=64, num_hidden_layers=12, num_attention_heads=2, image_size=32, patch_size=4)
#: class -> (its config class, extra config, the output users read)
CLASSES = {
    "ViTModel": ("ViTConfig", {"intermediate_size": 128}, "pooler_output"),
    "ViTForImageClassification": ("ViTConfig", {"intermediate_size": 128, "num_labels": 10}, "logits"),
    "DeiTForImageClassificationWithTeacher": ("DeiTConfig", {"intermediate_size": 128, "num_labels": 10}, "logits"),
    "Dinov2Model": ("Dinov2Config", {"mlp_ratio": 2}, "pooler_output"),
    "Dinov2WithRegistersModel": ("Dinov2WithRegistersConfig", {"mlp_ratio": 2, "num_register_tokens": 4}, "pooler_output"),
    "CLIPVisionModel": ("CLIPVisionConfig", {"intermediate_size": 128}, "pooler_output"),
    "CLIPVisionModelWithProjection": ("CLIPVisionConfig", {"intermediate_size": 128, "projection_dim": 48}, "image_embeds"),
    "SiglipVisionModel": ("SiglipVisionConfig", {"intermediate_size": 128}, "pooler_output"),
}


def images(n=2, seed=4):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((n, 3, 32, 32)).astype(np.float32))


def save_every_class(root, depth: int) -> dict:
    """class name -> a save_pretrained folder of that class with seeded random weights and ``depth`` layers."""
    folders = {}
    for i, (name, (config_class, extra, _)) in enumerate(CLASSES.items()):
        model = getattr(transformers, name)(getattr(transformers, config_class)(**(SIZE | {"num_hidden_layers": depth}), **extra))
        seeded_init(model, seed=10 + i).save_pretrained(root / name)
        folders[name] = root / name
    return folders


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """12 layers: the keep-rate methods reduce at blocks 3, 6 and 9 by default."""
    return save_every_class(tmp_path_factory.mktemp("hf"), 12)


@pytest.fixture(scope="module")
def shallow(tmp_path_factory):
    """4 layers: enough to compare every part of a layer, a third of the export time."""
    return save_every_class(tmp_path_factory.mktemp("hf4"), 4)


def config(folder, method="tome", r=0, **options):
    merge = {"method": method, "options": options} | ({"r": r} if get_method(method).uses_r else {})
    return config_from_dict({"model": f"hf:{folder}", "export": {"img_size": None, "batch_size": 2}, "merge": merge})


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_no_reduction_equals_the_models_own_forward_in_torch_onnxruntime_and_openvino(name, shallow, tmp_path):
    saved = shallow
    own = getattr(transformers, name).from_pretrained(saved[name]).eval()  # as users load it
    x = images()
    with torch.no_grad():
        want = getattr(own(pixel_values=x), CLASSES[name][2]).numpy()
        merged = build_reference(config(saved[name]))
        reference = merged(x).numpy()
        dense = merged.family.plain()(x).numpy()  # the unmerged model as the dense baseline and the rebuild check call it
    np.testing.assert_allclose(reference, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(dense, want, rtol=0, atol=1e-5)
    manifest = run_export(config(saved[name]), tmp_path / "a")
    assert manifest["model"]["class"] == name and manifest["model"]["family"].startswith("hf-")
    got = ort_session(tmp_path / "a" / "model.onnx").run(None, {"input": x.numpy()})[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    loaded = get_backend("openvino").load(Artifact.open(tmp_path / "a"), [2])
    np.testing.assert_allclose(next(iter(loaded.run(x.numpy()).values())), want, rtol=0, atol=1e-5)


def timm_weights_from_hf(hf: transformers.ViTForImageClassification) -> dict[str, torch.Tensor]:
    """The state dict of the equivalent timm ViT, converted key by key (q, k, v concatenated into timm's qkv)."""
    s = hf.state_dict()
    out = {
        "cls_token": s["vit.embeddings.cls_token"],
        "pos_embed": s["vit.embeddings.position_embeddings"],
        "patch_embed.proj.weight": s["vit.embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": s["vit.embeddings.patch_embeddings.projection.bias"],
        "norm.weight": s["vit.layernorm.weight"],
        "norm.bias": s["vit.layernorm.bias"],
        "head.weight": s["classifier.weight"],
        "head.bias": s["classifier.bias"],
    }
    for i in range(len(hf.vit.layers)):
        h, t = f"vit.layers.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            out[t + f"attn.qkv.{kind}"] = torch.cat([s[h + f"attention.{p}_proj.{kind}"] for p in "qkv"])
            out[t + f"attn.proj.{kind}"] = s[h + f"attention.o_proj.{kind}"]
            out[t + f"norm1.{kind}"] = s[h + f"layernorm_before.{kind}"]
            out[t + f"norm2.{kind}"] = s[h + f"layernorm_after.{kind}"]
            out[t + f"mlp.fc1.{kind}"] = s[h + f"mlp.fc1.{kind}"]
            out[t + f"mlp.fc2.{kind}"] = s[h + f"mlp.fc2.{kind}"]
    return out


@pytest.mark.parametrize("method, r", [("tome", 8), ("mctf", 8)])
def test_hf_and_timm_with_the_same_weights_reduce_alike(method, r):
    hf_config = transformers.ViTConfig(**SIZE, intermediate_size=128, num_labels=10, layer_norm_eps=1e-6)  # timm's eps
    hf = seeded_init(transformers.ViTForImageClassification(hf_config), seed=3)
    vit = timm.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=4, embed_dim=64, depth=12, num_heads=2, mlp_ratio=2, num_classes=10
    )
    vit.load_state_dict(timm_weights_from_hf(hf), strict=True)
    m = get_method(method)
    x = images(3)
    with torch.no_grad():
        from_hf = build_merged(m, hf, r, True, m.parse_options({})).eval()
        from_timm = build_merged(m, vit.eval(), r, True, m.parse_options({})).eval()
        assert from_hf.schedule.tokens == from_timm.schedule.tokens and from_hf.schedule.tokens_out < 65
        got, want = from_hf(x), from_timm(x)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
        assert (got - hf(pixel_values=x).logits).abs().max() > 1e-3  # the reduction changed the output: the check can fail


#: (family's class, method, options): the training-free methods on a family of each kind
METHOD_CASES = [
    ("ViTForImageClassification", "evit", {}),
    ("SiglipVisionModel", "tome", {}),
    ("CLIPVisionModel", "pitome", {}),
]
SLOW_METHOD_CASES = [
    (name, method, {})
    for name in ("ViTForImageClassification", "DeiTForImageClassificationWithTeacher", "Dinov2WithRegistersModel", "CLIPVisionModel")
    for method in ("tome", "mctf", "evit", "topk", "kmedoids", "ats", "pitome")
] + [("SiglipVisionModel", method, {}) for method in ("tome", "mctf", "kmedoids", "pitome")]
SLOW_METHOD_CASES += [
    (name, "visionzip", {"dominant": 16, "contextual": 8})
    for name in ("ViTForImageClassification", "DeiTForImageClassificationWithTeacher", "Dinov2WithRegistersModel", "CLIPVisionModel")
]


def export_and_validate(saved, tmp_path, name, method, options):
    out = tmp_path / f"{name}_{method}"
    run_export(config(saved[name], method, r=4, **options), out)
    for backend in ("ort", "openvino"):
        report, _ = run_validation(out, backend, num_samples=4, batch_size=2)
        assert report.passed, (backend, report.to_dict())


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize("name, method, options", METHOD_CASES)
def test_methods_export_and_validate_on_hf_families(name, method, options, saved, tmp_path):
    export_and_validate(saved, tmp_path, name, method, options)


@pytest.mark.slow
@pytest.mark.parametrize("name, method, options", [c for c in SLOW_METHOD_CASES if c not in METHOD_CASES])
def test_every_training_free_method_on_every_hf_family(name, method, options, saved, tmp_path):
    export_and_validate(saved, tmp_path, name, method, options)


@pytest.mark.parametrize("method", ["evit", "topk", "ats"])
def test_class_attention_methods_are_refused_on_siglip(method, saved):
    with pytest.raises(DeploytkError, match="no class token"):
        build_reference(config(saved["SiglipVisionModel"], method))


def test_learned_reducers_are_refused_on_hf_models(saved):
    with pytest.raises(DeploytkError, match="trained layers of its own.*TokenReduction.*timm") as err:
        build_reference(config(saved["ViTForImageClassification"], "patchmerger"))
    assert "ViTForImageClassification" in err.value.message


def test_hf_refusals_say_what_to_do(saved, tmp_path):
    folder = saved["ViTModel"]
    with pytest.raises(DeploytkError, match=r"`export.img_size` = 64, but hf:.* is built for 32x32") as err:
        create_vit(config_from_dict({"model": f"hf:{folder}", "export": {"img_size": 64}}))
    assert "export.img_size: 32" in err.value.hint
    with pytest.raises(DeploytkError, match="`model_kwargs` .* are for timm models"):
        create_vit(config_from_dict({"model": f"hf:{folder}", "model_kwargs": {"depth": 2}, "export": {"img_size": None}}))
    with pytest.raises(DeploytkError, match="`checkpoint` is for timm models"):
        create_vit(config_from_dict({"model": f"hf:{folder}", "checkpoint": str(tmp_path / "w.pth"), "export": {"img_size": None}}))
    with pytest.raises(DeploytkError, match="transformers could not read its config"):
        create_vit(config_from_dict({"model": f"hf:{tmp_path}", "export": {"img_size": None}}))


def test_the_saved_image_processor_is_the_preprocessing(saved, tmp_path):
    from PIL import Image

    from deploytk.adapters import adapt

    folder = tmp_path / "vit"
    transformers.ViTModel.from_pretrained(saved["ViTModel"]).save_pretrained(folder)
    processor = transformers.ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.1, 0.2, 0.3], image_std=[0.5, 0.4, 0.3])
    processor.save_pretrained(folder)
    family = adapt(create_vit(config(folder)))
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 50, 3), dtype=np.uint8))
    want = processor(images=image, return_tensors="pt")["pixel_values"][0]
    torch.testing.assert_close(family.eval_transform()(image), want, rtol=0, atol=0)
    assert family.normalization() == ((0.1, 0.2, 0.3), (0.5, 0.4, 0.3))
    transformers.ViTImageProcessor(size={"height": 48, "width": 48}).save_pretrained(folder)
    with pytest.raises(DeploytkError, match="image processor makes 48x48 images, but the model is built for 32x32"):
        adapt(create_vit(config(folder))).eval_transform()
