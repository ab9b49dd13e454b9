"""Video and audio transformers (VideoMAE, ViViT, AST): each class built from a small config with seeded random weights
and saved with save_pretrained (no download), then loaded through `model: hf:<folder>`.

- with no reduction, deploytk's reference and its exported graph (ONNX Runtime and OpenVINO) equal the model's own
  forward, called as users call it, within 1e-5, and the graph's input is the input kind's (name, layout);
- with ToMe and the other methods that need no class token, `validate` passes with default tolerances on both
  runtimes; methods that read a class token refuse VideoMAE, which has none;
- VideoMAE's mean pooling weighs a merged token by its size (an independent computation of the pooled feature).
"""

import numpy as np
import pytest
import torch
import transformers

from deploytk.adapters import adapt
from deploytk.backends import get_backend
from deploytk.backends.ort import ort_session
from deploytk.config import config_from_dict
from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import Artifact
from deploytk.exporter.pipeline import run_export
from deploytk.models import build_reference, create_vit
from deploytk.reducers import get_method
from deploytk.validate.validator import run_validation, run_validations

from helpers import seeded_init
from helpers.media import clip_frames, write_clip, write_sound

LAYERS = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=2, intermediate_size=128)
VIDEOMAE = dict(image_size=32, patch_size=8, num_frames=4, tubelet_size=2, **LAYERS)
VIVIT = dict(image_size=32, num_frames=4, tubelet_size=[2, 8, 8], **LAYERS)
AST = dict(patch_size=16, frequency_stride=10, time_stride=10, max_length=100, num_mel_bins=48, **LAYERS)
#: class -> (its config class, config, the output users read, the forward's input keyword, one sample's shape)
CLASSES = {
    "VideoMAEForVideoClassification": ("VideoMAEConfig", VIDEOMAE | {"num_labels": 5}, "logits", "pixel_values", (4, 3, 32, 32)),
    "VideoMAEModel": ("VideoMAEConfig", VIDEOMAE, None, "pixel_values", (4, 3, 32, 32)),
    "VivitForVideoClassification": ("VivitConfig", VIVIT | {"num_labels": 5}, "logits", "pixel_values", (4, 3, 32, 32)),
    "VivitModel": ("VivitConfig", VIVIT, "pooler_output", "pixel_values", (4, 3, 32, 32)),
    "ASTForAudioClassification": ("ASTConfig", AST | {"num_labels": 5}, "logits", "input_values", (100, 48)),
    "ASTModel": ("ASTConfig", AST, "pooler_output", "input_values", (100, 48)),
}
KINDS = {"pixel_values": "video", "input_values": "spectrogram"}


def inputs(name, n=2, seed=4):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((n, *CLASSES[name][4])).astype(np.float32))


def own_output(model, name, x):
    """What a user reads from the model's own forward (VideoMAEModel: the mean of its last_hidden_state)."""
    _, _, key, argument, _ = CLASSES[name]
    out = model(**{argument: x})
    return out.last_hidden_state.mean(1) if key is None else getattr(out, key)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("video_audio")
    folders = {}
    for i, (name, (config_class, settings, *_)) in enumerate(CLASSES.items()):
        model = getattr(transformers, name)(getattr(transformers, config_class)(**settings))
        seeded_init(model, seed=20 + i).save_pretrained(root / name)
        folders[name] = root / name
    return folders


def config(folder, method="tome", r=0, output=None, **options):
    merge = {"method": method, "options": options} | ({"r": r} if get_method(method).uses_r else {})
    export = {"img_size": None, "batch_size": 2} | ({"output": output} if output else {})
    return config_from_dict({"model": f"hf:{folder}", "export": export, "merge": merge})


