"""The multi-scale ViT family ("Multi-Scale And Token Mergence", section 3.4): a digits-sized model with seeded random
weights (12 blocks, width 48, patch 4, 32 px: an 8x8 and a 4x4 token grid).

- its forward equals Eq. 5 and 6 written out here with torch.nn.functional from the checkpoint keys alone (2x2 means
  and nearest upsampling as reshapes), for both low-scale embeddings;
- with no reduction, the reference and the exported graph (ONNX Runtime, OpenVINO) equal that forward within 1e-5;
  patch features equal the model's own final-normed patch tokens; with crucial mergence it validates by default;
- parameter and fusion FLOP counts follow the modules' formulas (DeiT-T/S/B widths), and bad settings are refused
  with what to change.
"""

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from deploytk.analysis.inspect import inspect_config
from deploytk.analysis.token_map import track_sources
from deploytk.backends import get_backend
from deploytk.backends.ort import ort_session
from deploytk.config import config_from_dict, load_config
from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import Artifact
from deploytk.exporter.pipeline import run_export
from deploytk.merging.merged_vit import MergedViT
from deploytk.models import build_reference, create_vit
from deploytk.validate.validator import run_validation

from helpers import seeded_init

KWARGS = {"patch_size": 4, "embed_dim": 48, "num_heads": 2, "num_classes": 10}
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def config(method="tome", options=None, r=0, output=None, img_size=32, feature_layer=None, **model_kwargs):
    merge = {"method": method, "options": options or {}} | ({"r": r} if method == "tome" else {})
    export = {"img_size": img_size, "batch_size": 2} | ({"output": output} if output else {})
    export |= {"feature_layer": feature_layer} if feature_layer is not None else {}
    return config_from_dict(
        {"model": "multiscale:vit_tiny_patch16_224", "model_kwargs": KWARGS | model_kwargs, "export": export, "merge": merge}
    )


