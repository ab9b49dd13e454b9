"""The GPU benchmark scripts run end to end in their CPU smoke mode and write the JSON they promise."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def benchmark(name: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``python benchmarks/NAME ARGS`` from the repository root, ``env`` added to this process's environment."""
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), *args], capture_output=True, text=True, env={**os.environ, **env}, cwd=ROOT
    )


def run_script(name: str, out: Path, interpret: bool, *extra: str):
    result = benchmark(name, "--smoke", "--output", str(out), *extra, TRITON_INTERPRET="1" if interpret else "0")
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(out.read_text()), result.stdout


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_kernel_bandwidth_smoke(tmp_path):
    report, stdout = run_script("kernel_bandwidth.py", tmp_path / "k.json", interpret=True)
    assert report["smoke"] and report["environment"]["device"] == "cpu" and report["peak_bandwidth_gbs"] > 0
    ops = {c["op"]: c for c in report["cases"]}
    assert set(ops) == {"TokenAggregate", "ProportionalAttention", "ToMeMatch", "MctfMatch", "SizeSplitMatch", "TopKSelect", "CrucialMatch"}
    assert ops["MctfMatch"]["bytes"] == 2 * 33 * (32 + 2) * 4 + 2 * 33 * 8 and ops["TopKSelect"]["pytorch_reference_ms"] > 0
    agg = ops["TokenAggregate"]  # B=2 N=33 C=64 T=29 fp32: x + w + dest + out bytes
    assert agg["bytes"] == 2 * 33 * 64 * 4 + 2 * 33 * 12 + 2 * 29 * 64 * 4
    assert abs(agg["x_bound"] - agg["ms"] / agg["bandwidth_bound_ms"]) <= 0.01 * agg["x_bound"]
    assert abs(agg["bandwidth_bound_ms"] - agg["bytes"] / (report["peak_bandwidth_gbs"] * 1e9) * 1e3) <= 0.01 * agg["bandwidth_bound_ms"]
    assert "peak copy bandwidth" in stdout


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_kernel_bandwidth_smoke_needs_the_interpreter(tmp_path):
    result = benchmark("kernel_bandwidth.py", "--smoke", "--output", str(tmp_path / "k.json"), TRITON_INTERPRET="0")
    assert result.returncode != 0 and "TRITON_INTERPRET=1" in result.stderr and not (tmp_path / "k.json").exists()


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_end_to_end_latency_smoke(tmp_path):
    configs = "export_configs/deit_tiny_mctf_r8.yaml,export_configs/deit_tiny_evit_k70.yaml"
    report, stdout = run_script("end_to_end_latency.py", tmp_path / "e.json", False, "--configs", configs)
    (row,) = report["results"]
    assert row["model"] == "deit_tiny_patch16_224" and row["batch"] == 1
    assert set(row["median_ms"]) == {"dense", "tome", "tome_sdpa", "mctf_r8", "evit_k70"}
    assert abs(row["speedup_mctf_r8"] - row["median_ms"]["dense"] / row["median_ms"]["mctf_r8"]) < 0.01 * row["speedup_mctf_r8"] + 1e-3
    assert row["tokens_per_layer"] == [197 - 16 * i for i in range(12)]
    assert abs(row["speedup_tome"] - row["median_ms"]["dense"] / row["median_ms"]["tome"]) < 0.01 * row["speedup_tome"] + 1e-3
    assert "command" in report and "end_to_end_latency.py" in report["command"]


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_end_to_end_latency_smoke_in_low_precision(tmp_path):
    """Every variant runs wholly in bf16 (a MergedViT cast with .to() still cast its input to fp32 and failed in the conv)."""
    report, _ = run_script("end_to_end_latency.py", tmp_path / "e.json", False, "--dtype", "bf16")
    (row,) = report["results"]
    assert row["dtype"] == "bf16" and set(row["median_ms"]) == {"dense", "tome", "tome_sdpa"}
    assert all(v > 0 for v in row["median_ms"].values())


