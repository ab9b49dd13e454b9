"""The lists, counts and measured tables of the README and the docs pages are held to what they describe: the
registries, and the result files in benchmarks/results/ (issue 43: the facts test moves with the facts).

A measured table that a script prints must appear verbatim on some prose page (README.md or docs/, not the generated
docs/reference/); the README's headline figures and the hand-typed tables' figures are recomputed from the same files.
Every table on the README, a guide or a results page is either printed by a script (PRINTED) or named in NOT_PRINTED
with what holds it. (The methods table is held to `deploytk methods --markdown` in tests/merging/test_registry.py.)
"""

import json
import re

import pytest
import tomllib

from deploytk.backends import BACKENDS
from deploytk.ops import OPS
from deploytk.reducers import METHODS

from helpers.docs import ROOT, all_prose, page, prose_pages

RESULTS = ROOT / "benchmarks" / "results"
PROSE = all_prose()
README = page("README.md")
CLI = page("docs/guides/cli.md")  # the commands, one synopsis line each
CONFIGS = page("docs/guides/configs.md")
INSTALL = page("docs/getting-started.md")


def result(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def expand(pattern: str) -> list[str]:
    """Shell brace expansion: a_{x,y}_{1,2} -> a_x_1, a_x_2, a_y_1, a_y_2."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if not match:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [name for option in match.group(1).split(",") for name in expand(head + option + tail)]


def list_after(text: str, start: str) -> list[str]:
    """The Markdown list that follows the paragraph starting with ``start``."""
    lines = text[text.index(start) :].split("\n\n", 2)[1].splitlines()
    return [line for line in lines if line.startswith("- ")]


def synopsis(command: str) -> str:
    """The one-line synopsis of `deploytk COMMAND` on the commands page."""
    lines = [line for line in CLI.splitlines() if line.startswith(f"`deploytk {command} ")]
    assert len(lines) == 1, (command, lines)
    return lines[0]


def test_the_ready_made_config_list_is_the_folder():
    lines = list_after(CONFIGS, "Ready-made configs (`export_configs/`")
    listed = [name for line in lines for name in re.findall(r"`([^`]+)`", line.split(": ", 1)[0])]  # the names before the colon
    expanded = [stem for pattern in listed for stem in expand(pattern)]
    assert len(expanded) == len(set(expanded)), "a config is listed twice"
    assert set(expanded) == {p.stem for p in (ROOT / "export_configs").glob("*.yaml")}


def test_the_config_example_names_every_method():
    line = next(line for line in CONFIGS.splitlines() if line.strip().startswith("method: tome"))
    assert [m.strip() for m in line.split("#", 1)[1].split("(")[0].split("|")] == sorted(METHODS)


def test_the_readme_lists_every_method_and_counts_them():
    row = next(line for line in README.splitlines() if line.startswith("| methods |"))
    assert re.findall(r"`([a-z]+)`", row.split("|")[2]) == sorted(METHODS)
    assert {int(n) for n in re.findall(r"\b(\d+) token-reduction\s+methods", PROSE)} == {len(METHODS)}


def test_op_and_kernel_counts_and_the_selftest_op_list():
    from deploytk_plugins.aot import standard_variants

    assert {int(n) for n in re.findall(r"\b(\d+) ops\b", PROSE)} == {len(OPS)}
    assert {int(n) for n in re.findall(r"\b(\d+) kernels\b", PROSE)} == {len(standard_variants())}
    section = CLI[CLI.index(synopsis("selftest")) :].split("\n\n", 2)[1]  # the paragraph after the synopsis
    listed = re.search(r"one per deploytk op: ([^)]*)\)", section).group(1).split(", ")
    assert sorted(listed) == sorted(OPS)


def test_the_commands_page_lists_the_backends():
    for command, names in (
        ("profile", list(BACKENDS)),
        ("validate", [n for n, b in BACKENDS.items() if b.validates]),
        ("eval", [n for n, b in BACKENDS.items() if b.validates]),
    ):
        assert re.search(r"--backend ([a-z|-]+)\]", synopsis(command)).group(1).split("|") == names, command


def test_the_install_tables_list_the_extras():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    listed = re.findall(r"^\| `deploytk\[([a-z0-9]+)\]`", INSTALL, flags=re.M)
    assert listed and sorted(listed) == sorted(extras)
    sentence = README[README.index("Extras: ") :].split(". ", 1)[0]
    assert sorted(re.findall(r"`([a-z0-9]+)`", sentence)) == sorted(extras)


def test_the_output_kinds_tables_are_what_their_command_prints():
    """The measured tables of dense features, token sets and the multi-scale model are `output_kinds.py --markdown`."""
    from benchmarks.output_kinds import markdown

    for name in (
        "output_kinds_amd_epyc.json",
        "output_kinds_amd_epyc_dinov2_unmerge_gather.json",
        "output_kinds_amd_epyc_visionzip_pitome.json",
        "output_kinds_amd_epyc_pitome.json",
        "multiscale_profile_amd_epyc.json",
    ):
        assert markdown(result(name)) in PROSE, name


def test_the_multiscale_table_is_what_its_command_prints():
    """The multi-scale parameters / GFLOPs table is `multiscale_vs_paper.py`'s table of the committed JSON."""
    from benchmarks.multiscale_vs_paper import markdown

    assert markdown(result("multiscale_vs_paper.json")) in PROSE


@pytest.mark.parametrize("name", ["int8_amd_epyc.json", "int8_amd_epyc_avx512_vnni.json"])
def test_the_int8_tables_are_what_their_command_prints(name):
    """The int8 tables (an AVX2 CPU, an AVX512-VNNI CPU) are `benchmarks/int8.py --markdown` of the committed JSON."""
    from benchmarks.int8 import markdown

    assert not result(name)["smoke"] and markdown(result(name)) in PROSE


def test_the_cpu_performance_table_is_what_its_command_prints():
    """The per-method table under "CPU performance" and its dense p50 line are `cpu_runtimes.py --markdown` of the
    committed JSON."""
    from benchmarks.cpu_runtimes import markdown

    data = result("cpu_runtimes_amd_epyc.json")
    assert not data["smoke"] and markdown(data) in page("docs/results/index.md")


def test_the_accuracy_table_is_what_its_command_prints():
    from benchmarks.accuracy_vs_gflops import markdown

    assert markdown(result("digits_accuracy_vs_gflops.json")) in page("docs/results/accuracy.md")


def test_the_large_models_table_is_what_its_command_prints():
    from benchmarks.export_large import markdown

    data = result("export_large_amd_epyc.json")
    assert not data["smoke"] and markdown(data) in page("docs/results/index.md")


def test_the_precision_table_and_its_figures_are_the_committed_run():
    """The fp16/bf16 table is `precision.py --markdown` of the committed JSON, and the paragraph after it quotes the same
    rows: the flips, the flip budget, the replayed cosine, and the machine and version the run names."""
    from benchmarks.precision import markdown

    data = result("precision_amd_epyc.json")
    rows = {r["row"]: r for r in data["rows"]}
    assert not data["smoke"] and all(r["passed"] and r["num_images"] == 64 for r in rows.values())
    raw = page("docs/results/index.md")
    assert markdown(data) in raw
    text = section(raw, "## fp16 and bf16 on the digits ViT")
    env = data["environment"]
    isa = {"avx2": "AVX2", "avx512f": "AVX-512F", "avx512_vnni": "AVX512-VNNI", "avx512_bf16": "AVX512-BF16"}
    assert data["command"] == "python benchmarks/precision.py" and f"`{data['command']}` at " in text
    features = ", ".join(isa[f] for f in env["isa"])
    assert f"on the {env['cpus_usable']}-core {env['cpu']} ({features}), ONNX Runtime {env['versions']['onnxruntime']} CPU" in text
    tome = [rows[k] for k in ("tome_r4_fp16", "tome_r16_fp16", "tome_r4_bf16")]
    assert all(r["branch_flips"] == 0 and r["top1_flips"] == 0 for r in tome) and "ToMe on the trained digits ViT flips nothing" in text
    assert rows["tome_r4_bf16"]["emulation"] and rows["tome_r16_fp16"]["overrides"] == {"r": 16}
    mctf, noise, deit = rows["mctf_r4_fp16"], rows["mctf_r4_fp16_noise"], rows["deit_s_tome_r16_fp16"]
    assert mctf["branch_flips"] == mctf["branch_flips_explained"] == 1 and "on the same digits: 1 proven near-tie flip" in text
    assert noise["images"] == "synthetic" and f"on {noise['num_images']} synthetic noise images: {noise['branch_flips']}, which" in text
    share = f"move {noise['flipped_choices']} of the {noise['matching_decisions']:,} matching decisions"
    assert f"{share} ({100 * noise['flipped_choice_fraction']:.2g}%)" in text
    assert f"bound on that share (`max_flipped_choices`) is {100 * noise['max_flipped_choices']:.0f}%" in text
    assert noise["flipped_choices"] <= noise["max_flipped_choices"] * noise["matching_decisions"]
    assert deit["branch_flips"] == deit["branch_flips_explained"] and deit["images"] == "synthetic"
    assert (
        f"on {deit['num_images']} synthetic images: {deit['branch_flips']} flips, all proven, min cosine "
        f"{deit['cosine_similarity_min_replayed']:.5f} against the reference replayed" in text
    )


def section(text: str, heading: str) -> str:
    """A page's section from its heading to the next heading of the same level, on one line (hard wraps undone)."""
    start = text.index(f"\n{heading}\n")
    end = text.find(f"\n{heading.split(' ', 1)[0]} ", start + 1)
    return " ".join(text[start : end if end != -1 else None].split())


def test_the_tune_table_and_its_figures_are_the_committed_tune_report():
    """`deploytk tune` wrote the JSON (no benchmark script prints this table): each row, verdict and figure of the
    section is recomputed from it."""
    data = result("tune_deit_small_tome_r16_ort_b8.json")
    chosen, next_one = data["chosen"], data["next_less_aggressive"]
    rows = [f"| candidate | GFLOPs | p50 ms (runs) | meets {data['budget_ms']:g} ms |", "|---|---:|---:|---|"]
    for c in data["measured"]:
        label, verdict = c["label"], "yes" if c["meets_budget"] else "no"
        if c == chosen:
            label, verdict = f"**{label}**", "**yes: chosen**"
        elif c == next_one:
            verdict = "no: the next less aggressive"
        rows.append(f"| {label} | {c['gflops']:.3f} | {c['latency_ms']:.1f} ({len(c['runs_ms'])}) | {verdict} |")
    text = section(page("docs/results/index.md"), "## `tune` on DeiT-S")
    assert " ".join(rows) in text
    assert chosen["meets_budget"] and not next_one["meets_budget"] and data["outcome"] == "ok"
    assert f"Dense p50 {data['dense_latency_ms']:.1f} ms (median over the runs); {data['candidates']} candidate schedules" in text
    assert f"{data['exports']} exports, {data['measurements']} profile runs" in text
    assert f"DeiT-S ToMe, batch {data['batch']}, budget" in text and f"--budget-ms {data['budget_ms']:g}" in text
    runs = " and ".join(f"{ms:.1f}" for ms in next_one["runs_ms"])
    assert f"{next_one['label']}'s two runs took {runs} ms (median {next_one['latency_ms']:.1f})" in text


def short_e(x: float) -> str:
    """2.287e-06 -> 2.3e-6, as the pages write a small difference."""
    mantissa, power = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(power)}"


