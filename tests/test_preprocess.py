"""Issue 55, items 1 and 2 (first step: image models whose eval preprocessing has a data form): the artifact records
its input pipeline and applies it without torch; a runner takes a JPEG path, a PIL image, a uint8 array, a float array
or a torch tensor and equals the model's own eval transform + forward; what cannot be preprocessed is refused saying
what to pass."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import deploytk
from deploytk.adapters import adapt
from deploytk.errors import DeploytkError
from deploytk.inputs.preprocess import ImagePipeline

RNG = np.random.default_rng(55)
#: landscape, portrait, square and smaller-than-the-model pictures: each resize mode's rounding is exercised
PICTURES = [Image.fromarray(RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in ((301, 413), (500, 200), (64, 64), (20, 27))]


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("deit_small_patch16_224", {}),  # shorter side 248, centre crop 224 (crop_pct 0.9), ImageNet mean/std
        ("vit_base_patch16_clip_224", {}),  # CLIP's mean/std, crop_pct 0.95: shorter side 235
        ("vit_tiny_patch16_224", {"img_size": (32, 48), "patch_size": 4}),  # non-square: timm's ResizeKeepRatio
    ],
)
def test_the_pipeline_equals_timms_own_eval_transform(name, kwargs):
    family = adapt(timm.create_model(name, **kwargs))
    pipeline = ImagePipeline.from_record(family.preprocess_record())
    for picture in PICTURES:
        expected = family.eval_transform()(picture).numpy()
        np.testing.assert_allclose(pipeline.apply(picture), expected, rtol=0, atol=1e-6)


def test_the_pipeline_equals_a_transformers_familys_default():
    """A transformers model saved without an image processor: the family's own default (an exact resize)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8
    )
    family = adapt(transformers.ViTForImageClassification(config).eval())
    pipeline = ImagePipeline.from_record(family.preprocess_record())
    assert pipeline.mode == "exact" and pipeline.size == (32, 32)
    for picture in PICTURES:
        np.testing.assert_allclose(pipeline.apply(picture), family.eval_transform()(picture).numpy(), rtol=0, atol=1e-6)


def test_a_saved_image_processor_is_not_recorded_and_says_why(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8
    )
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    family = adapt(transformers.ViTForImageClassification.from_pretrained(tmp_path).eval())
    record = family.preprocess_record()
    assert record["kind"] is None and "ViTImageProcessor" in record["reason"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A timm model object as a user builds it, exported with ToMe; a JPEG on disk; the PyTorch reference's logits for
    it through timm's own eval transform."""
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, depth=2, num_classes=10).eval()
    folder = tmp_path_factory.mktemp("preprocess")
    artifact = deploytk.export(model, folder / "artifact", method="tome", r=2)
    jpeg = folder / "picture.jpg"
    PICTURES[0].save(jpeg, quality=90)
    decoded = Image.open(jpeg).convert("RGB")
    x = adapt(model).eval_transform()(decoded)[None]
    with torch.no_grad():
        expected = deploytk.patch(model, "tome", r=2)(x).numpy()
    return artifact, jpeg, decoded, x, expected


def test_the_manifest_records_timms_pipeline(tiny):
    artifact = tiny[0]
    assert artifact.preprocessing == {
        "kind": "image",
        "from": "timm.data.create_transform",
        "channel_order": "RGB",
        "layout": "CHW",
        "resize": {"mode": "shorter", "size": 35, "interpolation": "bicubic"},  # floor(32 / 0.9)
        "crop": [32, 32],
        "rescale": 1 / 255,
        "mean": [0.5, 0.5, 0.5],
        "std": [0.5, 0.5, 0.5],
    }


@pytest.mark.parametrize("given", ["path", "str", "pil", "uint8", "uint8 batch", "list", "float", "torch"])
def test_every_input_form_equals_the_models_own_preprocessing_and_forward(tiny, given):
    artifact, jpeg, decoded, x, expected = tiny
    inputs = {
        "path": jpeg,
        "str": str(jpeg),
        "pil": decoded,
        "uint8": np.asarray(decoded),
        "uint8 batch": np.asarray(decoded)[None],
        "list": [jpeg],
        "float": x.numpy(),
        "torch": x,
    }[given]
    out = artifact(inputs)
    assert isinstance(out, torch.Tensor) == (given == "torch")
    np.testing.assert_allclose(np.asarray(out), expected, rtol=0, atol=1e-5)


def test_preprocess_and_a_runner_in_a_with_block(tiny):
    artifact, jpeg, decoded, x, expected = tiny
    np.testing.assert_allclose(artifact.preprocess([jpeg, decoded]), np.concatenate([x.numpy()] * 2), rtol=0, atol=1e-6)
    with artifact.runner("openvino") as run:
        first, second = run(jpeg), run([decoded, decoded])
    np.testing.assert_allclose(first, expected, rtol=0, atol=1e-5)
    np.testing.assert_allclose(second, np.concatenate([expected] * 2), rtol=0, atol=1e-5)


