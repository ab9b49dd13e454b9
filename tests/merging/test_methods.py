"""MCTF vs the official code, published GFLOPs, ATM's schedule and calibration, keep-rate methods."""

from pathlib import Path

import numpy as np
import pytest
import timm
import torch

from deploytk.analysis.flops import count_flops
from deploytk.analysis.inspect import method_summary
from deploytk.calibration import calibrate
from deploytk.config import config_from_dict, load_config
from deploytk.errors import DeploytkError
from deploytk.merging.merged_vit import build_merged
from deploytk.models import build_reference
from deploytk.ops.size_split_match.reference import size_split_scores
from deploytk.reducers import atm, get_method

from helpers import seeded_images, seeded_init

ROOT = Path(__file__).resolve().parents[2]
RECORDED = np.load(ROOT / "tests" / "data" / "mctf_official_logits.npz")


def build(method, vit, r, options=None, prop_attn=True):
    m = get_method(method)
    return build_merged(m, vit, r, prop_attn, m.parse_options(options or {})).eval()


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize(
    "key,name,r,options,seed,n",
    [
        ("deit_small_r16", "deit_small_patch16_224", 16, {}, 3, 4),
        ("deit_tiny_r8", "deit_tiny_patch16_224", 8, {}, 2, 2),
        ("deit_small_fast", "deit_small_patch16_224", [0, 0, 0, 68, 0, 0, 44, 0, 0, 29, 0, 0], {"layers": [3, 6, 9]}, 2, 2),
    ],
)
def test_mctf_matches_official_outputs(key, name, r, options, seed, n):
    vit = seeded_init(timm.create_model(name), seed=1)
    with torch.no_grad():
        got = build("mctf", vit, r, options)(seeded_images(n, seed=seed)).numpy()
    np.testing.assert_allclose(got, RECORDED[key], rtol=0, atol=1e-4)  # acceptance: <= 1e-3


@pytest.mark.parametrize(
    "name,r,options,published",
    [
        # mlvlab/MCTF README model zoo (fvcore GFLOPs): MCTF r=16 blocks 1-11, MCTF-Fast ratio 0.35 at 3/6/9
        ("deit_small_patch16_224", 16, {}, 2.60),
        ("deit_tiny_patch16_224", 16, {}, 0.71),
        ("deit_small_patch16_224", [0, 0, 0, 68, 0, 0, 44, 0, 0, 29, 0, 0], {"layers": [3, 6, 9]}, 2.76),
        ("deit_tiny_patch16_224", [0, 0, 0, 68, 0, 0, 44, 0, 0, 29, 0, 0], {"layers": [3, 6, 9]}, 0.75),
    ],
)
def test_mctf_gflops_match_published(name, r, options, published):
    model = build("mctf", timm.create_model(name), r, options)
    assert count_flops(model).total_gflops == pytest.approx(published, abs=0.02)


@pytest.mark.parametrize("r,published", [(18, 2.4), (20, 2.2)])
def test_mctf_gflops_match_the_papers_deit_s_rows(r, published):
    """The paper's DeiT-S rows at r=18/20 (as listed by paperswithcode/hyper.ai) are given to 0.1 G: we match them rounded."""
    model = build("mctf", timm.create_model("deit_small_patch16_224"), r, {})
    assert round(count_flops(model).total_gflops, 1) == published


def test_mctf_variants_run_and_differ_from_dense():
    vit = seeded_init(timm.create_model("deit_tiny_patch16_224"), seed=1)
    x = seeded_images(2, seed=3)
    with torch.no_grad():
        dense = build("tome", vit, 0)(x)
        outs = {mode: build("mctf", vit, 8, {"one_step_ahead": mode})(x) for mode in ("approx", "exact", "off")}
    for mode, y in outs.items():
        assert torch.isfinite(y).all() and not torch.allclose(y, dense, atol=1e-3), mode
    assert not torch.allclose(outs["approx"], outs["exact"], atol=1e-4)


