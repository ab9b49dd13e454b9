"""`deploytk visualize` on video (VideoMAE, ViViT) and audio (AST) models: small transformers models built from configs
(seeded random weights, save_pretrained, `model: hf:<folder>`), a clip and a sound written by the tests.

The picture's layout is checked against an independent account of it: a clip's tubelet groups side by side (the first
frame of each tubelet), a spectrogram with its lowest mel bins at the bottom and each overlapping AST patch in its
stride cell; a pixel inside a patch has its token's colour (``colors=random``: the palette's colour of the token the
patch -> token map names); a runtime's choices equal the reference's; a corrupt file is refused by name, nothing written.
"""

import json

import numpy as np
import pytest
import transformers
from PIL import Image
from typer.testing import CliRunner

from deploytk.analysis.token_map import BlockRecord, Sources, draw, palette, panel_scale, png_size
from deploytk.cli import app
from deploytk.config import config_from_dict
from deploytk.exporter.pipeline import run_export
from deploytk.visualization import canvas, picture, trace, visualize

from helpers import seeded_init
from helpers.media import write_clip, write_sound

LAYERS = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=2, intermediate_size=128, num_labels=5)
VIDEOMAE = dict(image_size=32, patch_size=8, tubelet_size=2, **LAYERS)
AST = dict(patch_size=16, frequency_stride=10, time_stride=10, max_length=100, num_mel_bins=48, **LAYERS)
MODELS = {
    "videomae4": ("VideoMAEForVideoClassification", "VideoMAEConfig", VIDEOMAE | {"num_frames": 4}),
    "videomae8": ("VideoMAEForVideoClassification", "VideoMAEConfig", VIDEOMAE | {"num_frames": 8}),
    "vivit": ("VivitForVideoClassification", "VivitConfig", dict(image_size=32, num_frames=4, tubelet_size=[2, 8, 8], **LAYERS)),
    "ast": ("ASTForAudioClassification", "ASTConfig", AST),
}
runner = CliRunner()


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """The saved models, a 16-frame clip (a white square moving over a gradient) and a one-second chord."""
    root = tmp_path_factory.mktemp("media")
    folders = {}
    for i, (name, (model_class, config_class, settings)) in enumerate(MODELS.items()):
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**settings))
        seeded_init(model, seed=30 + i).save_pretrained(root / name)
        folders[name] = root / name
    write_clip(root / "clip.mp4", count=16)
    write_sound(root / "chord.wav")
    return folders | {"clip": root / "clip.mp4", "sound": root / "chord.wav", "root": root}


def config(folder, r=6):
    return config_from_dict({"model": f"hf:{folder}", "export": {"img_size": None, "batch_size": 1}, "merge": {"method": "tome", "r": r}})


def check_token_colours(panel, sources, block, centre):
    """Every patch's centre pixel (``centre(patch)`` -> (y, x) in the canvas) in the palette colour of its token."""
    colours = (palette(sources.tokens(block)) * 255).round().astype(np.uint8)
    owner = sources.owner[block]
    for patch in range(sources.patches):
        y, x = centre(patch)
        assert (panel[y, x] == colours[owner[patch]]).all(), (
            f"block {block}, patch {patch}: {panel[y, x]} is not token {owner[patch]}'s colour"
        )