def test_the_summary_table_figures_are_the_result_files():
    """The Summary rows on docs/results/index.md that cite a result file, each figure recomputed from it (the table is
    typed by hand: its rows come from several files)."""
    text = section(page("docs/results/index.md"), "## Summary (CPU, this repository)")

    full = result("validate_all_configs.json")
    configs, by_name = full["configs"], {c["config"]: c for c in full["configs"]}
    tome = by_name["deit_small_tome_r16.yaml"]["ort"]
    assert tome["passed"] and tome["top1_agreement"] == 1.0
    assert (
        f"max \\|logit diff\\| {short_e(tome['max_abs_diff'])}, top-1 agreement 100%, "
        f"min cosine {tome['cosine_similarity_min']:.7f}: PASS" in text
    )
    ran_ov = [c for c in configs if c["openvino"]["passed"] is not None]
    refused = [c for c in configs if c["openvino"]["passed"] is None]
    assert all(c["precision"] == "bf16" for c in refused) and not full["failed"]
    assert f"{sum(c['ort']['passed'] for c in configs)} of {len(configs)} pass on ONNX Runtime" in text
    assert f"{sum(c['openvino']['passed'] for c in ran_ov)} of {len(ran_ov)} fp32/fp16 pass on OpenVINO" in text
    assert f"(the {len(refused)} bf16 configs are refused there" in text and f"({full['seconds'] / 60:.0f} min, its `seconds`" in text
    runs = [c[rt] for c in configs for rt in ("ort", "openvino") if c[rt]["passed"] is not None]
    plain = [
        c[rt]["max_abs_diff"] for c in configs for rt in ("ort", "openvino") if c["precision"] == "fp32" and c[rt].get("branch_flips") == 0
    ]
    assert f"the largest fp32 difference without a branch flip {short_e(max(plain))}" in text
    assert f"{sum(r['branch_flips'] for r in runs)} proven near-tie flips over all runs" in text
    bf16 = by_name["deit_small_tome_r16_bf16.yaml"]["ort"]
    assert bf16["passed"] and bf16["top1_flips"] == bf16["top1_flips_within_tolerance"]
    assert f"`deit_small_tome_r16_bf16` passes on ONNX Runtime with {bf16['top1_flips']} top-1 flips within tolerance" in text

    added = result("validate_configs_pitome_visionzip.json")
    runs = {(c["config"], rt): c[rt] for c in added["configs"] for rt in ("ort", "openvino")}
    assert all(r["passed"] for r in runs.values()) and not added["failed"]
    n = len(added["configs"])
    assert f"{n} of {n} pass on both runtimes" in text and f", {added['seconds'] / 60:.0f} min)" in text
    flips = [r["branch_flips"] for (name, _), r in runs.items() if "pitome" in name and not name.startswith("digits_vit")]
    assert f"PiToMe on random weights: {min(flips)} to {max(flips)} proven near-tie flips" in text
    assert all(r["branch_flips"] == 0 for (name, _), r in runs.items() if name.startswith("digits_vit")), "none on the digits ViT"
    visionzip = max(r["max_abs_diff"] for (name, _), r in runs.items() if name == "llava15_clip_l336_visionzip_128_tokens.yaml")
    assert f"VisionZip 128 tokens max diff {short_e(visionzip)}" in text

    official = {r["row"]: r for r in result("vs_official_amd_epyc.json")["rows"]}
    mctf = [official[f"mctf_{key}"] for key in ("deit_small_r16", "deit_tiny_r8", "deit_small_fast")]
    assert (
        mctf[0]["images"] == 4
        and (
            f"max \\|logit diff\\| {short_e(mctf[0]['reference_max_abs_diff'])} (DeiT-S r=16, 4 images), "
            f"{short_e(mctf[1]['reference_max_abs_diff'])} (DeiT-T r=8), {short_e(mctf[2]['reference_max_abs_diff'])} (DeiT-S MCTF-Fast) "
            f"for the PyTorch reference, {' / '.join(short_e(r['onnx_ort_max_abs_diff']) for r in mctf)} for the exported graph"
        )
        in text
    )
    demo = (RESULTS / "make_demo_then_test_clean_clone.txt").read_text()
    commit = re.search(r"on a clean clone of (\w+)", demo).group(1)
    seconds = re.search(r"exported deit_small_patch16_224 \(tome, r=16\) -> \S+ in ([\d.]+) s", demo).group(1)
    assert f"{seconds} s for the torch.onnx step of the default config" in text and f"in a clean clone at {commit}" in text

    zen5, zen4 = deit_s_tome("cpu_runtimes_amd_epyc_zen5.json"), deit_s_tome("cpu_runtimes_amd_epyc.json")
    spread = repeats()
    assert (
        f"{zen5['ort', 8]['speedup']:.2f}x at batch 8, {zen5['ort', 1]['speedup']:.2f}x at batch 1 (FLOPs ratio "
        f"{zen5['ort', 8]['flops_ratio']:.2f}x) on the Zen 5 host, with the dense model at {zen5['ort', 8]['dense_p50_ms']:.0f} / "
        f"{zen5['ort', 1]['dense_p50_ms']:.0f} ms; repeats of the batch-8 figure there gave {min(spread):.2f}x-{max(spread):.2f}x"
    ) in text
    assert (
        f"On the Zen 4 host of the earlier run {zen4['ort', 8]['speedup']:.2f}x / {zen4['ort', 1]['speedup']:.2f}x, with the dense "
        f"model at {zen4['ort', 8]['dense_p50_ms']:.0f} / {zen4['ort', 1]['dense_p50_ms']:.0f} ms"
    ) in text