def test_mctf_min_tokens_safeguard():
    model = build("mctf", timm.create_model("deit_tiny_patch16_224"), 40)
    tokens, eff = model.schedule.tokens, model.schedule.effective_r
    assert min(t - e for t, e in zip(tokens, eff, strict=True)) >= 10
    assert eff[1] == 40 and tokens[-1] - eff[-1] == 10  # later layers clipped to keep 10 tokens


def test_atm_thresholds_hand_computed():
    th = atm.thresholds(4, alpha=0.9, beta=0.5, theta_min=0.0)
    # l = 1..4: 0.9 - (e^{0.5 (l-1)} - 1) = 0.9, 0.2513, -0.8183 -> floor 0.0, ...
    assert th[0] == pytest.approx(0.9)
    assert th[1] == pytest.approx(0.9 - (np.exp(0.5) - 1))
    assert th[2:] == [0.0, 0.0]


def test_atm_count_above_and_size_split_grouping():
    metric = torch.tensor([[[1.0, 0.0], [1.0, 0.05], [0.0, 1.0], [0.6, 0.8], [0.0, 1.0], [1.0, 0.0]]])
    size = torch.tensor([[[1.0], [1.0], [3.0], [1.0], [2.0], [5.0]]])
    # alternation (cls protected): A = [0, 2, 4] rows -> 2 matches 3 (cos .8), 4 matches 3 (.8); none > 0.9
    assert atm.count_above(metric, size, 1, 0.9, size_split=False).tolist() == [0]
    assert atm.count_above(metric, size, 1, 0.7, size_split=False).tolist() == [2]
    # size split over tokens 1..5 (sizes 1,3,1,2,5): small = tokens 1, 3, 4? no: sorted by size -> 1, 3 (size 1), 4 (2) | 2 (3), 5 (5)
    scores, oa, ob = size_split_scores(metric, size, 1)
    assert (oa + 1).tolist() == [[1, 3, 4]] and (ob + 1).tolist() == [[2, 5]]
    assert atm.count_above(metric, size, 1, 0.99, size_split=True).tolist() == [2]  # 1 ~ 5 and 4 == 2