#: the headless classes repeat what their classifiers check by default; the slow tier runs them
HEADLESS = ("VideoMAEModel", "VivitModel", "ASTModel")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in HEADLESS else n for n in sorted(CLASSES)])
def test_no_reduction_equals_the_models_own_forward_in_torch_onnxruntime_and_openvino(name, saved, tmp_path):
    own = getattr(transformers, name).from_pretrained(saved[name]).eval()  # as users load it
    x = inputs(name)
    with torch.no_grad():
        want = own_output(own, name, x).numpy()
        reference = build_reference(config(saved[name]))(x).numpy()
    np.testing.assert_allclose(reference, want, rtol=0, atol=1e-5)
    manifest = run_export(config(saved[name]), tmp_path / "a")
    argument, shape = CLASSES[name][3], CLASSES[name][4]
    assert manifest["inputs"][0]["name"] == argument and manifest["inputs"][0]["kind"] == KINDS[argument]
    assert manifest["inputs"][0]["shape"] == ["batch", *shape]
    session = ort_session(tmp_path / "a" / "model.onnx")
    assert [(i.name, i.shape) for i in session.get_inputs()] == [(argument, ["batch", *shape])]
    np.testing.assert_allclose(session.run(None, {argument: x.numpy()})[0], want, rtol=0, atol=1e-5)
    loaded = get_backend("openvino").load(Artifact.open(tmp_path / "a"), [2])
    np.testing.assert_allclose(next(iter(loaded.run(x.numpy()).values())), want, rtol=0, atol=1e-5)


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize(
    "name, method, options",
    [
        ("VideoMAEForVideoClassification", "tome", {}),
        ("VivitForVideoClassification", "tome", {}),
        ("ASTForAudioClassification", "tome", {}),
    ],
)
def test_tome_validates_with_default_tolerances_on_both_runtimes(name, method, options, saved, tmp_path):
    out = tmp_path / name
    manifest = run_export(config(saved[name], method, r=4, **options), out)
    assert manifest["schedule"]["tokens_out"] < manifest["schedule"]["tokens_per_layer"][0]
    for backend in ("ort", "openvino"):
        report, _ = run_validation(out, backend, num_samples=4, batch_size=2)
        assert report.passed, (backend, report.to_dict())


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize("name", ["ASTForAudioClassification", "DeiTForImageClassification"])
def test_tome_validates_on_the_libraries_own_initialisation(name, tmp_path):
    """transformers' own init leaves the class and distillation tokens and the position embeddings at zero, so those
    tokens' keys are zero: ToMe's cosine metric had 0/0 rows, which the reference masked away and the ONNX body carried
    as NaN into its max, so every image chose differently on both runtimes (min cosine -0.7). One rule now: a zero row
    has cosine 0 (deploytk/ops/ties.py). The `saved` fixture seeds its weights, which hid it."""
    if name.startswith("AST"):
        model = transformers.ASTForAudioClassification(transformers.ASTConfig(**AST | {"num_labels": 5}))
    else:
        config_ = transformers.DeiTConfig(image_size=32, patch_size=8, num_labels=5, **LAYERS)
        model = transformers.DeiTForImageClassification(config_)
    embeddings = model.base_model.embeddings
    assert not embeddings.cls_token.any() and not embeddings.position_embeddings.any()  # the init this is about
    model.save_pretrained(tmp_path / "model")
    manifest = run_export(config(tmp_path / "model", "tome", r=4), tmp_path / "a")
    assert manifest["schedule"]["tokens_out"] < manifest["schedule"]["tokens_per_layer"][0]
    reports, _ = run_validations(tmp_path / "a", ["ort", "openvino"], num_samples=8, batch_size=4)
    assert all(r.passed for r in reports), [(r.backend, r.cosine_similarity_min, r.checks) for r in reports]


@pytest.mark.slow
@pytest.mark.parametrize(
    "method, options", [("pitome", {}), ("mctf", {}), ("dpcknn", {"layers": [1, 2]}), ("kmedoids", {"layers": [1, 2]})]
)
def test_methods_without_a_class_token_validate_on_videomae(method, options, saved, tmp_path):
    out = tmp_path / method
    run_export(config(saved["VideoMAEForVideoClassification"], method, r=4, **options), out)
    for backend in ("ort", "openvino"):
        report, _ = run_validation(out, backend, num_samples=4, batch_size=2)
        assert report.passed, (backend, report.to_dict())


@pytest.mark.parametrize("method", ["evit", "topk", "ats"])
def test_methods_that_read_the_class_token_refuse_videomae_by_name(method, saved):
    with pytest.raises(DeploytkError, match="no class token"):
        build_reference(config(saved["VideoMAEForVideoClassification"], method))


def test_videomae_mean_pooling_weighs_a_merged_token_by_its_size(saved):
    family = adapt(create_vit(config(saved["VideoMAEForVideoClassification"])))
    x = torch.randn(1, 3, 64)
    size = torch.tensor([[[1.0], [2.0], [5.0]]])
    want = family.model.fc_norm((x[0, 0] + 2 * x[0, 1] + 5 * x[0, 2]) / 8)
    torch.testing.assert_close(family.pre_logits(x, size)[0], want)
    assert family.num_patches == 2 * 4 * 4 and family.input_kind.shape == (4, 3, 32, 32)