def deit_s_tome(name: str) -> dict:
    """(runtime, batch) -> the DeiT-S ToMe r=16 row of a cpu_runtimes result file."""
    rows = result(name)["rows"]
    return {(r["runtime"], r["batch"]): r for r in rows if r["model"] == "deit_small_patch16_224" and r["method"] == "tome"}


#: the repeated short runs on the Zen 5 host, in the order they ran: (file, code before or after issue 45's body)
REPEATS = [
    ("cpu_runtimes_before_issue45.json", "before"),
    ("cpu_runtimes_after_issue45.json", "after"),
    ("ab_old_1.json", "before"),
    ("ab_bench_1.json", "after"),
    ("ab_old_2.json", "before"),
    ("ab_bench_2.json", "after"),
]


def repeats(code: str | None = None) -> list[float]:
    """DeiT-S ToMe r=16's batch-8 ONNX Runtime speedup of each repeated run (of the code before or after, or all)."""
    return [deit_s_tome(f"cpu_runtimes_zen5_repeats/{name}")["ort", 8]["speedup"] for name, which in REPEATS if code in (None, which)]


def test_the_cpu_performance_prose_is_the_two_hosts_runs_and_the_repeats():
    """The "Two hosts" and "How much one run can move" paragraphs of docs/results/index.md, from the result files."""
    text = section(page("docs/results/index.md"), "## CPU performance (ONNX Runtime and OpenVINO)")
    zen5, zen4 = deit_s_tome("cpu_runtimes_amd_epyc_zen5.json"), deit_s_tome("cpu_runtimes_amd_epyc.json")
    full = result("cpu_runtimes_amd_epyc_zen5.json")
    assert f"--output /tmp/bench/cpu_runtimes_amd_epyc.json`, {full['seconds']:,.0f} s," in text
    assert f"at batch 8, in the ToMe row: {zen5['ort', 8]['dense_p50_ms']:.0f} against {zen4['ort', 8]['dense_p50_ms']:.0f} ms" in text
    assert f"(DeiT-S ToMe r=16: {zen5['ort', 1]['efficiency']:.2f} against {zen4['ort', 1]['efficiency']:.2f} on ONNX Runtime)" in text
    before, after = (", ".join(f"{x:.2f}x" for x in repeats(code)) for code in ("before", "after"))
    assert f"before {before}; after {after} (the table's run: {zen5['ort', 8]['speedup']:.2f}x)" in text
    folder = RESULTS / "cpu_runtimes_zen5_repeats"
    assert sorted(p.name for p in folder.glob("*.json")) == sorted(name for name, _ in REPEATS)
    readme = (folder / "README.md").read_text()
    assert [re.search(rf"\| {i} \| `([^`]+)`", readme).group(1) for i in range(1, 7)] == [name for name, _ in REPEATS]