def test_atm_calibration_statistic_is_per_layer_quantile():
    cfg = config_from_dict(
        {
            "model": "deit_tiny_patch16_224",
            "merge": {"method": "atm", "r": 0, "options": {"alpha": 0.5, "beta": 0.1, "theta_min": 0.2}},
            "export": {"img_size": 64},
        }
    )
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal((4, 3, 64, 64)).astype(np.float32) for _ in range(3)]
    data, report = calibrate(cfg, batches, 0.5, "test")
    model = build_reference(cfg)
    per_batch = np.array([model.reduction.calibration_pass(model, torch.from_numpy(b)) for b in batches]).T
    want = [int(np.floor(np.median(v))) for v in per_batch]
    assert want[-1] == 0  # CLS-only last block: no merge recorded
    assert report["r"] == want == data["merge"]["r"]
    assert report["images"] == 12 and report["batches"] == 3
    assert data["merge"]["options"]["calibration"]["per_layer_r"][0]["max"] == int(per_batch[0].max())
    recal = build_reference(config_from_dict(data))
    assert recal.schedule.effective_r[:-1] == [min(r, (t - 1) // 2) for r, t in zip(want[:-1], recal.schedule.tokens, strict=False)]
    assert recal.schedule.tokens[-1] - recal.schedule.effective_r[-1] == 1


def test_keep_rate_methods_token_counts():
    vit = timm.create_model("deit_small_patch16_224")
    topk = build("topk", vit, 0, {"layers": [3, 6, 9], "keep_rate": 0.7})
    evit = build("evit", vit, 0, {"layers": [3, 6, 9], "keep_rate": 0.7})
    # EViT: left = ceil(0.7 * (N - 1)) + cls (+ fused): 197 -> 138+1+1 = 140 -> 98+2 = 100 -> 70+2 = 72
    assert evit.schedule.tokens == [197] * 4 + [140] * 3 + [100] * 3 + [72] * 2
    assert topk.schedule.tokens == [197] * 4 + [139] * 3 + [98] * 3 + [69] * 2
    x = seeded_images(1, seed=0)
    with torch.no_grad():
        assert torch.isfinite(evit(x)).all() and torch.isfinite(topk(x)).all()


def test_keep_rate_one_is_dense():
    vit = seeded_init(timm.create_model("deit_tiny_patch16_224"), seed=2)
    x = seeded_images(1, seed=4)
    with torch.no_grad():
        torch.testing.assert_close(build("evit", vit, 0, {"keep_rate": 1.0}, prop_attn=False)(x), vit(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "merge,message",
    [
        (
            {"method": "mctf", "options": {"tau_foo": 1}},
            r"unknown option `merge.options.tau_foo` for method mctf \(allowed: layers, tau_sim",
        ),
        ({"method": "evit", "options": {"keep_rate": 1.5}}, r"`merge.options.keep_rate` = 1.5: Input should be less than or equal to 1"),
        ({"method": "topk", "options": {"keep_rate": 0}}, r"`merge.options.keep_rate` = 0: Input should be greater than 0"),
        ({"method": "atm", "options": {"alpha": 1.2}}, r"`merge.options.alpha` = 1.2: Input should be less than or equal to 1"),
        ({"method": "atm", "options": {"theta_min": -3}}, r"`merge.options.theta_min` = -3: Input should be greater than or equal to -1"),
        ({"method": "atm", "options": {"gflops": 3.0}}, r"`gflops` picks a point of a `preset`"),
        (
            {"method": "atm", "options": {"preset": "deit_s", "alpha": 0.9}},
            r"`alpha` = 0.9 contradicts preset deit_s \(0.99, 0.04, 0.86 at 3.04 GFLOPs\)",
        ),
        ({"method": "atm", "options": {"preset": "deit_l"}}, r"`merge.options.preset` = 'deit_l'.*'deit_t', 'deit_s' or 'deit_b'"),
        ({"method": "evit", "r": 8}, r"method evit does not use `merge.r`"),
        ({"method": "nope"}, r"unknown merge method 'nope'"),
    ],
)
def test_bad_method_options_are_clear(merge, message):
    with pytest.raises(DeploytkError, match=message):
        config_from_dict({"merge": merge})


def test_atm_presets_are_the_papers_table_a2_points():
    """Spot values typed from the ATM paper's Table A2 (DeiT, no training), and the nearest-GFLOPs choice."""
    assert atm.PRESETS["deit_s"][8] == (0.99, 0.04, 0.86, 3.04, 79.65)
    assert [len(atm.PRESETS[m]) for m in ("deit_t", "deit_s", "deit_b")] == [13, 15, 14]
    assert atm.preset_point("deit_t", 0.78)[:3] == (0.98, 0.035, 0.84)
    assert atm.preset_point("deit_b", 12.4)[:3] == (0.99, 0.025, 0.845)
    assert atm.preset_point("deit_s", 3.055).gflops == 3.07  # a tie goes to the less aggressive point
    assert atm.preset_point("deit_s", 1.0).gflops == 2.56 and atm.preset_point("deit_s", 9.0).gflops == 3.67
    for points in atm.PRESETS.values():  # each table lists its points from most to least GFLOPs
        assert [p.gflops for p in points] == sorted((p.gflops for p in points), reverse=True)
    cfg = config_from_dict({"model": "deit_tiny_patch16_224", "merge": {"method": "atm", "options": {"preset": "deit_t"}}})
    options = method_summary(cfg)["options"]  # what inspect shows and every manifest records
    assert (options["alpha"], options["beta"], options["theta_min"], options["preset"]) == (0.98, 0.035, 0.84, "deit_t")
    default = atm.ATMOptions()
    assert (default.alpha, default.beta, default.theta_min) == (0.99, 0.04, 0.86)


def test_an_atm_preset_on_another_model_is_refused():
    cfg = config_from_dict({"model": "deit_tiny_patch16_224", "merge": {"method": "atm", "options": {"preset": "deit_s"}}})
    with pytest.raises(DeploytkError, match=r"preset` = deit_s .* width 384; deit_tiny_patch16_224 has width 192: use preset deit_t"):
        build_reference(cfg)


def test_bad_layers_and_models():
    with pytest.raises(DeploytkError, match=r"block indices must be in \[0, 11\]"):
        build_reference(config_from_dict({"model": "deit_tiny_patch16_224", "merge": {"method": "mctf", "options": {"layers": [12]}}}))
    with pytest.raises(DeploytkError, match="has no class token"):
        build_reference(config_from_dict({"model": "vit_medium_patch16_gap_256", "merge": {"method": "evit"}, "export": {"img_size": 64}}))


def test_calibration_bad_input():
    cfg = load_config(ROOT / "export_configs" / "deit_tiny_atm.yaml")
    with pytest.raises(DeploytkError, match="calibration needs inputs"):
        calibrate(cfg, [], 0.5, "none")
    with pytest.raises(DeploytkError, match=r"calibration is for the methods whose r depends on the data \(atm\); this config uses 'mctf'"):
        calibrate(load_config(ROOT / "export_configs" / "deit_tiny_mctf_r8.yaml"), [np.zeros((1, 3, 224, 224), np.float32)], 0.5, "x")


def test_synthetic_calibration_uses_the_model_s_own_input_size(tmp_path):
    """export.img_size: null means the model's default; a 384 px model was fed 224 px synthetic batches (and failed)."""
    import yaml

    from deploytk.calibration import calibrate_config

    data = yaml.safe_load((ROOT / "export_configs" / "deit_tiny_atm.yaml").read_text())
    data["model"], data["export"]["img_size"] = "vit_tiny_patch16_384", None
    config = tmp_path / "atm_384.yaml"
    config.write_text(yaml.safe_dump(data))
    report = calibrate_config(config, synthetic=2, batch_size=2)
    assert len(report["r"]) == 12 and report["images"] == 2 and Path(report["output"]).is_file()


def test_calibrate_cli_without_images_fails_cleanly_and_writes_nothing(tmp_path):
    from typer.testing import CliRunner

    from deploytk.cli import app

    out = tmp_path / "calibrated.yaml"
    result = CliRunner().invoke(app, ["calibrate", str(ROOT / "export_configs" / "deit_tiny_atm.yaml"), "--output", str(out)])
    assert result.exit_code == 2
    assert "calibration needs inputs: pass exactly one of --data DIR or --synthetic N" in result.output
    result = CliRunner().invoke(
        app, ["calibrate", str(ROOT / "export_configs" / "deit_tiny_mctf_r8.yaml"), "--synthetic", "2", "--output", str(out)]
    )
    assert result.exit_code == 2 and "calibration is for the methods whose r depends on the data (atm)" in " ".join(result.output.split())
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "method,options,prop_attn,message",
    [
        ("ats", {}, False, r"method ats needs `merge.prop_attn: true`: it leaves empty token slots of size 0"),
        ("kmedoids", {"layers": [0, 6]}, False, r"cannot cluster before block 0; remove 0 from `merge.options.layers`"),
        (
            "dpcknn",
            {"keep_rate": 0.01},
            False,
            r"`merge.options.keep_rate` = 0.01 leaves int\(196 \* keep_rate\^s\) = 0 clusters at block 6",
        ),
        ("dpcknn", {"neighbors": 65}, False, r"`merge.options.neighbors` = 65: Input should be less than or equal to 64"),
        ("kmedoids", {"iterations": -1}, False, r"`merge.options.iterations` = -1: Input should be greater than or equal to 0"),
    ],
)
def test_study_methods_refuse_bad_settings_with_the_reason(method, options, prop_attn, message):
    m = get_method(method)
    with pytest.raises(DeploytkError, match=message):
        build_merged(m, timm.create_model("deit_tiny_patch16_224"), 0, prop_attn, m.parse_options(options))