def test_low_precision_benchmark_variant_uses_fused_attention(monkeypatch):
    """tome_sdpa times PyTorch's fused attention in fp16/bf16 too; the reference keeps its fp32 softmax."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT))
    from benchmarks.end_to_end_latency import on_device, variants

    nets = variants("deit_tiny_patch16_224", 16)
    calls = []
    real_sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(a[0].dtype) or real_sdpa(*a, **k))
    x = torch.randn(1, 3, 224, 224, dtype=torch.bfloat16)
    with torch.inference_mode():
        on_device(nets["tome_sdpa"], "cpu", torch.bfloat16)(x)
        assert calls == [torch.bfloat16] * 12
        calls.clear()
        reference = on_device(variants("deit_tiny_patch16_224", 16)["tome_sdpa"], "cpu", torch.bfloat16)
        reference.fused_low_precision_attention = False
        reference(x)
        assert calls == []


@pytest.mark.slow  # an export, its dense baseline and both runtimes timed: 16 s, moved out of the quick check at 12 minutes
def test_cpu_runtimes_smoke(tmp_path):
    pytest.importorskip("openvino", reason="the openvino extra is not installed")
    report, stdout = run_script("cpu_runtimes.py", tmp_path / "c.json", interpret=False)
    assert report["smoke"] and report["environment"]["versions"]["onnxruntime"]
    assert [(r["runtime"], r["batch"]) for r in report["rows"]] == [("ort", 1), ("openvino", 1)]
    for row in report["rows"]:
        assert row["speedup"] == pytest.approx(row["dense_p50_ms"] / row["merged_p50_ms"], rel=1e-2)
        assert row["efficiency"] == pytest.approx(row["speedup"] / row["flops_ratio"], rel=1e-2)
        assert row["flops_ratio"] == pytest.approx(row["dense_gflops"] / row["gflops"], rel=1e-2)
    assert report["runtime_settings"]["openvino"]["INFERENCE_PRECISION_HINT"] == "f32"
    assert "| ORT b1 | OpenVINO b1 |" in stdout


@pytest.mark.slow  # an export, seven ONNX Runtime sessions (~30 s)
def test_ort_fusion_smoke(tmp_path):
    """Every variant computes model.onnx's numbers (the folded flash path exactly too) except the one without the bias,
    which is there to be timed; the ratios are the medians'."""
    report, stdout = run_script("ort_fusion.py", tmp_path / "f.json", interpret=False)
    (row,) = report["rows"]
    diffs = row["max_abs_diff"]
    assert report["smoke"] and report["fusions"]["Attention"] == 12 and set(report["host"]) >= {"cpu", "isa"}
    assert all(d < 1e-4 for name, d in diffs.items() if name != "fused, no bias"), diffs
    assert diffs["fused, no bias"] > 1e-2  # proportional attention changes the logits: without it they differ
    medians = row["median_ms"]
    assert row["vs_model_onnx"]["fused"] == pytest.approx(medians["model.onnx"] / medians["fused"], rel=1e-2)
    assert "| batch | model.onnx | attention-op | fused |" in stdout


@pytest.mark.slow  # two runtimes' profilers over merged and dense graphs: 14 s, moved out of the quick check
def test_cpu_op_profile_groups_nodes_by_deploytk_op(exported):
    art = exported("digits_vit_tome_r4")
    for runtime in ("ort", "openvino"):
        if runtime == "openvino":
            pytest.importorskip("openvino", reason="the openvino extra is not installed")
        result = benchmark("cpu_op_profile.py", str(art), "--runtime", runtime, "--iterations", "2", "--json")
        assert result.returncode == 0, result.stderr[-2000:]
        ms = json.loads(result.stdout)["ms"]
        merged, dense = ms["merged"], ms["dense"]
        # every deploytk op of the graph shows up as a group of the merged model, none in the dense one
        assert {"deploytk ToMeMatch", "deploytk TokenAggregate"} <= set(merged) and not any(g.startswith("deploytk") for g in dense)
        assert merged["linear layers (weights)"] > 0 and dense["linear layers (weights)"] > 0


@pytest.mark.slow  # a real export past the 2 GiB rule's patched limit: 21 s, moved out of the quick check
def test_export_large_smoke(tmp_path):
    report, _ = run_script("export_large.py", tmp_path / "x.json", interpret=False)
    (row,) = report["models"]
    assert report["smoke"] and report["command"].startswith("python") and row["model"] == "deit_tiny_patch16_224"
    assert row["export_peak_rss_gib"] > 0.1 and row["external_data_mb"] is None
    assert row["validate_ort"]["passed"] and row["validate_openvino"]["passed"] and row["validate_ort"]["max_abs_diff"] < 1e-4
    assert row["tokens_per_layer"] == [197, 189]