@pytest.mark.slow  # 16 FLOP counts of DeiT-T/S/B (about 50 s on the 2-core machine)
def test_the_summary_gflops_are_what_inspect_counts():
    """The Summary's GFLOPs and token counts come from no result file: `deploytk inspect` counts them again here."""
    import deploytk

    def inspect(model, **kwargs) -> dict:
        return deploytk.inspect(model, **kwargs).to_dict()

    text = section(page("docs/results/index.md"), "## Summary (CPU, this repository)")
    tome = {}
    for name, rs in (("small", (8, 13, 16)), ("tiny", (8, 12, 16)), ("base", (8, 13, 16))):
        reports = [inspect(f"deit_{name}_patch16_224", method="tome", r=r) for r in rs]
        tome[name] = [f"{g:.2f}" for g in (reports[0]["dense_gflops"], *(x["gflops"] for x in reports))]
    s, t, b = tome["small"], tome["tiny"], tome["base"]
    assert (
        f"DeiT-S {' / '.join(s)} for r = 0 / 8 / 13 / 16; DeiT-T {t[0]} / {t[1]} / {t[2]} (r=12) / {t[3]}; DeiT-B {' / '.join(b)}"
    ) in text

    def mctf(config, **kwargs) -> float:
        return inspect(f"export_configs/{config}.yaml", **kwargs)["gflops"]

    assert f"DeiT-S r=16 **{mctf('deit_small_mctf_r16'):.4f}** (official" in text
    assert f"MCTF-Fast {mctf('deit_small_mctf_fast'):.4f} (2.76)" in text
    assert f"DeiT-T r=16 {mctf('deit_tiny_mctf_r16'):.3f} (0.71), r=8 {mctf('deit_tiny_mctf_r8'):.3f} (official" in text
    assert f"r=18 {mctf('deit_small_mctf_r16', r=18):.4f}, r=20 {mctf('deit_small_mctf_r16', r=20):.4f} (paper" in text
    tokens = inspect("export_configs/deit_small_evit_k70.yaml")["tokens_per_layer"]
    assert f"({' -> '.join(map(str, dict.fromkeys(tokens)))} for evit keep 0.7 at 3/6/9)" in text


