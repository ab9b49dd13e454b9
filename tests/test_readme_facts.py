"""The lists, counts and measured tables of the README and the docs pages are held to what they describe: the
registries, and the result files in benchmarks/results/ (issue 43: the facts test moves with the facts).

A measured table that a script prints must appear verbatim on some prose page (README.md or docs/, not the generated
docs/reference/); the README's headline figures are recomputed from the same files. (The methods table is held to
`deploytk methods --markdown` in tests/merging/test_registry.py.)
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
    rows = {
        (r["runtime"], r["batch"]): r
        for r in result("cpu_runtimes_amd_epyc.json")["rows"]
        if r["model"] == "deit_small_patch16_224" and r["method"] == "tome"
    }
    assert headline("DeiT-S ToMe r=16 vs dense, fp32") == (
        f"{rows['ort', 8]['speedup']:.2f}x / {rows['openvino', 8]['speedup']:.2f}x (FLOPs ratio {rows['ort', 8]['flops_ratio']:.2f}x)"
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

    startup = {r["command"]: r for r in result("cli_startup_amd_epyc.json")["rows"]}
    assert headline("`deploytk --help` on the CLI").startswith(f"{startup['deploytk --help']['median_s']:.3f} s ")

    digits = {r["config"]: r for r in result("digits_accuracy_vs_gflops.json")["results"]}
    pitome, dense = digits["export_configs/digits_vit_pitome_k90.yaml"], digits["export_configs/digits_vit_dense.yaml"]
    assert pitome["top1"]["ort"] == dense["top1"]["ort"]
    assert headline("digits ViT (trained here), PiToMe") == (
        f"top-1 {100 * pitome['top1']['ort']:.2f}%, as dense, with {pitome['dense_gflops'] / pitome['gflops']:.2f}x fewer FLOPs"
    )


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