@pytest.mark.parametrize("name, frames", [("videomae4", 4), ("videomae8", 8), ("vivit", 4)])
def test_a_clip_is_drawn_group_by_group_each_patch_in_its_tokens_colour(name, frames, media, tmp_path):
    cfg = config(media[name])
    traced = trace(cfg, media["clip"])
    family, sources = traced.model.family, traced.sources
    groups, (rows, cols), tubelet = frames // 2, family.grid_size, 2
    assert sources.time_groups == groups and sources.patches == groups * rows * cols
    layers = sources.reducing_blocks
    panels, titles, caption = picture(traced, layers, colors="random")
    laid = canvas(family, traced.image)
    s = panel_scale(laid)
    h, w = 32, 32
    gap = (laid.patch.shape[1] - groups * w) // (groups - 1)
    assert laid.patch.shape == (h, groups * w + (groups - 1) * gap) and gap >= 1  # the groups side by side, a gap between
    assert all(p.shape == (h * s, laid.patch.shape[1] * s, 3) for p in panels)
    decoded = family.input_kind.read(media["clip"])  # the frames the model got, before its processor
    for g in range(groups):  # the input panel shows the first frame of each tubelet as the model saw it (mean/std undone)
        resized = Image.fromarray(decoded[g * tubelet]).resize((42, 32), Image.BICUBIC)  # 48x64: short side to 32, centre crop
        want = np.asarray(resized, dtype=np.float64)[:, 5:37] / 255
        x = g * (w + gap) * s
        got = panels[0][: h * s : s, x : x + w * s : s] / 255
        assert np.abs(got - want).mean() < 0.03, f"group {g}: the frame drawn is not frame {g * tubelet} of the clip"
    ph = h // rows

    def centre(patch):
        g, rest = divmod(patch, rows * cols)
        r, c = divmod(rest, cols)
        return (r * ph + ph // 2) * s + s // 2, (g * (w + gap) + c * ph + ph // 2) * s + s // 2

    for panel, block in zip(panels[1:], layers, strict=True):
        check_token_colours(panel, sources, block, centre)
    assert titles[0].startswith(f"input: frames {', '.join(str(g * tubelet) for g in range(groups))} (the first of each 2-frame tubelet)")
    assert "a token can span frames" in caption and "grey" not in caption


def test_a_token_that_spans_frames_has_one_colour_in_each(media):
    """ToMe's bipartite split never pairs a tubelet with the same place in the next group (time first, 16 patches a group:
    the same parity, both in A or both in B), so a merge across frames is made here by hand: patch 16 (group 1, row 0,
    col 0) into patch 0's token."""
    traced = trace(config(media["videomae4"]), media["clip"])
    dest = np.concatenate([np.arange(16), [0], np.arange(16, 31)])
    merged = Sources((4, 4), 0, [BlockRecord(0, 32, 31, kind="match", op="tome_match", dest=dest)], time_groups=2)
    laid = canvas(traced.model.family, traced.image)
    panel = draw(laid, merged, 0, colors="random")
    s, gap = panel_scale(laid), laid.patch.shape[1] - 64
    first, second = panel[4 * s, 4 * s], panel[4 * s, (32 + gap + 4) * s]  # the centres of patch 0 and patch 16
    assert (first == second).all() and (first == (palette(31)[0] * 255).round()).all()
    assert not (panel[4 * s, 12 * s] == first).all()  # patch 1 is a token of its own


def test_the_picture_widens_with_the_tubelet_groups_one_row_per_block(media, tmp_path):
    sizes = {}
    for name in ("videomae4", "videomae8"):
        out = tmp_path / f"{name}.png"
        report = visualize(config(media[name]), media["clip"], output=out, layers="1,3")
        with Image.open(out) as png:
            sizes[name] = png.size
        assert tuple(report["png_size"]) == png.size
        assert report["patches"] == {"videomae4": 32, "videomae8": 64}[name]
    (w4, h4), (w8, h8) = sizes["videomae4"], sizes["videomae8"]
    assert w8 > w4 * 1.5 and h8 == h4  # twice the frames side by side: wider rows of the same height
    assert (w8, h8) == png_size(3, (4 * 32 + 3 * 2) / 32)  # 3 rows: the input, blocks 1 and 3


def test_a_spectrogram_has_low_frequencies_at_the_bottom_and_each_patch_in_its_stride_cell(media):
    traced = trace(config(media["ast"]), media["sound"])
    family, sources = traced.model.family, traced.sources
    frequencies, times = family.grid_size
    assert (frequencies, times) == ((48 - 16) // 10 + 1, (100 - 16) // 10 + 1) == (4, 9)
    layers = sources.reducing_blocks
    panels, titles, caption = picture(traced, layers, colors="random")
    s = panel_scale(canvas(family, traced.image))
    assert panels[0].shape == (48 * s, 100 * s, 3)  # mel bins down, time frames across
    # the loudest mel bin of the chord (its 440 and 660 Hz, low) is the brightest row, counted from the bottom
    loudest = int(traced.image[0].numpy().mean(axis=0).argmax())
    luma = (panels[0][::s, ::s].astype(float) @ [0.299, 0.587, 0.114]).mean(axis=1)  # per row of the picture, top first
    assert loudest < 24 and luma[47 - loudest] >= 0.9 * luma.max() and luma[47 - loudest] > 2 * luma[loudest]  # not upside down

    def centre(patch):  # patch (f, t) is drawn in its own 10 x 10 cell: mel bins 10f..10f+9, frames 10t..10t+9
        f, t = divmod(patch, times)
        return (47 - (10 * f + 5)) * s + s // 2, (10 * t + 5) * s + s // 2

    for panel, block in zip(panels[1:], layers, strict=True):
        check_token_colours(panel, sources, block, centre)
        top, right = panel[: 2 * s], panel[:, 96 * s :]  # mel bins 46, 47 and frames 96..99: in no patch (16 + 3 x 10 = 46)
        for grey in (top, right):
            assert (grey[..., 0] == grey[..., 1]).all() and (grey[..., 1] == grey[..., 2]).all()
    assert titles[0] == "input: log-mel spectrogram, 4x9 patches (frequency x time)" and "grey: in no patch" in caption


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize("name, sample, backend", [("videomae4", "clip", "ort"), ("ast", "sound", "openvino")])
def test_a_runtime_makes_the_references_choices(name, sample, backend, media, tmp_path):
    cfg = config(media[name])
    reference = trace(cfg, media[sample])
    run_export(cfg, tmp_path / "artifact")  # once, read by both (a temporary export is the same graph)
    runtime = trace(cfg, media[sample], backend=backend, artifacts=tmp_path / "artifact")
    assert runtime.sources.reducing_blocks == reference.sources.reducing_blocks == [0, 1, 2, 3]
    np.testing.assert_array_equal(runtime.sources.owner, reference.sources.owner)
    out = tmp_path / f"{name}.png"
    report = visualize(cfg, media[sample], output=out, backend=backend, artifacts=tmp_path / "artifact")
    assert out.is_file() and report["backend"] == backend and f"choices of {backend} (the exported graph)" in report["caption"]


def fails(args, match, out):
    result = runner.invoke(app, ["visualize", *[str(a) for a in args]])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert match in " ".join(result.output.split()), result.output
    assert not out.exists(), "nothing may be written"


@pytest.mark.parametrize("name, sample", [("videomae4", "clip.mp4"), ("ast", "chord.wav")])
def test_a_corrupt_or_missing_file_is_refused_by_name_and_nothing_is_written(name, sample, media, tmp_path):
    yaml = tmp_path / "config.yaml"
    yaml.write_text(json.dumps({"model": f"hf:{media[name]}", "export": {"img_size": None}, "merge": {"method": "tome", "r": 4}}))
    broken = tmp_path / sample
    broken.write_bytes(b"not a media file at all" * 40)
    out = tmp_path / "out" / "m.png"
    noun, decoder = ("clip", "PyAV") if name.startswith("video") else ("sound", "soundfile")
    fails([yaml, "--image", broken, "--output", out], f"{noun} {broken} could not be decoded (", out)
    fails(
        [yaml, "--image", broken, "--output", out], f"--image takes a {'video' if noun == 'clip' else 'sound'} file {decoder} decodes", out
    )
    missing = tmp_path / f"none{broken.suffix}"
    fails([yaml, "--image", missing, "--output", out], f"{noun} {missing} does not exist (--image): give a", out)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("shape", [(128, 1024), (224, 8 * 224 + 7 * 14), (32, 66)], ids=["AST-1024", "VideoMAE-B-16", "tiny-clip"])
def test_the_png_never_shrinks_a_wide_panel(shape):
    """A panel shown in fewer pixels than it has loses its one-pixel token boundaries (a full AST's lines across time
    vanished so): every wide panel, at its scale, fits the width its row gets in the PNG."""
    from deploytk.inputs import Canvas

    laid = Canvas(np.zeros((*shape, 3)), np.zeros(shape, dtype=np.int64), "")
    s = panel_scale(laid)
    width, _ = png_size(2, shape[1] / shape[0])
    assert shape[1] * s <= 0.96 * width and (s > 1 or min(shape) >= 224 or shape[1] * 2 > 0.96 * width)