def test_the_digits_int8_table_is_what_its_command_prints():
    from benchmarks.digits_int8 import markdown

    assert markdown(result("digits_int8_accuracy.json")) in PROSE


def test_the_triton_load_table_is_what_its_command_prints():
    from benchmarks.triton_load import markdown

    data = result("triton_load_amd_epyc.json")
    assert not data["smoke"] and markdown(data) in PROSE


def test_the_vs_alternatives_page_shows_each_committed_run_or_says_none_is():
    """docs/results/vs-alternatives.md holds `benchmarks/vs_alternatives.py --markdown` of every committed full run, or,
    before the first one, says that it has not been measured (issue 44: no figure without its result file)."""
    from benchmarks.vs_alternatives import markdown

    text = page("docs/results/vs-alternatives.md")
    runs = sorted(RESULTS.glob("vs_alternatives_*.json"))
    for path in runs:
        data = json.loads(path.read_text())
        assert not data["smoke"] and markdown(data) in text, path.name
    assert ("Not measured yet" in text) == (not runs)


def test_the_video_audio_guide_shows_each_committed_run_or_says_none_is():
    """docs/guides/video-audio.md holds `benchmarks/video_audio.py --markdown` of every committed full run, or, before
    the first one, says that it has not been run (issue 45: no figure without its result file)."""
    from benchmarks.video_audio import markdown

    text = page("docs/guides/video-audio.md")
    runs = sorted(RESULTS.glob("video_audio_*.json"))
    for path in runs:
        data = json.loads(path.read_text())
        assert not data["smoke"] and markdown(data) in text, path.name
    assert ("has not yet been run in full" in text) == (not runs)


def test_the_ort_fusion_and_batch_1_profile_tables_are_what_their_commands_print():
    """docs/results/index.md shows benchmarks/ort_fusion.py's table and cpu_op_profile.py's --markdown of each saved
    profile, as their result files hold them."""
    from benchmarks.cpu_op_profile import markdown as profile_table
    from benchmarks.ort_fusion import markdown as fusion_table

    text = page("docs/results/index.md")
    assert fusion_table(result("ort_fusion_amd_epyc.json")) in text
    profiles = sorted(RESULTS.glob("cpu_op_profile_*.json"))
    assert profiles and all(profile_table(json.loads(p.read_text())) in text for p in profiles)