@pytest.mark.slow  # eleven deploytk child processes (~1 min); the output kinds themselves are in tests/export/test_output_kinds.py
def test_output_kinds_smoke(tmp_path):
    report, _ = run_script("output_kinds.py", tmp_path / "x.json", False, "--images", "4", "--iterations", "2,2")
    (row,) = report["configs"]
    assert report["smoke"] and row["output"]["kind"] == "tokens" and row["output"]["tokens"] == 8  # 16 patches, r=4 in 2 blocks
    assert [o["name"] for o in row["outputs"]] == ["tokens", "token_sizes", "patch_to_token"]
    for runtime in ("ort", "openvino"):
        assert row[f"validate_{runtime}"]["passed"] and row[f"validate_{runtime}"]["max_abs_diff"] < 1e-4
        assert all(row[f"profile_{runtime}_b{b}"]["p50_ms"] > 0 and row[f"profile_{runtime}_b{b}"]["speedup"] > 0 for b in (1, 8))
    assert (tmp_path / "x.png").is_file()


@pytest.mark.slow  # two digits exports validated on 16 images: 22-33 s on the 2-core machine
def test_precision_smoke(tmp_path):
    """Both rows really ran in low precision against the fp32 reference, and the printed table is --markdown's."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.precision import markdown

    report, stdout = run_script("precision.py", tmp_path / "p.json", False)
    fp16, bf16 = report["rows"]
    assert report["smoke"] and report["environment"]["versions"]["onnxruntime"] and set(report["environment"]) >= {"cpu", "isa"}
    assert (fp16["row"], fp16["precision"], bf16["row"], bf16["precision"]) == ("tome_r4_fp16", "fp16", "tome_r4_bf16", "bf16")
    for row in (fp16, bf16):
        assert row["passed"] and row["num_images"] == 16 and row["images"] == "digits" and row["top1_agreement"] == 1.0
        assert row["max_abs_diff"] > 1e-5 and row["cosine_similarity_min"] > 0.999  # really lowered, still close
    assert fp16["emulation"] is None and "emulated" in bf16["emulation"] and bf16["max_abs_diff"] > fp16["max_abs_diff"]
    assert fp16["tokens_per_layer"] == [65 - 4 * i for i in range(12)]
    assert markdown(report) in stdout and "| digits ViT, ToMe r=4, bf16 (emulated) | 16 validation digits |" in stdout


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize(
    "script, known, unknown", [("precision.py", "tome_r4_fp16", "tome_r4_fp8"), ("vs_official.py", "tome_deit_tiny_r13", "tome_deit_huge")]
)
def test_a_rows_benchmark_refuses_an_unknown_row_before_writing(tmp_path, script, known, unknown):
    result = benchmark(script, "--rows", f"{known},{unknown}", "--output", str(tmp_path / "x.json"))
    assert result.returncode == 2 and f"unknown row(s) {unknown}; choose from {known}," in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_cli_startup_smoke(tmp_path):
    report, stdout = run_script("cli_startup.py", tmp_path / "x.json", False)
    assert report["smoke"] and report["command"].startswith("python") and "deploytk --help" in stdout
    commands = ["deploytk --help", "deploytk --version", "deploytk methods", "import deploytk", "deploytk.load(export)"]
    assert [row["command"] for row in report["rows"]] == [*commands, "deploytk inspect (cached)"]
    assert all(row["runs"] == 2 and 0 < row["min_s"] <= row["median_s"] <= row["max_s"] for row in report["rows"])


@pytest.mark.slow  # an export, two int8 quantizations, sixteen contenders (20-45 s)
def test_vs_alternatives_smoke_compares_every_contender_and_says_why_one_did_not_run(tmp_path, capsys):
    """One row on a tiny timm ViT: every contender is listed, each timed one was held to its PyTorch reference first, the
    official ToMe code is skipped with where it was looked for (deploytk's own PyTorch reference takes its place), and
    the ratios follow from the medians."""
    pytest.importorskip("openvino", reason="the openvino extra is not installed")
    pytest.importorskip("nncf", reason="the int8 extra is not installed")
    sys.path.insert(0, str(ROOT))
    from benchmarks.vs_alternatives import CONTENDERS, TOLERANCE, main

    missing = tmp_path / "no-tome"
    out = tmp_path / "v.json"
    result = benchmark(
        "vs_alternatives.py", "--smoke", "--output", str(out), DEPLOYTK_OFFICIAL_TOME=str(missing), DEPLOYTK_OFFICIAL_MCTF=str(missing)
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["smoke"] and report["environment"]["versions"]["onnxruntime"] and "avx2" in report["environment"]["isa"]
    assert report["official_code"] == {"tome": str(missing), "mctf": str(missing)} and "synthetic" in report["protocol"]["int8_calibration"]
    (row,) = report["rows"]
    assert (row["model"], row["method"], row["batch"]) == ("vit_tiny_patch16_224", "tome", 1)
    assert row["reduced_vs_dense_max_abs_diff"] > 2 * TOLERANCE  # a contender that did not reduce would fail its comparison
    contenders = row["contenders"]
    assert list(contenders) == list(CONTENDERS)
    timed = {n for n, c in contenders.items() if c["status"] == "timed"}
    assert timed == {
        "deploytk_ort",
        "deploytk_ort_plain",
        "deploytk_openvino",
        "deploytk_reference_eager",
        "deploytk_ort_int8",
        "deploytk_openvino_int8",
        "dense_ort_optimized",
        "dense_ort_fused",
        "dense_ort",
        "dense_openvino",
        "dense_ort_int8",
        "dense_openvino_int8",
    }
    for name in timed:
        c, compared = contenders[name], contenders[name]["compared"]
        assert c["median_ms"] > 0 and compared["ok"]
        if c["precision"] == "fp32":
            assert compared["max_abs_diff"] <= TOLERANCE
        else:
            assert 0 <= compared["top1_agreement"] <= 1 and compared["cosine"] > 0.9
    skipped = contenders["tome_official_eager"]["status"]
    assert skipped.startswith("skipped: official tome code not found") and f"{missing}/tome/patch/timm.py" in skipped
    assert "--official-tome / DEPLOYTK_OFFICIAL_TOME" in skipped
    for name in ("tome_official_compile", "deploytk_reference_compile", "dense_compile"):
        assert "--smoke leaves torch.compile out" in contenders[name]["status"]
    assert contenders["mctf_official_eager"]["status"] == contenders["mctf_official_compile"]["status"] == "not in tome rows"
    assert sum(contenders["dense_ort_optimized"]["fused_operators"].values()) > 0  # ONNX Runtime's transformers optimizer fused something
    ratios = row["ratios"]
    best = ratios["deploytk_best"]["fp32"]
    assert best["contender"] in ("deploytk_ort", "deploytk_ort_plain", "deploytk_openvino")
    assert ratios["contenders"][best["contender"]]["x_vs_best_fp32"] == 1
    ort = ratios["contenders"]["deploytk_ort"]  # the fused copy, against the dense model fused the same way
    assert contenders["deploytk_ort"]["settings"]["graph"] == "model.ort.onnx"
    assert contenders["dense_ort_fused"]["settings"]["graph"].endswith(".ort.onnx")
    assert contenders["deploytk_ort_plain"]["settings"]["graph"] == "model.onnx"
    assert ort["dense_baseline"] == "dense_ort_fused"
    medians = {name: c.get("median_ms") for name, c in contenders.items()}
    assert ort["speedup_vs_dense"] == pytest.approx(medians["dense_ort_fused"] / medians["deploytk_ort"], rel=1e-2)
    assert ort["speedup_vs_dense_ort_optimized"] == pytest.approx(
        contenders["dense_ort_optimized"]["median_ms"] / contenders["deploytk_ort"]["median_ms"], rel=1e-2
    )
    assert contenders["deploytk_openvino"]["settings"]["ENABLE_CPU_PINNING"] is False
    assert ort["efficiency"] == pytest.approx(ort["speedup_vs_dense"] / row["flops_ratio"], rel=1e-2)
    assert row["flops_ratio"] == pytest.approx(row["dense_gflops"] / row["gflops"], rel=1e-2)
    assert "| vit_tiny | tome r=8 | 1 | deploytk_ort | onnxruntime |" in result.stdout
    assert main(["--markdown", str(out)]) == 0  # the table of an earlier run is the one that run printed
    assert capsys.readouterr().out.strip() in result.stdout


def test_vs_alternatives_refuses_an_unknown_contender_before_writing(tmp_path):
    out = tmp_path / "v.json"
    result = benchmark("vs_alternatives.py", "--contenders", "deploytk_ort,tensorflow", "--output", str(out))
    assert result.returncode != 0 and "unknown contender(s) tensorflow; known: deploytk_ort," in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # two tiny models exported, four child processes that profile both models on both runtimes (~95 s)
def test_video_audio_smoke(tmp_path, capsys):
    """Both models at one schedule on both runtimes and batch sizes: the ratios follow from the medians and the GFLOPs,
    the schedule is the one nearest the target FLOPs ratio, and the dense model's attention time is part of its node time."""
    pytest.importorskip("openvino", reason="the openvino extra is not installed")
    sys.path.insert(0, str(ROOT))
    from benchmarks.video_audio import main

    out = tmp_path / "v.json"
    report, stdout = run_script("video_audio.py", out, interpret=False)
    assert report["smoke"] and report["environment"]["versions"]["onnxruntime"] and report["target"] == 0.9
    models = report["models"]
    assert (models["videomae_base"]["tokens"], models["ast_base"]["tokens"]) == (4 * 4 * 4, 9 * 4 + 2)  # tubelets; patches + 2
    assert [(r["model"], r["runtime"], r["batch"]) for r in report["rows"]] == [
        (m, rt, b) for m in ("videomae_base", "ast_base") for rt in ("ort", "openvino") for b in (1, 4)
    ]
    for row in report["rows"]:
        # the blocks' estimate is near the target; the exact count adds the patch embedding and head, large in tiny models
        assert row["target_ratio"] == 2.0 and abs(row["estimated_ratio"] - 2) < 0.2 and 1.5 < row["flops_ratio"] < row["estimated_ratio"]
        assert row["flops_ratio"] == pytest.approx(row["dense_gflops"] / row["gflops"], rel=1e-2)
        assert row["speedup"] == pytest.approx(row["dense_p50_ms"] / row["merged_p50_ms"], rel=1e-2)
        assert row["efficiency"] == pytest.approx(row["speedup"] / row["flops_ratio"], rel=1e-2)
        assert row["meets_target"] == (row["efficiency"] >= 0.9)
        tokens = row["tokens_per_layer"]
        assert tokens[0] == models[row["model"]]["tokens"] and tokens == sorted(tokens, reverse=True) and row["tokens_out"] < tokens[-1]
    assert [(a["model"], a["runtime"], a["batch"]) for a in report["attention"]] == [
        (r["model"], r["runtime"], r["batch"]) for r in report["rows"]
    ]
    for share in report["attention"]:
        assert 0 < share["attention_ms"] < share["nodes_ms"]
        assert share["attention_time_share"] == pytest.approx(share["attention_ms"] / share["nodes_ms"], abs=2e-3)
    assert 0 < models["ast_base"]["attention_flops_share"] < models["videomae_base"]["attention_flops_share"] < 0.5  # 38 vs 64 tokens
    first = report["rows"][0]
    assert (
        f"| videomae_base | {first['r']} | {first['tokens_out']} |" in stdout
        and "| dense model | tokens | attention: share of FLOPs |" in stdout
    )
    assert main(["--markdown", str(out)]) == 0  # the table of an earlier run is the one that run printed
    assert capsys.readouterr().out.strip() in stdout


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--models", "ast_base,vivit", "unknown model(s) vivit; known: videomae_base, ast_base"),
        ("--runtimes", "ort,trt", "unknown runtime(s) trt; known: ort, openvino"),
    ],
)
def test_video_audio_refuses_an_unknown_model_or_runtime_before_writing(tmp_path, option, value, message):
    out = tmp_path / "v.json"
    result = benchmark("video_audio.py", option, value, "--output", str(out))
    assert result.returncode != 0 and message in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_video_audio_counts_attention_as_softmax_and_the_activation_products():
    """Q K^T and A V multiply two activations; the linear layers multiply by a weight and are not attention."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    sys.path.insert(0, str(ROOT))
    from benchmarks.video_audio import attention_nodes

    weight = numpy_helper.from_array(np.zeros((4, 4), dtype=np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["q"], name="query"),
        helper.make_node("Transpose", ["w"], ["wt"], name="weight_t"),  # a weight through a node is still a weight
        helper.make_node("MatMul", ["x", "wt"], ["k"], name="key"),
        helper.make_node("Transpose", ["k"], ["kt"], name="kt"),
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
        helper.make_node("Softmax", ["s"], ["a"], name="softmax"),
        helper.make_node("MatMul", ["a", "x"], ["y"], name="values"),
    ]
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [3, 4]) for n in ("x", "y"))
    graph = helper.make_graph(nodes, "g", [x], [y], [weight])
    assert attention_nodes(helper.make_model(graph)) == {"scores", "s", "softmax", "a", "values", "y"}


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_token_aggregate_body_smoke(tmp_path):
    """The three bodies run on both runtimes, each checked against the torch op before it is timed; speedup is the medians'."""
    pytest.importorskip("openvino", reason="the openvino extra is not installed")
    report, stdout = run_script("token_aggregate_body.py", tmp_path / "a.json", interpret=False)
    assert report["smoke"] and set(report["host"]) >= {"cpu", "isa"} and set(report["versions"]) == {"onnxruntime", "openvino"}
    assert [(r["runtime"], r["B"], r["N"], r["T"], r["C"]) for r in report["rows"]] == [("ort", 2, 33, 29, 16), ("openvino", 2, 33, 29, 16)]
    for row in report["rows"]:
        assert set(row["median_ms"]) == {"previous", "extras_matmul", "current"}
        assert all(d <= 1e-5 for d in row["max_diff_over_max_value"].values())
        assert row["speedup"] == pytest.approx(row["median_ms"]["previous"] / row["median_ms"]["current"], rel=1e-6)
    assert "| runtime | B | N | T | C | previous ms | extras MatMul ms | current ms | speedup |" in stdout