def images(n=2, seed=5):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((n, 3, 32, 32)).astype(np.float32))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A seeded state dict of the digits-sized multi-scale model (the default, shared low-scale embedding), as a .safetensors file."""
    model = seeded_init(create_vit(config()), seed=7)
    path = tmp_path_factory.mktemp("ms") / "multiscale.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def paper_forward(s: dict, x: torch.Tensor, *, heads=2, depth=12, fusion=3, patch=4, shared=True, eps=1e-6) -> torch.Tensor:
    """Logits of Eq. 5 and 6 from the state dict ``s``: X_h + UP(MHSA(DOWN(X_h))) in the first ``fusion`` blocks (the
    low scale a plain block with the same weights), then X = PEG(X_h + LKA(UP(X_l))), then plain blocks."""

    def ln(t, key):
        return F.layer_norm(t, t.shape[-1:], s[f"{key}.weight"], s[f"{key}.bias"], eps)

    def lin(t, key):
        return F.linear(t, s[f"{key}.weight"], s[f"{key}.bias"])

    def mhsa(t, i):
        b, n, c = t.shape
        q, k, v = lin(t, f"blocks.{i}.attn.qkv").reshape(b, n, 3, heads, c // heads).permute(2, 0, 3, 1, 4)
        a = ((q @ k.transpose(-1, -2)) * (c // heads) ** -0.5).softmax(-1)
        return lin((a @ v).transpose(1, 2).reshape(b, n, c), f"blocks.{i}.attn.proj")

    def mlp(t, i):
        return lin(F.gelu(lin(t, f"blocks.{i}.mlp.fc1")), f"blocks.{i}.mlp.fc2")

    def tokens(grid_map, cls, pos):
        return torch.cat([s[cls].expand(grid_map.shape[0], -1, -1), grid_map.flatten(2).transpose(1, 2)], 1) + s[pos]

    b, g = x.shape[0], x.shape[-1] // patch
    h = g // 2
    high = tokens(F.conv2d(x, s["patch_embed.proj.weight"], s["patch_embed.proj.bias"], stride=patch), "cls_token", "pos_embed")
    if shared:
        half = x.reshape(b, 3, x.shape[2] // 2, 2, x.shape[3] // 2, 2).mean((3, 5))
        low_map = F.conv2d(half, s["patch_embed.proj.weight"], s["patch_embed.proj.bias"], stride=patch)
    else:
        low_map = F.conv2d(x, s["patch_embed_low.proj.weight"], s["patch_embed_low.proj.bias"], stride=2 * patch)
    low = tokens(low_map, "cls_token_low", "pos_embed_low")
    c = high.shape[-1]
    for i in range(fusion):
        pooled = high[:, 1:].reshape(b, h, 2, h, 2, c).mean((2, 4)).reshape(b, h * h, c)
        out = mhsa(ln(torch.cat([high[:, :1], pooled], 1), f"blocks.{i}.norm1"), i)
        up = out[:, 1:].reshape(b, h, 1, h, 1, c).expand(b, h, 2, h, 2, c).reshape(b, g * g, c)
        high = high + torch.cat([out[:, :1], up], 1)
        high = high + mlp(ln(high, f"blocks.{i}.norm2"), i)
        low = low + mhsa(ln(low, f"blocks.{i}.norm1"), i)
        low = low + mlp(ln(low, f"blocks.{i}.norm2"), i)
    low_grid = low[:, 1:].transpose(1, 2).reshape(b, c, h, h).repeat_interleave(2, 2).repeat_interleave(2, 3)
    low_grid = F.conv2d(low_grid, s["fusion.up.weight"], s["fusion.up.bias"], padding=1, groups=c)
    attn = F.conv2d(low_grid, s["fusion.lka.conv0.weight"], s["fusion.lka.conv0.bias"], padding=2, groups=c)
    attn = F.conv2d(attn, s["fusion.lka.conv_spatial.weight"], s["fusion.lka.conv_spatial.bias"], padding=9, dilation=3, groups=c)
    attn = F.conv2d(attn, s["fusion.lka.conv1.weight"], s["fusion.lka.conv1.bias"])
    fused = high[:, 1:].transpose(1, 2).reshape(b, c, g, g) + low_grid * attn
    fused = fused + F.conv2d(fused, s["fusion.peg.proj.weight"], s["fusion.peg.proj.bias"], padding=1, groups=c)
    z = torch.cat([high[:, :1] + low[:, :1], fused.flatten(2).transpose(1, 2)], 1)
    for i in range(fusion, depth):
        z = z + mhsa(ln(z, f"blocks.{i}.norm1"), i)
        z = z + mlp(ln(z, f"blocks.{i}.norm2"), i)
    return lin(ln(z, "norm")[:, 0], "head")


@pytest.mark.parametrize("embedding", ["own", "shared"])
def test_forward_and_reference_equal_the_papers_equations(embedding):
    model = seeded_init(create_vit(config(low_scale_embedding=embedding)), seed=3)
    state = model.state_dict()
    assert ("patch_embed_low.proj.weight" in state) == (embedding == "own")
    x = images()
    with torch.no_grad():
        want = paper_forward(state, x, shared=embedding == "shared")
        torch.testing.assert_close(model(x), want, rtol=0, atol=1e-5)
        torch.testing.assert_close(MergedViT.dense(model, prop_attn=False)(x), want, rtol=0, atol=1e-5)
        assert (want - paper_forward(state, x, shared=embedding == "shared", fusion=2)).abs().max() > 1e-3  # the check can fail


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_no_reduction_exports_equal_to_the_forward_on_onnxruntime_and_openvino(checkpoint, tmp_path):
    cfg = config().model_copy(update={"checkpoint": str(checkpoint)})
    x = images()
    with torch.no_grad():
        want = paper_forward(create_vit(cfg).state_dict(), x).numpy()
    run_export(cfg, tmp_path / "a")
    got = ort_session(tmp_path / "a" / "model.onnx").run(None, {"input": x.numpy()})[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    loaded = get_backend("openvino").load(Artifact.open(tmp_path / "a"), [2])
    np.testing.assert_allclose(next(iter(loaded.run(x.numpy()).values())), want, rtol=0, atol=1e-5)


def test_patch_features_without_reduction_are_the_models_own_patch_tokens(checkpoint):
    cfg = config(output="patch_features").model_copy(update={"checkpoint": str(checkpoint)})
    reference = build_reference(cfg)
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(reference(x), reference.vit.forward_features(x)[:, 1:], rtol=0, atol=1e-5)


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_crucial_mergence_exports_and_validates_by_default(checkpoint, tmp_path):
    cfg = config("crucial", {"layers": [3, 6, 9], "keep_rate": 0.7}).model_copy(update={"checkpoint": str(checkpoint)})
    manifest = run_export(cfg, tmp_path / "c")
    assert manifest["schedule"]["tokens_per_layer"] == [65, 65, 65, 65, 46, 46, 46, 33, 33, 33, 24, 24]
    assert manifest["model"]["family"] == "multiscale-vit"
    for backend in ("ort", "openvino"):
        report, _ = run_validation(tmp_path / "c", backend, num_samples=4, batch_size=2)
        assert report.passed, (backend, report.to_dict())


@pytest.mark.parametrize("method", ["evit", "topk", "ats", "kmedoids", "dpcknn", "heuristic"])
def test_the_other_keep_rate_methods_reduce_after_the_stem(method, checkpoint):
    """The keep-rate methods at the paper's blocks run on the fused tokens (the stem's blocks keep all 65) and change the
    output (crucial's export and validation are checked above)."""
    cfg = config(method, {"layers": [3, 6, 9], "keep_rate": 0.7}).model_copy(update={"checkpoint": str(checkpoint)})
    model = build_reference(cfg)
    assert model.schedule.tokens[:4] == [65] * 4 and model.schedule.tokens[4] < 65
    x = images()
    with torch.no_grad():
        reduced, dense = model(x), MergedViT.dense(model.family, prop_attn=model.prop_attn)(x)
    assert (reduced - dense).abs().max() > 1e-3 and torch.isfinite(reduced).all()


def test_visualize_follows_tokens_from_the_fused_grid(checkpoint):
    model = build_reference(config("crucial", {"layers": [3, 6, 9]}).model_copy(update={"checkpoint": str(checkpoint)}))
    sources = track_sources(model, images(1))
    assert sources.depth == 12 and sources.reducing_blocks == [3, 6, 9]
    assert [sources.tokens(i) for i in (0, 2, 3, 11)] == [65, 65, 46, 24]


def lka_peg_up_flops(c: int, patches: int) -> dict[str, int]:
    """fvcore's conv rule (multiply-adds, no bias) for each fusion module on a grid of ``patches`` positions."""
    return {"fusion: upsampling conv": patches * c * 9, "fusion: LKA": patches * c * (25 + 49 + c), "fusion: PEG": patches * c * 9}


@pytest.mark.parametrize("width, embedding", [("tiny", "shared"), ("small", "own")])
def test_inspect_counts_parameters_and_the_fusions_flops_by_the_formulas(width, embedding):
    cfg = load_config(ROOT / "export_configs" / f"multiscale_deit_{width}_crucial_k70.yaml")
    report = inspect_config(cfg.model_copy(update={"model_kwargs": dict(cfg.model_kwargs) | {"low_scale_embedding": embedding}}))
    plain = timm.create_model(f"deit_{width}_patch16_224")
    c = plain.embed_dim
    added = c + 50 * c + (9 * c + c) + (25 * c + c) + (49 * c + c) + (c * c + c) + (9 * c + c)  # cls, pos, up, LKA, PEG
    want = lka_peg_up_flops(c, 196)
    if embedding == "own":
        added += 3 * 32 * 32 * c + c
        want |= {"low-scale patch embedding": 49 * c * 3 * 32 * 32}
    assert round(report["params_millions"], 3) == round((sum(p.numel() for p in plain.parameters()) + added) / 1e6, 3)
    assert report["gflops_of_parts"] == {k: round(v / 1e9, 4) for k, v in want.items()}
    assert report["stem_blocks"] == 3 and report["tokens_per_layer"][3:] == [197, 139, 139, 139, 98, 98, 98, 69, 69]
    # a stem block: the high scale's attention on 1 + 49 tokens and its MLP on 197, the low scale's whole block on 1 + 49
    stem_block = 4 * 50 * c * c + 2 * 50 * 50 * c + 8 * 197 * c * c + 12 * 50 * c * c + 2 * 50 * 50 * c
    assert report["gflops_per_layer"][0] == pytest.approx(stem_block / 1e9, rel=0.01)  # + fvcore's LayerNorm counts


@pytest.mark.parametrize(
    "make, text",
    [
        (lambda: create_vit(config().model_copy(update={"pretrained": True})), "no public weights of the multi-scale model"),
        (lambda: create_vit(config(fusion_block=12)), "cannot fuse after 12 of its 12 blocks"),
        (lambda: create_vit(config(low_scale_embedding="big")), "allowed: own, shared"),
        (lambda: build_reference(config("tome", r=2)), "would reduce tokens in block(s) [0, 1, 2], inside the multi-scale stem"),
        (lambda: build_reference(config("crucial", {"layers": [1, 3]})), "Set `merge.options.layers` >= 3"),
        (lambda: build_reference(config(output="tokens", feature_layer=2)), "stops after 2 blocks, inside the multi-scale stem"),
        (lambda: create_vit(config(img_size=20)), "5x5 patch grid; the low scale halves it, so both sides must be even"),
        (lambda: create_vit(config_from_dict({"model": "multiscale:deit_tiny_distilled_patch16_224"})), "has 2 prefix tokens"),
    ],
    ids=["pretrained", "fusion_block", "embedding", "tome_in_stem", "layers_in_stem", "feature_layer", "odd_grid", "distilled"],
)
def test_refusals_say_what_to_change(make, text):
    with pytest.raises(DeploytkError) as err:
        make()
    assert text in f"{err.value} {err.value.hint}"


def test_a_plain_vit_checkpoint_is_refused_naming_the_multi_scale_keys(tmp_path):
    plain = seeded_init(timm.create_model("vit_tiny_patch16_224", img_size=32, **KWARGS))
    save_file({k: v.contiguous() for k, v in plain.state_dict().items()}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(DeploytkError, match=r"parameter\(s\) missing from the checkpoint, e.g. \['cls_token_low', 'pos_embed_low'"):
        create_vit(config().model_copy(update={"checkpoint": str(tmp_path / "plain.safetensors")}))
    assert create_vit(config(patch_size=8)).grid_low == (2, 2)  # a 4x4 grid halves to 2x2


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_a_model_object_stores_what_rebuilds_its_vit_in_another_process(tmp_path):
    """A MultiScaleViT built in Python around a timm ViT of the user's width and depth: export stores the ViT's own
    constructor arguments with the fusion's settings, so another process rebuilds the same model (the stored recipe named
    the architecture alone, which rebuilt a 192-wide, 12-block DeiT-T, and validate refused the artifact elsewhere)."""
    import deploytk
    from deploytk.adapters.multiscale_vit import MultiScaleViT

    vit = timm.create_model("deit_tiny_patch16_224", img_size=32, patch_size=4, embed_dim=48, depth=4, num_heads=2, num_classes=7)
    artifact = deploytk.export(MultiScaleViT(vit, fusion_block=1), tmp_path / "ms", method="topk", keep_rate=0.5, layers=[1, 2])
    source = artifact.manifest["model"]["source"]
    assert source["cannot_rebuild"] is None, source["cannot_rebuild"]
    kwargs = source["rebuild"]["model_kwargs"]
    assert source["rebuild"]["model"] == "multiscale:deit_tiny_patch16_224"
    assert {k: kwargs[k] for k in ("embed_dim", "depth", "num_heads", "patch_size", "num_classes", "fusion_block")} == {
        "embed_dim": 48,
        "depth": 4,
        "num_heads": 2,
        "patch_size": 4,
        "num_classes": 7,
        "fusion_block": 1,
    }