def test_the_token_aggregate_body_table_is_what_its_command_prints():
    """docs/results/index.md shows `benchmarks/token_aggregate_body.py --markdown` of each committed full run."""
    from benchmarks.token_aggregate_body import markdown

    runs = sorted(RESULTS.glob("token_aggregate_body_*.json"))
    assert runs and all(
        not json.loads(p.read_text())["smoke"] and markdown(json.loads(p.read_text())) in page("docs/results/index.md") for p in runs
    )


def test_the_measured_tables_live_on_the_results_pages():
    """A measured table moved back into a guide (or the README) would leave the results pages incomplete."""
    from benchmarks.int8 import markdown as int8_table
    from benchmarks.output_kinds import markdown as output_kinds_table
    from benchmarks.triton_load import markdown as triton_table

    results_pages = "\n".join(text for name, text in prose_pages().items() if name.startswith("docs/results/"))
    assert int8_table(result("int8_amd_epyc.json")) in results_pages
    assert output_kinds_table(result("output_kinds_amd_epyc.json")) in results_pages
    assert triton_table(result("triton_load_amd_epyc.json")) in results_pages


def headline(row_start: str) -> str:
    rows = [line for line in README.splitlines() if line.startswith(f"| {row_start}")]
    assert len(rows) == 1, (row_start, rows)
    return rows[0].split(" | ")[1]


def test_the_readme_headline_figures_are_the_result_files():
    """Each figure in the README's Measured table, recomputed from the result file its page cites."""
    rows = {
        r["batch"]: r["ratios"]["contenders"]["tome_official_compile"]
        for r in result("vs_alternatives_amd_epyc.json")["rows"]
        if r["model"] == "deit_small_patch16_224" and r["method"] == "tome"
    }
    assert headline("DeiT-S ToMe r=16, deploytk's fastest") == (
        f"{rows[1]['x_vs_best_fp32']:.2f}x / {rows[8]['x_vs_best_fp32']:.2f}x faster; "
        f"int8 {rows[1]['x_vs_best_int8']:.2f}x / {rows[8]['x_vs_best_int8']:.2f}x"
    )
    zen5, zen4 = deit_s_tome("cpu_runtimes_amd_epyc_zen5.json"), deit_s_tome("cpu_runtimes_amd_epyc.json")
    assert headline("DeiT-S ToMe r=16 vs dense, fp32") == (
        f"{zen5['ort', 8]['speedup']:.2f}x / {zen5['openvino', 8]['speedup']:.2f}x on a Zen 5 CPU, "
        f"{zen4['ort', 8]['speedup']:.2f}x / {zen4['openvino', 8]['speedup']:.2f}x on a Zen 4 "
        f"(FLOPs ratio {zen5['ort', 8]['flops_ratio']:.2f}x)"
    )

    llava = next(c for c in result("output_kinds_amd_epyc.json")["configs"] if c["config"] == "llava15_clip_l336_tome_144_tokens")
    assert (
        headline("LLaVA-1.5's CLIP")
        == f"{llava['profile_ort_b1']['speedup']:.2f}x (FLOPs ratio {llava['dense_gflops'] / llava['gflops']:.2f}x)"
    )

    int8 = next(c for c in result("int8_amd_epyc_avx512_vnni.json")["configs"] if c["config"] == "deit_small_tome_r16")
    assert headline("DeiT-S ToMe r=16 int8") == f"{int8['openvino_b8']['reduced_int8_vs_dense_fp32']:.2f}x"

    load = result("triton_load_amd_epyc.json")["results"]
    at32 = {m: next(r for r in load[m] if r["concurrency"] == 32)["throughput_per_s"] for m in ("deit_s_tome_r16", "deit_s_dense")}
    assert headline("DeiT-S ToMe r=16 vs dense behind") == f"{at32['deit_s_tome_r16']:.1f} vs {at32['deit_s_dense']:.1f} images/s"

    configs = result("validate_all_configs.json")["configs"]
    ort = sum(c["ort"]["passed"] for c in configs)
    ov = [c["openvino"]["passed"] for c in configs if c["openvino"]["passed"] is not None]  # None: refused (bf16)
    assert headline("every ready-made config").startswith(f"{ort} of {len(configs)} on ONNX Runtime, {sum(ov)} of {len(ov)} on OpenVINO")

    official = result("vs_official_amd_epyc.json")["rows"]
    assert f"({len(official)} comparisons, {len({r['method'] for r in official})} methods)" in README
    assert (
        headline("every method's exported graph vs")
        == f"largest output difference {short_e(max(r['onnx_ort_max_abs_diff'] for r in official))}"
    )

    startup = {r["command"]: r for r in result("cli_startup_amd_epyc.json")["rows"]}
    assert headline("`deploytk --help` on the CLI").startswith(f"{startup['deploytk --help']['median_s']:.3f} s ")
    assert headline("`import deploytk`, median").startswith(f"{startup['import deploytk']['median_s']:.3f} s ")

    digits = {r["config"]: r for r in result("digits_accuracy_vs_gflops.json")["results"]}
    pitome, dense = digits["export_configs/digits_vit_pitome_k90.yaml"], digits["export_configs/digits_vit_dense.yaml"]
    assert pitome["top1"]["ort"] == dense["top1"]["ort"]
    assert headline("digits ViT (trained here), PiToMe") == (
        f"top-1 {100 * pitome['top1']['ort']:.2f}%, as dense, with {pitome['dense_gflops'] / pitome['gflops']:.2f}x fewer FLOPs"
    )


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_the_serving_test_count_is_what_pytest_collects():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/serve"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    collected = int(re.search(r"(\d+) tests? collected", done.stdout).group(1))
    claimed = {int(n) for n in re.findall(r"`tests/serve/`, (\d+) tests", PROSE)}
    assert claimed == {collected}, (claimed, collected)