def test_pixels_in_the_models_layout_are_refused(tiny):
    artifact, _, decoded, _, _ = tiny
    chw = np.ascontiguousarray(np.asarray(decoded).transpose(2, 0, 1))[None]
    with pytest.raises(DeploytkError, match=r"uint8 pixels come as \[H, W, 3\]"):
        artifact(chw)
    resized = np.asarray(decoded.resize((32, 32))).transpose(2, 0, 1)[None].astype(np.int64)
    with pytest.raises(DeploytkError, match="int64 array .* without the model's resize and normalisation") as err:
        artifact(resized)
    assert err.value.hint and "float32" in err.value.hint
    with pytest.raises(DeploytkError, match="not images") as err:
        artifact.preprocess(np.zeros((1, 3, 32, 32), np.float32))
    assert err.value.parameter == "images"


def test_an_artifact_without_a_pipeline_refuses_images_with_the_reason(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8, num_labels=3
    )
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path / "vit")
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path / "vit")
    artifact = deploytk.export(f"hf:{tmp_path / 'vit'}", tmp_path / "artifact", method="tome", r=1)
    assert artifact.preprocessing is None
    with pytest.raises(DeploytkError, match="records no preprocessing .*ViTImageProcessor") as err:
        artifact(PICTURES[0])
    assert err.value.parameter == "inputs" and "float32" in err.value.hint
    assert artifact(np.zeros((1, 3, 32, 32), np.float32)).shape == (1, 3)  # the model's own input still runs


@pytest.mark.parametrize(
    "record, match",
    [
        ({"kind": "image", "resize": {"mode": "exact", "size": [4, 4], "interpolation": "area"}}, "interpolation 'area'"),
        ({"kind": "image", "resize": {"mode": "shorter", "size": [4, 4]}}, "resize"),
        ({"kind": "video"}, "not an RGB image pipeline"),
        ({"kind": "image", "channel_order": "BGR"}, "not an RGB image pipeline"),
    ],
)
def test_a_record_this_version_cannot_apply_is_refused(record, match):
    with pytest.raises(DeploytkError, match=match):
        ImagePipeline.from_record(record)


def test_an_error_carries_its_parameter_and_value():
    err = DeploytkError("`num_images=0`: must be an int >= 1.", hint="Pass 1 or more.")
    assert (err.parameter, err.value, err.hint, str(err)) == (
        "num_images",
        "0",
        "Pass 1 or more.",
        "`num_images=0`: must be an int >= 1. Pass 1 or more.",
    )
    assert (DeploytkError("x", parameter="batch_size", value=0).parameter, DeploytkError("a file is missing").parameter) == (
        "batch_size",
        None,
    )
    assert deploytk.DeploytkError is DeploytkError


def test_validate_reads_a_folder_through_the_recorded_pipeline(tiny, tmp_path, monkeypatch):
    """One implementation (issue 55, item 1): the pipeline a deployed artifact applies is the one `validate --data` (and
    every command that reads files) checks, not a second copy of it."""
    artifact, jpeg, *_ = tiny
    folder = tmp_path / "pictures"
    folder.mkdir()
    for i, picture in enumerate(PICTURES):
        picture.save(folder / f"{i}.png")
    applied = []
    original = ImagePipeline.apply
    monkeypatch.setattr(ImagePipeline, "apply", lambda self, image: applied.append(image.size) or original(self, image))
    report = artifact.validate(data=folder, num_samples=4, batch_size=2)
    assert report.passed and sorted(applied) == sorted(p.size for p in PICTURES)


def test_a_runner_checks_the_batch_against_the_loaded_model_first(tiny):
    """Item 2: a TensorRT engine's profile bounds the batch; the runner asks the loaded model before running, so a batch
    outside it is refused with the rebuild to do, not a TensorRT error (TensorRT itself does not run here)."""
    from deploytk.backends.trt import TrtModel

    engine = TrtModel(b"", tiny[0].input_kind, {"build": {"batch": [1, 8, 32]}})
    engine.check_batch(32, "the runner on trt")
    with pytest.raises(DeploytkError, match=r"batch size\(s\) 64 outside the engine's optimization profile 1..32") as err:
        engine.check_batch(64, "the runner on trt")
    assert "`batch_sizes=1,8,64`" in err.value.hint
    run = tiny[0].runner("ort")
    asked = []
    run._loaded.check_batch = lambda size, what: asked.append((size, what))
    run(np.zeros((3, 3, 32, 32), np.float32))
    assert asked == [(3, "the runner on ort")]