@pytest.mark.slow  # one DeiT-T export and its reference: ~25 s on the 2-core machine
def test_vs_official_smoke(tmp_path):
    """The smoke row's reference and ONNX Runtime outputs are the official ToMe patch's recorded logits, and the printed
    table is --markdown's."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.vs_official import markdown

    report, stdout = run_script("vs_official.py", tmp_path / "v.json", False)
    (row,) = report["rows"]
    assert report["smoke"] and set(report["environment"]) >= {"cpu", "isa", "versions"}
    assert (row["row"], row["recorded"], row["images"]) == ("tome_deit_tiny_r13", "tests/data/tome_official_logits.npz:deit_tiny_r13", 2)
    assert row["official_scale"] > 1 and row["reference_max_abs_diff"] <= 1e-4 and row["onnx_ort_max_abs_diff"] <= 1e-3
    assert row["custom_ops"] == ["ProportionalAttention", "ToMeMatch", "TokenAggregate"]
    assert markdown(report) in stdout and "| `tome` | facebookresearch/ToMe (timm patch) | DeiT-T, r=13 | 2 |" in stdout


def test_vs_official_rows_name_recorded_outputs_and_shipped_methods():
    """Every row reads a key its file holds, for a method deploytk has, with a config deploytk accepts (no run)."""
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from benchmarks.vs_official import DATA, ROWS
    from deploytk.reducers import METHODS

    for rid, row in ROWS.items():
        assert row.key in np.load(DATA / row.npz).files, rid
        assert row.method in METHODS and row.config["merge"]["method"] == row.method, rid
    assert {row.method for row in ROWS.values()} == {"tome", "mctf", "pitome", "kmedoids", "dpcknn", "ats", "dynamicvit"} | {
        "patchmerger",
        "sit",
        "sinkhorn",
        "visionzip",
    }


def test_cpu_runtimes_default_runs_every_method_with_a_deit_config():
    """`python benchmarks/cpu_runtimes.py` as the docs give it: a method added without a DeiT-S config (VisionZip's are
    LLaVA towers) is left out of the default instead of stopping the run; PiToMe runs its official keep rate."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.cpu_runtimes import jobs, parse_args
    from deploytk.reducers import METHODS

    runs = jobs(parse_args([]))
    assert {method for _, method, _ in runs} == set(METHODS) - {"visionzip"}
    assert {model for model, _, _ in runs} == {"deit_small_patch16_224", "deit_base_patch16_224"}
    assert {config.name for _, method, config in runs if method == "pitome"} == {"deit_small_pitome_k90.yaml"}
    with pytest.raises(SystemExit, match="no ready-made config of method 'visionzip'"):
        jobs(parse_args(["--methods", "tome,visionzip"]))