def test_the_gpu_page_quotes_the_h200_run_and_its_rerun():
    """docs/results/gpu.md: the summary as device_summary.py printed it, and the rerun's counts from its files."""
    folder = "device-check-h200"
    text = page("docs/results/gpu.md")
    summary = result(f"{folder}/summary.json")
    assert f"```text\n{summary['text']}\n```" in text
    cases = result(f"{folder}/selftest_rerun.json")["cases"]
    per_dtype = {d: sum(c["dtype"] == d for c in cases) for d in ("fp32", "fp16", "bf16")}
    assert f"**Selftest: {sum(c['passed'] for c in cases)} of {len(cases)} cases passed**" in text
    assert f"{len({c['op'] for c in cases})} ops" in text and f"({set(per_dtype.values()).pop()} cases each" in text
    assert f"({sum(c['near_ties'] for c in cases)} images over all cases" in text
    worst = {d: max(c["max_abs_err"] / c["tolerance"] for c in cases if c["dtype"] == d and c["tolerance"]) for d in per_dtype}
    assert f"{worst['fp32']:.2f} of its tolerance (fp32), {worst['fp16']:.2f} (fp16 and bf16)" in text
    assert f"{worst['bf16']:.2f}" == f"{worst['fp16']:.2f}"
    log = (RESULTS / folder / "gpu_tests_rerun.txt").read_text()
    passed, skipped = re.search(r"(\d+) passed, (\d+) skipped", log).groups()
    assert f"**GPU tests: {passed} passed, {skipped} skipped.**" in text
    rows = summary["numbers"]["end_to_end_latency"]["rows"]
    speedups = [v for row in rows for v in row["speedup"].values()]
    assert max(speedups) < 1 and f"({min(speedups):.2f}x-{max(speedups):.2f}x)" in text


#: each script's markdown() and the result files it prints a table of (a page holds such a table verbatim)
PRINTED = {
    "output_kinds": ("output_kinds_*.json", "multiscale_profile_*.json"),
    "multiscale_vs_paper": ("multiscale_vs_paper.json",),
    "int8": ("int8_*.json",),
    "digits_int8": ("digits_int8_accuracy.json",),
    "triton_load": ("triton_load_*.json",),
    "vs_alternatives": ("vs_alternatives_*.json",),
    "video_audio": ("video_audio_*.json",),
    "cpu_op_profile": ("cpu_op_profile_*.json",),
    "ort_fusion": ("ort_fusion_*.json",),
    "cpu_runtimes": ("cpu_runtimes_*.json",),
    "accuracy_vs_gflops": ("digits_accuracy_vs_gflops.json",),
    "export_large": ("export_large_*.json",),
    "precision": ("precision_*.json",),
    "token_aggregate_body": ("token_aggregate_body_*.json",),
    "vs_official": ("vs_official_*.json",),
}
#: the tables no script prints, by page and header row: what holds each, or why nothing needs to
NOT_PRINTED = {
    "README.md: | | | docs |": "what is supported; its methods row: test_the_readme_lists_every_method_and_counts_them",
    "README.md: | what | figure | page |": "the headline figures: test_the_readme_headline_figures_are_the_result_files",
    "docs/guides/int8.md: | `--backend` | tool | what it writes | runs on |": "not measured: what each quantizer does",
    "docs/guides/int8.md: | precision | judged by | tolerance |": "not measured: how validate judges int8",
    "docs/guides/methods.md: | `merge.method` | what it does | kind | learned | schedule | custom ops | `merge.options` (default) |": (
        "`deploytk methods --markdown`: tests/merging/test_registry.py"
    ),
    "docs/guides/methods.md: | seed paper (`shared/seeds/`) | what deploytk takes from it | deployable |": "not measured",
    "docs/guides/multiscale.md: | detail | deploytk's choice | why |": "not measured: design choices",
    "docs/guides/video-audio.md: | family | classes | input (ONNX) | prefix tokens |": "not measured: the families",
    "docs/results/index.md: | what | command | result |": (
        "the Summary, typed by hand from several sources: test_the_summary_table_figures_are_the_result_files and (slow) "
        "test_the_summary_gflops_are_what_inspect_counts"
    ),
    "docs/results/index.md: | candidate | GFLOPs | p50 ms (runs) | meets 260 ms |": (
        "test_the_tune_table_and_its_figures_are_the_committed_tune_report"
    ),
    "docs/results/vs-alternatives.md: | contender | what it is |": "not measured: the contenders",
}