def test_the_caller_can_record_a_pipeline_deploytk_does_not(tmp_path):
    """A saved transformers image processor is not recorded (its resize is not Pillow's): `preprocess=` records the
    caller's pipeline instead, checked before any work, and the artifact applies it."""
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8, num_labels=3
    )
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path / "vit")
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path / "vit")
    record = {"kind": "image", "resize": {"mode": "exact", "size": [32, 32], "interpolation": "bilinear"}, "rescale": 1 / 255}
    record |= {"mean": [0.5] * 3, "std": [0.5] * 3}
    with pytest.raises(DeploytkError, match="interpolation 'area'"):
        deploytk.export(
            f"hf:{tmp_path / 'vit'}", tmp_path / "bad", r=1, preprocess={**record, "resize": {**record["resize"], "interpolation": "area"}}
        )
    assert not (tmp_path / "bad").exists()
    artifact = deploytk.export(f"hf:{tmp_path / 'vit'}", tmp_path / "artifact", method="tome", r=1, preprocess=record)
    assert artifact.preprocessing["from"] == "the caller (preprocess=)" and artifact.preprocessing["resize"]["size"] == [32, 32]
    expected = ImagePipeline.from_record(record).apply(PICTURES[0])[None]
    np.testing.assert_allclose(artifact.preprocess(PICTURES[0]), expected, rtol=0, atol=0)
    np.testing.assert_allclose(artifact(PICTURES[0]), artifact(expected), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("record", "match"),
    [
        ({"kind": "image", "resize": {"mode": "exact"}, "rescale": 1.0}, "malformed .*KeyError"),
        ({"kind": "image", "crop": [32], "rescale": 1.0}, "malformed .*IndexError"),
        ({"kind": "image", "crop": [32, 32]}, "has no `rescale`"),
        ({"kind": "image", "crop": [32, 32], "rescale": 1.0, "mean": [0.5] * 3}, "must both be three numbers"),
        ({"kind": "image", "resize": {"mode": "shorter", "size": 32}, "rescale": 1.0}, r"makes \[3, 32, 48\] from a 96x64 picture"),
    ],
)
def test_a_callers_pipeline_is_checked_before_any_work(tiny, tmp_path, record, match):
    """Found in review: a record missing a field raised a KeyError, one without rescale normalised 0..255 pixels, and a
    pipeline that does not make the model's input exported fine and failed in every runner call."""
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, depth=2, num_classes=10).eval()
    with pytest.raises(DeploytkError, match=match):
        deploytk.export(model, tmp_path / "out", method="tome", r=2, preprocess=record)
    assert not (tmp_path / "out").exists()


def test_a_pil_image_is_read_as_its_file_is_and_a_crop_larger_than_the_picture_pads(tmp_path):
    """Found in review: a 16-bit PIL image was clipped to white (its file was scaled); torchvision pads a crop larger
    than the resized picture, and timm's crop_pct > 1 crops so."""
    sixteen = Image.fromarray((np.arange(64 * 64, dtype=np.uint16).reshape(64, 64) * 16).astype(np.uint16))
    sixteen.save(tmp_path / "deep.png")
    from deploytk.inputs.preprocess import as_images

    (from_pil,), (from_file,) = as_images(sixteen), as_images(tmp_path / "deep.png")
    assert np.array_equal(np.asarray(from_pil), np.asarray(from_file)) and np.asarray(from_pil).mean() < 200
    family = adapt(timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, depth=1, pretrained_cfg_overlay={"crop_pct": 1.15}))
    pipeline = ImagePipeline.from_record(family.preprocess_record())
    assert pipeline.crop == (32, 32) and pipeline.size == 27
    for picture in PICTURES:
        np.testing.assert_allclose(pipeline.apply(picture), family.eval_transform()(picture).numpy(), rtol=0, atol=1e-6)


def test_a_list_of_model_ready_arrays_runs_as_a_batch(tiny):
    artifact, _, _, x, expected = tiny
    out = artifact([x.numpy()[0], x.numpy()[0]])
    np.testing.assert_allclose(out, np.concatenate([expected] * 2), rtol=0, atol=1e-5)


def test_nested_with_blocks_acquire_the_context_once(tiny):
    """Found in review: a second `with` acquired again (a TensorRT context leaked) and the inner exit released it early."""
    artifact, _, _, x, _ = tiny
    run, calls = artifact.runner("ort"), []
    run._loaded.activate, run._loaded.deactivate = (lambda: calls.append("acquire")), (lambda: calls.append("release"))
    with run:
        with run:
            run(x)
        run(x)
        assert calls == ["acquire"]
    assert calls == ["acquire", "release"]
