"""`deploytk visualize`: source tracking through every method, the picture, the ONNX Runtime choices, bad input."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from deploytk.analysis.token_map import choose_layers, load_sample, png_size, save_figure, track_sources
from deploytk.cli import app
from deploytk.config import config_from_dict
from deploytk.errors import DeploytkError
from deploytk.exporter.pipeline import run_export
from deploytk.files import claim_file
from deploytk.models import build_reference
from deploytk.reducers import METHODS, get_method
from deploytk.visualization import picture, trace, visualize

from helpers import digits_config

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
#: the digits config of each method (every method has one; a new method without one runs on a tiny random ViT)
DIGITS = {"tome": "digits_vit_tome_r4", "mctf": "digits_vit_mctf_r4", "atm": "digits_vit_atm_calibrated"}
TINY = {"model": "vit_tiny_patch16_224", "model_kwargs": {"patch_size": 4, "embed_dim": 32, "num_heads": 2, "num_classes": 10}}


def tiny(merge: dict, depth: int = 4, **model_kwargs):
    kwargs = TINY["model_kwargs"] | {"depth": depth} | model_kwargs
    return config_from_dict({"model": TINY["model"], "model_kwargs": kwargs, "merge": merge, "export": {"img_size": 32, "batch_size": 2}})


def method_config(name: str):
    stem = DIGITS.get(name, f"digits_vit_{name}_k70")
    if (ROOT / "export_configs" / f"{stem}.yaml").is_file():
        return digits_config(stem)
    method = get_method(name)
    return tiny({"method": name, **({"r": 4} if method.uses_r else {})}, depth=12)


@pytest.fixture(scope="module")
def digit_png(tmp_path_factory):
    """A digit of scikit-learn's 8x8 set as the digits model's 32x32 RGB PNG (as `deploytk eval` reads them)."""
    from sklearn.datasets import load_digits

    path = tmp_path_factory.mktemp("img") / "digit.png"
    pixels = (load_digits().images[0] / 16 * 255).astype(np.uint8)
    Image.fromarray(pixels).resize((32, 32), Image.BICUBIC).convert("RGB").save(path)
    return path


@pytest.fixture(scope="module")
def noise_png(tmp_path_factory):
    path = tmp_path_factory.mktemp("img") / "noise.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(path)
    return path


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_draws_a_png_whose_panels_differ(name, digit_png, tmp_path):
    traced = trace(method_config(name), digit_png)  # what `visualize` runs, without building the model twice here
    sources = traced.sources
    layers = choose_layers(None, sources)
    assert len(layers) >= min(2, len(sources.reducing_blocks)) and layers[-1] == sources.reducing_blocks[-1]  # VisionZip: one block
    panels, titles, caption = picture(traced, layers)
    out = tmp_path / f"{name}.png"
    assert save_figure(panels, titles, caption, claim_file(out, "deploytk visualize")) == png_size(1 + len(layers))
    with Image.open(out) as png:
        assert png.size == png_size(1 + len(layers))
    assert [f.name for f in tmp_path.iterdir()] == [out.name]  # nothing else (no temp file) left
    for a, b, la, lb in zip(panels[1:], panels[2:], layers, layers[1:], strict=False):
        assert a.shape == b.shape and np.any(a != b), f"{name}: the panels of blocks {la} and {lb} are the same"
    assert sources.protected + sources.grid[0] * sources.grid[1] > sources.tokens(layers[0])
    assert len(layers) == 1 or sources.tokens(layers[0]) > sources.tokens(layers[-1])
    for b in layers:  # every kept patch is in a token that exists, the protected prefix aside
        owner = sources.owner[b]
        assert owner.max() < sources.tokens(b) and (owner[owner >= 0] >= sources.protected).all()
    last = sources.summary(layers[-1])
    kind = get_method(name).kind
    assert last["soft_assignment"] == (kind == "learned merging") == ("soft merge" in caption)
    if kind == "pruning":
        assert last["patches_dropped"] > 0 and "dimmed: dropped" in caption
    if "fusion" in kind:
        assert last["patches_fused"] > 0 and "hatched: fused" in caption
    # ToMe, MCTF, crucial: nothing is dropped, every token holds patches (ATM's last block keeps the class token only)
    if kind == "merging" and name != "atm":
        assert last["patches_dropped"] == 0 and last["tokens_with_patches"] == last["tokens"] - sources.protected


@pytest.mark.parametrize(
    "merge",
    [
        {"method": "tome", "r": 6},
        {"method": "topk", "options": {"layers": [1, 2], "keep_rate": 0.6}},
        {"method": "evit", "options": {"layers": [1, 2], "keep_rate": 0.6}},
    ],
    ids=["tome", "topk", "evit"],
)
def test_source_maps_equal_token_aggregate_of_one_hot_sources(merge, digit_png):
    """An independent composition (ToMe's ``trace_source`` idea): one-hot patch sources pushed through the method's own
    choices with TokenAggregate; a patch's token is the one whose source row holds it, dropped where none does."""
    model = build_reference(tiny(merge))
    x = load_sample(digit_png, model.family)
    calls = []
    model.dest_hook = lambda op, args, dest: calls.append(dest) or dest
    with torch.no_grad():
        model(x)
    model.dest_hook = None
    s = model.schedule
    outs = [*s.tokens[1:], s.tokens_out]
    p, patches = s.protected, s.tokens[0] - s.protected
    src = torch.zeros(1, s.tokens[0], patches)
    src[0, p:] = torch.eye(patches)
    expected, it = {}, iter(calls)
    for i, n_out in enumerate(outs):
        if n_out < s.tokens[i]:
            src = torch.ops.deploytk.token_aggregate(src, torch.ones(1, src.shape[1], 1), next(it), n_out, False)
            expected[i] = torch.where(src[0].sum(0) > 0, src[0].argmax(0), -1).numpy()
    sources = track_sources(model, x)
    assert expected and sources.reducing_blocks == sorted(expected)
    for i, owner in expected.items():
        np.testing.assert_array_equal(sources.owner[i], owner, err_msg=f"block {i}")


def test_two_flat_halves_merge_within_their_half_first():
    """Left half one flat colour, right half another, no position embedding: every patch of a half has the same embedding,
    so ToMe's best matches are within a half (cosine 1). A token mixing both halves may only appear in a block where fewer
    A tokens have a same-half B partner than the block merges (ToMe's bipartite split: A even, B odd positions)."""
    cfg = tiny({"method": "tome", "r": [16, 16, 16, 8, 4, 2, 1]}, depth=7, pos_embed="none")
    model = build_reference(cfg)
    x = torch.empty(1, 3, 32, 32)
    x[..., :16] = torch.tensor([1.5, -1.0, -0.5])[:, None, None]
    x[..., 16:] = torch.tensor([-1.2, 0.8, 1.6])[:, None, None]
    sources = track_sources(model, x)
    p, (rows, cols) = sources.protected, sources.grid
    half = np.tile(np.arange(cols) >= cols // 2, rows)  # per patch: right half?
    halves_in = [{p + patch: {bool(right)} for patch, right in enumerate(half)}]  # token -> the halves of its patches
    mixed_at = None
    for i in range(sources.depth):
        halves = {}
        for patch, t in enumerate(sources.owner[i]):
            halves.setdefault(int(t), set()).add(bool(half[patch]))
        before = halves_in[-1]
        if all(len(h) == 1 for h in before.values()):  # every token entering block i is pure
            a = [t for t in before if t % 2 == 0]
            b = [t for t in before if t % 2 == 1]
            same_half_sources = sum(any(before[u] == before[t] for u in b) for t in a)
            r = model.schedule.effective_r[i]
            if any(len(h) > 1 for h in halves.values()):
                mixed_at = i
                assert same_half_sources < r, f"block {i} mixed the halves while {same_half_sources} same-half merges (>= r={r}) were left"
        halves_in.append(halves)
    assert mixed_at is not None and mixed_at >= 2, "ToMe down to one patch token must mix the halves, only when it has to"
    assert sources.tokens(sources.depth - 1) == p + 1


TINY_TOME = {"method": "tome", "r": 6}
TINY_TOPK = {"method": "topk", "options": {"layers": [1, 2], "keep_rate": 0.6}}


@pytest.fixture(scope="module")
def tiny_tome_export(tmp_path_factory):
    """ToMe on a tiny random ViT, exported once (read back with --artifacts)."""
    out = tmp_path_factory.mktemp("art") / "tome"
    run_export(tiny(TINY_TOME), out)
    return out


def assert_same_maps(a, b):
    assert a.reducing_blocks == b.reducing_blocks
    np.testing.assert_array_equal(a.owner, b.owner)
    np.testing.assert_array_equal(a.fused, b.fused)


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_onnx_runtime_choices_give_the_reference_maps_tome(tiny_tome_export, noise_png, tmp_path):
    cfg = tiny(TINY_TOME)
    reference = trace(cfg, noise_png)
    from_ort = trace(cfg, noise_png, backend="ort", artifacts=tiny_tome_export)
    assert from_ort.backend == "ort" and len(from_ort.sources.reducing_blocks) == 4
    assert all(r.dest.dtype == np.int64 for r in from_ort.sources.records)  # read from ONNX Runtime's outputs
    assert_same_maps(from_ort.sources, reference.sources)
    report = visualize(cfg, noise_png, output=tmp_path / "ort.png", backend="ort", artifacts=tiny_tome_export)
    assert report["backend"] == "ort" and report["layers"] == [reference.sources.summary(b) for b in (0, 1, 2, 3)]
    assert "choices of ort (the exported graph)" in report["caption"]


def test_onnx_runtime_choices_give_the_reference_maps_topk(noise_png):
    cfg = tiny(TINY_TOPK)
    reference = trace(cfg, noise_png)
    from_ort = trace(cfg, noise_png, backend="ort")  # exported to a temporary directory
    assert_same_maps(from_ort.sources, reference.sources)
    assert from_ort.sources.reducing_blocks == [1, 2] and (from_ort.sources.owner[2] < 0).sum() > 0


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_artifacts_of_another_config_are_refused(tiny_tome_export, noise_png, tmp_path):
    with pytest.raises(DeploytkError, match="was not exported from the config: `merge.method` is 'tome' there but 'topk' in the config"):
        visualize(tiny(TINY_TOPK), noise_png, output=tmp_path / "b.png", backend="ort", artifacts=tiny_tome_export)
    assert not (tmp_path / "b.png").exists()


def test_an_export_s_folder_is_a_model_to_visualize(tiny_tome_export, noise_png, tmp_path):
    """Issue 53: `deploytk.visualize("artifact_dir", ...)` looked the folder up as a timm name. An export's folder (str or
    Path) draws its reference's choices, or with a runtime its own graph's; the CLI takes the folder as CONFIG."""
    import deploytk

    want = [trace(tiny(TINY_TOME), noise_png).sources.summary(b) for b in (0, 1, 2, 3)]
    for model, backend in ((str(tiny_tome_export), "ort"), (tiny_tome_export, "reference")):
        out = tmp_path / f"{backend}.png"
        report = deploytk.visualize(model, noise_png, output=out, backend=backend)
        assert (report["config"], report["backend"], report["method"]) == (str(tiny_tome_export), backend, "tome")
        assert report["artifacts"] == (str(tiny_tome_export) if backend == "ort" else None)
        assert report["layers"] == want and out.is_file()
    result = invoke(tiny_tome_export, "--image", noise_png, "--backend", "ort", "--output", tmp_path / "cli.png", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["layers"] == want and (tmp_path / "cli.png").is_file()


def test_an_export_s_folder_keeps_its_schedule_and_a_plain_folder_is_refused(tiny_tome_export, noise_png, tmp_path):
    import deploytk

    out = tmp_path / "out"
    with pytest.raises(DeploytkError, match=r"whose method and schedule were fixed when it was exported: `r=` cannot change them"):
        deploytk.visualize(tiny_tome_export, noise_png, output=out / "m.png", r=2)
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(DeploytkError) as refused:
        deploytk.visualize(plain, noise_png, output=out / "m.png")
    assert f"`model` is the folder {plain}, which holds no manifest.json: it is not a deploytk export" in str(refused.value)
    assert "unknown timm model" not in str(refused.value)
    cli = "is an export, whose model, weights and schedule were fixed when it was exported: --checkpoint cannot change them"
    fails(
        tiny_tome_export,
        "--image",
        noise_png,
        "--checkpoint",
        tmp_path / "w.safetensors",
        "--output",
        out / "m.png",
        match=cli,
        out_dir=out,
    )
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["plain"]


def invoke(*args):
    return runner.invoke(app, ["visualize", *[str(a) for a in args]])


def test_cli_json_and_a_layer_before_any_reduction(digit_png, tmp_path):
    out = tmp_path / "evit.png"
    result = invoke(
        ROOT / "export_configs" / "digits_vit_evit_k70.yaml", "--image", digit_png, "--layers", "0,3,9", "--output", out, "--json"
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["output"] == str(out) and report["backend"] == "reference" and report["method"] == "evit"
    assert [(layer["block"], layer["tokens"]) for layer in report["layers"]] == [(0, 65), (3, 47), (9, 26)]
    assert report["layers"][0]["tokens_with_patches"] == 64 and report["layers"][2]["patches_fused"] > 0
    with Image.open(out) as png:
        assert png.size == png_size(4)


def fails(*args, match, out_dir):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert match in " ".join(result.output.split()), result.output
    assert not (out_dir.exists() and any(out_dir.iterdir())), "nothing may be written"


@pytest.fixture(scope="module")
def tiny_yaml(tmp_path_factory):
    """Config files of a tiny random ViT (4 blocks) for the bad-input runs: ToMe and PatchMerger."""
    folder = tmp_path_factory.mktemp("cfg")
    for name, merge in (("tome", TINY_TOME), ("patchmerger", {"method": "patchmerger", "options": {"layers": [1, 2]}})):
        data = {"model": TINY["model"], "model_kwargs": TINY["model_kwargs"] | {"depth": 4}, "merge": merge, "export": {"img_size": 32}}
        (folder / f"{name}.yaml").write_text(json.dumps(data))  # JSON is YAML
    return folder


@pytest.mark.parametrize(
    "extra,match",
    [
        (
            ["--layers", "1,4"],
            "--layers 1,4: block 4 does not exist; block indices are 0-based, from 0 to 3 for the 4 blocks this model's graph runs",
        ),
        (["--layers", "-1"], "block -1 does not exist; block indices are 0-based, from 0 to 3"),
        (
            ["--layers", "three"],
            "--layers 'three' is not a list of block indices: give 0-based block indices, comma-separated (e.g. 3,6,11)",
        ),
        (["--backend", "trt"], "--backend 'trt': allowed reference, ort, ort-cuda, openvino"),
        (["--colors", "pastel"], "--colors 'pastel': allowed mean, random"),
        (["--artifacts", "somewhere"], "--artifacts is read by a runtime (--backend ort, ...)"),
    ],
)
def test_bad_options(extra, match, digit_png, tmp_path, tiny_yaml):
    out = tmp_path / "out"
    fails(tiny_yaml / "tome.yaml", "--image", digit_png, "--output", out / "m.png", *extra, match=match, out_dir=out)


def test_bad_images_and_output(tmp_path, digit_png, tiny_yaml):
    out, tome = tmp_path / "out", tiny_yaml / "tome.yaml"
    missing = "none.png does not exist (--image): give a PNG or JPG file"
    fails(tome, "--image", tmp_path / "none.png", "--output", out / "m.png", match=missing, out_dir=out)
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    fails(tome, "--image", broken, "--output", out / "m.png", match="could not be read (cannot identify image file", out_dir=out)
    not_png = "m.jpg: visualize writes a PNG; give a file name ending in .png"
    fails(tome, "--image", digit_png, "--output", out / "m.jpg", match=not_png, out_dir=out)


def test_soft_merges_have_no_runtime_choices_to_show(digit_png, tmp_path, tiny_yaml):
    config = tiny_yaml / "patchmerger.yaml"
    match = "method patchmerger makes no discrete choice in the graph"
    fails(config, "--image", digit_png, "--backend", "ort", "--output", tmp_path / "m.png", match=match, out_dir=tmp_path)


def test_without_matplotlib_the_error_says_how_to_install_it(monkeypatch, digit_png, tmp_path, tiny_yaml):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # importing it now raises ImportError
    fails(
        tiny_yaml / "tome.yaml",
        "--image",
        digit_png,
        "--output",
        tmp_path / "m.png",
        match="matplotlib, which is not installed. Install it with `pip install 'deploytk[bench]'`",
        out_dir=tmp_path,
    )


def test_a_failing_write_leaves_nothing(monkeypatch, digit_png, tmp_path, tiny_yaml):
    from matplotlib.figure import Figure

    def broken_savefig(self, path, **kwargs):
        Path(path).write_bytes(b"half a png")
        raise DeploytkError("disk full (simulated)")

    monkeypatch.setattr(Figure, "savefig", broken_savefig)
    fails(tiny_yaml / "tome.yaml", "--image", digit_png, "--output", tmp_path / "m.png", match="disk full (simulated)", out_dir=tmp_path)


def test_the_token_set_an_output_gives_is_its_last_panel(noise_png):
    """VisionZip's 10 tokens at layer -2 (the class token kept): the last block drawn is the graph's output, each of its tokens
    covering the patches it holds; the dominant tokens hold one patch each, the contextual ones the rest."""
    merge = {"method": "visionzip", "prop_attn": False, "options": {"dominant": 6, "contextual": 4}}
    cfg = config_from_dict(
        {**TINY, "model_kwargs": TINY["model_kwargs"] | {"depth": 4}, "merge": merge}
        | {"export": {"img_size": 32, "output": "tokens", "feature_layer": -2, "keep_prefix_tokens": True}}
    )
    traced = trace(cfg, noise_png)
    layers = choose_layers(None, traced.sources)
    assert layers == [2]
    _, titles, _ = picture(traced, layers)
    assert titles[-1].endswith("= output tokens, K = 10")
    owner = traced.sources.owner[-1]
    held = np.bincount(owner, minlength=10)
    assert held[0] == 0 and (held[1:6] == 1).all() and held[6:].sum() == 64 - 5  # class token, 5 dominant patches, 4 contextual


def test_a_feature_layer_output_is_drawn_up_to_its_last_block(noise_png):
    base = {"model": "deit_tiny_patch16_224", "model_kwargs": {"depth": 6}, "merge": {"method": "tome", "r": 2}}
    cfg = config_from_dict(base | {"export": {"img_size": 32, "output": "tokens", "feature_layer": 3}})
    assert trace(cfg, noise_png).sources.depth == 3  # the graph runs blocks 0..2
    with pytest.raises(DeploytkError, match=r"block 4 does not exist; .* from 0 to 2 for the 3 blocks this model's graph runs"):
        trace(cfg, noise_png, layers=[1, 4])
    with pytest.raises(DeploytkError, match=r"`export.feature_layer` = 0: the graph ends at the embedding, before any block"):
        trace(config_from_dict(base | {"export": {"img_size": 32, "output": "tokens", "feature_layer": 0}}), noise_png)