def tables(text: str) -> list[tuple[int, list[str]]]:
    """(1-based line, rows) of each run of lines that start with a pipe."""
    found, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|")):
            end = next((k for k in range(i, len(lines)) if not lines[k].startswith("|")), len(lines))
            found.append((i + 1, lines[i:end]))
    return found


def test_every_table_has_a_header_and_every_measured_table_is_held():
    """A table split by a blank line renders its second half as raw pipes; a measured table on the README, a guide or a
    results page is what a script prints from a committed result file, or listed in NOT_PRINTED with what holds it."""
    import importlib

    printed = []
    for script, patterns in PRINTED.items():
        markdown = importlib.import_module(f"benchmarks.{script}").markdown
        files = [path for pattern in patterns for path in sorted(RESULTS.glob(pattern))]
        assert files, script
        printed += [markdown(json.loads(path.read_text())) for path in files]
    printed_text = "\n\n".join(printed)
    unheld, seen = [], set()
    for name, text in prose_pages().items():
        for line, rows in tables(text):
            assert len(rows) >= 2 and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", rows[1]), f"{name}:{line}: a table without its header row"
            if name == "README.md" or name.startswith(("docs/results/", "docs/guides/")):
                key = f"{name}: {rows[0]}"
                if "\n".join(rows) not in printed_text:
                    seen.add(key)
                    if key not in NOT_PRINTED:
                        unheld.append(f"{name}:{line}")
    assert not unheld, f"tables no script prints and NOT_PRINTED does not name: {unheld}"
    assert seen == set(NOT_PRINTED), f"NOT_PRINTED names tables that are gone or now printed: {set(NOT_PRINTED) - seen}"


def test_the_official_code_page_covers_every_row_and_quotes_the_committed_run():
    """docs/results/official-code.md: the committed run holds every row the script has (no smoke), each within the unit
    tests' tolerances, and the prose's figures are its maxima, date and commit."""
    from benchmarks.vs_official import ROWS

    data = result("vs_official_amd_epyc.json")
    rows = data["rows"]
    assert not data["smoke"] and [r["row"] for r in rows] == list(ROWS) and data["command"] == "python benchmarks/vs_official.py"
    assert all(r["reference_max_abs_diff"] <= 1e-4 and r["onnx_ort_max_abs_diff"] <= 1e-3 for r in rows)
    text = " ".join(page("docs/results/official-code.md").split())
    reference, onnx = (max(r[k] for r in rows) for k in ("reference_max_abs_diff", "onnx_ort_max_abs_diff"))
    assert f"at most {short_e(reference)} for the reference and {short_e(onnx)} for the exported graph" in text
    scales = [r["official_scale"] for r in rows]
    assert f"largest magnitude is {min(scales):.2f} to {max(scales):.2f}" in text
    assert f"on {data['created'][:10]} at " in text and f"({data['seconds']:.0f} s, its `seconds`" in text
    assert f"ONNX Runtime {data['environment']['versions']['onnxruntime']}, torch {data['environment']['versions']['torch']}" in text
    import numpy as np

    study = np.load(ROOT / "tests" / "data" / "study_official.npz")
    noise = {
        k: np.abs(study[f"dpcknn_{k}_logits"] - study[f"dpcknn_{k}_logits_noiseless"]).max() for k in ("deit_small_k0.7", "deit_tiny_k0.5")
    }
    assert (
        noise["deit_tiny_k0.5"] == 0
        and f"the recorded DeiT-S logits move by {noise['deit_small_k0.7']:.2f} (the DeiT-T ones not at all)" in text
    )
    newer = [r for r in rows if r["official"].startswith(("hchautran/PiToMe", "dvlab-research/VisionZip"))]
    verified = " ".join(page("docs/results/verified-on.md").split())
    assert (
        f"reference within {short_e(max(r['reference_max_abs_diff'] for r in newer))}, exported graph on ONNX Runtime within "
        f"{short_e(max(r['onnx_ort_max_abs_diff'] for r in newer))}"
    ) in verified
    visionzip = [r for r in rows if r["method"] == "visionzip"]
    methods = " ".join(page("docs/guides/methods.md").split())
    assert (
        f"to {short_e(max(r['reference_max_abs_diff'] for r in visionzip))} and the exported graph on ONNX Runtime to "
        f"{short_e(max(r['onnx_ort_max_abs_diff'] for r in visionzip))}"
    ) in methods