def test_a_videomae_classifier_without_mean_pooling_is_refused(tmp_path):
    model = transformers.VideoMAEForVideoClassification(transformers.VideoMAEConfig(**VIDEOMAE, use_mean_pooling=False, num_labels=5))
    with pytest.raises(DeploytkError, match="use_mean_pooling=False.*first patch token"):
        adapt(model)


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_videomae_patch_features_cover_every_tubelet_and_validate(saved, tmp_path):
    out = tmp_path / "patches"
    run_export(config(saved["VideoMAEModel"], "tome", r=4, output="patch_features"), out)
    runner = get_backend("ort").load(Artifact.open(out), [2])
    (features,) = runner.run(inputs("VideoMAEModel").numpy()).values()
    assert features.shape == (2, 2 * 4 * 4, 64)
    report, _ = run_validation(out, "ort", num_samples=4, batch_size=2)
    assert report.passed, report.to_dict()


def test_the_runner_names_the_input_layout_a_wrong_batch_misses(saved, tmp_path):
    import deploytk

    artifact = deploytk.export(f"hf:{saved['ASTForAudioClassification']}", tmp_path / "ast", method="tome", r=2)
    assert artifact.input_kind.describe() == "input_values [batch, 100, 48]" and artifact.input_kind.kind == "spectrogram"
    runner = artifact.runner("ort")
    assert "input_values [batch, 100, 48]" in repr(runner)
    assert runner(inputs("ASTForAudioClassification").numpy()).shape == (2, 5)
    with pytest.raises(DeploytkError, match=r"has shape \[2, 48, 100\]; this model takes input_values \[batch, 100, 48\]"):
        runner(np.zeros((2, 48, 100), np.float32))


def test_an_audio_model_refuses_an_image_size(saved):
    with pytest.raises(DeploytkError, match="`export.img_size` is for image and video models"):
        create_vit(config_from_dict({"model": f"hf:{saved['ASTModel']}", "export": {"img_size": 224}}))


# ---- real files: clips and sounds made here ---------------------------------------------------------------------------


def test_a_clip_gives_frames_evenly_spaced_over_its_length(tmp_path):
    from deploytk.inputs import VideoInput

    for suffix in (".mp4", ".webm", ".avi"):
        frames = write_clip(tmp_path / f"clip{suffix}", count=8)  # brightness steps of 28 levels: the codecs shift a few
        got = VideoInput(4, 3, 32, 32).read(tmp_path / f"clip{suffix}")
        assert [g.shape for g in got] == [(48, 64, 3)] * 4
        levels = [float(f[..., 0].mean()) for f in frames]  # each frame's own brightness (the codecs are lossy)
        nearest = [int(np.argmin([abs(float(g[..., 0].mean()) - v) for v in levels])) for g in got]
        assert nearest == [0, 2, 5, 7], suffix  # linspace(0, 7, 4) rounded


def test_the_saved_processors_are_the_preprocessing(saved, tmp_path):
    from deploytk.inputs.spectrogram import Waveform

    folder = tmp_path / "videomae"
    transformers.VideoMAEForVideoClassification.from_pretrained(saved["VideoMAEForVideoClassification"]).save_pretrained(folder)
    processor = transformers.VideoMAEImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}, image_mean=[0.2] * 3)
    processor.save_pretrained(folder)
    family = adapt(create_vit(config(folder)))
    frames = clip_frames(4)
    torch.testing.assert_close(family.eval_transform()(frames), processor(frames, return_tensors="pt")["pixel_values"][0], rtol=0, atol=0)
    assert family.normalization()[0] == (0.2, 0.2, 0.2)

    folder = tmp_path / "ast"
    transformers.ASTForAudioClassification.from_pretrained(saved["ASTForAudioClassification"]).save_pretrained(folder)
    extractor = transformers.ASTFeatureExtractor(num_mel_bins=48, max_length=100, mean=-3.0)
    extractor.save_pretrained(folder)
    family = adapt(create_vit(config(folder)))
    samples = write_sound(tmp_path / "chord.wav", rate=16000)[:, 0]
    want = extractor(samples, sampling_rate=16000, return_tensors="pt")["input_values"][0]
    torch.testing.assert_close(family.eval_transform()(Waveform(samples, 16000)), want, rtol=0, atol=0)
    resampled = family.eval_transform()(Waveform(samples[::2].copy(), 8000))  # resampled to the extractor's 16 kHz first
    assert resampled.shape == (100, 48)
    transformers.ASTFeatureExtractor(num_mel_bins=64, max_length=100).save_pretrained(folder)
    with pytest.raises(DeploytkError, match="feature extractor makes 100 x 64 spectrograms, but the model is built for 100 x 48"):
        adapt(create_vit(config(folder))).eval_transform()


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clips")
    for i, suffix in enumerate((".mp4", ".webm", ".avi", ".mp4")):
        write_clip(folder / f"clip{i}{suffix}", count=12 + 4 * i, size=(40 + 8 * i, 56))
    return folder


@pytest.fixture(scope="module")
def sounds(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sounds")
    for i, (suffix, rate) in enumerate(((".wav", 16000), (".flac", 22050), (".wav", 44100), (".flac", 8000))):
        write_sound(folder / f"sound{i}{suffix}", seconds=0.6 + 0.2 * i, rate=rate, hertz=(220.0 * (i + 1), 330.0))
    return folder


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize("name, data", [("VideoMAEForVideoClassification", "clips"), ("ASTForAudioClassification", "sounds")])
def test_clips_and_sounds_made_here_validate_on_both_runtimes(name, data, saved, tmp_path, request):
    folder = request.getfixturevalue(data)
    out = tmp_path / "artifact"
    run_export(config(saved[name], "tome", r=4), out)
    for backend in ("ort", "openvino"):
        report, _ = run_validation(out, backend, data=folder, num_samples=4, batch_size=2)
        assert report.passed and report.num_images == 4, (backend, report.to_dict())


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize(
    "name, kind, suffix, noun",
    [("VideoMAEForVideoClassification", "clips", ".mp4", "clip"), ("ASTForAudioClassification", "sounds", ".wav", "sound")],
)
def test_a_corrupt_file_is_refused_by_name_and_nothing_is_written(name, kind, suffix, noun, saved, tmp_path, request):
    import shutil

    from deploytk.quantize import run_quantize

    from helpers import snapshot

    data = tmp_path / kind
    shutil.copytree(request.getfixturevalue(kind), data)
    (data / f"broken{suffix}").write_bytes(b"\x00not a media file\x00" * 64)
    out = tmp_path / "artifact"
    run_export(config(saved[name], "tome", r=4), out)
    before = snapshot(tmp_path)
    with pytest.raises(DeploytkError, match=rf"{noun} {data / f'broken{suffix}'} could not be decoded"):
        run_validation(out, "ort", data=data, num_samples=8, batch_size=2)
    with pytest.raises(DeploytkError, match=rf"{noun} .*broken{suffix} could not be decoded"):
        run_quantize(out, "ort", data=data, num_samples=8, output=tmp_path / "int8")
    assert snapshot(tmp_path) == before


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_a_folder_without_clips_is_refused_naming_what_it_looked_for(saved, tmp_path):
    out = tmp_path / "artifact"
    run_export(config(saved["VideoMAEForVideoClassification"], "tome", r=4), out)
    (tmp_path / "stills").mkdir()
    (tmp_path / "stills" / "a.png").write_bytes(b"")
    with pytest.raises(DeploytkError, match=r"clip folder .*stills holds no clips \(.avi, .mkv, .mov, .mp4, .webm\)"):
        run_validation(out, "ort", data=tmp_path / "stills", num_samples=4)


def test_visualize_refuses_a_kind_it_does_not_draw_by_name(saved, tmp_path, monkeypatch):
    """Every kind today is drawn (tests/analysis/test_visualize_video_audio.py); a kind that is not is refused before
    anything runs."""
    from deploytk.inputs import VideoInput
    from deploytk.visualization import trace

    write_clip(tmp_path / "clip.mp4")
    monkeypatch.setattr(VideoInput, "drawn", False)
    with pytest.raises(DeploytkError, match=r"visualize does not draw clips yet: .* takes clips \(pixel_values \[batch, 4, 3, 32, 32\]\)"):
        trace(config(saved["VideoMAEForVideoClassification"], "tome", r=4), tmp_path / "clip.mp4")


@pytest.mark.slow  # an export and three models over the clips: about a minute on the 2-core machine
def test_eval_reads_a_class_folder_tree_of_clips(saved, tmp_path):
    from deploytk.evaluation.accuracy import evaluate

    for label in range(5):
        (tmp_path / "val" / f"class{label}").mkdir(parents=True)
        write_clip(tmp_path / "val" / f"class{label}" / "a.webm", count=8 + label)
    (tmp_path / "val" / "class0" / "still.png").write_bytes(b"")  # an image is not a clip: left out
    report = evaluate(config(saved["VideoMAEForVideoClassification"], "tome", r=4), tmp_path / "val", batch_size=2)
    assert report["num_images"] == 5 and 0 <= report["exported"]["top1"] <= 1
