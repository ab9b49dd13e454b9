"""The README's lists and counts that describe the code are held to the registries they describe.

(The methods table is held to `deploytk methods --markdown` in tests/merging/test_registry.py.)
"""

import json
import re
from pathlib import Path

import pytest
import tomllib

from deploytk.backends import BACKENDS
from deploytk.ops import OPS
from deploytk.reducers import METHODS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def expand(pattern: str) -> list[str]:
    """Shell brace expansion: a_{x,y}_{1,2} -> a_x_1, a_x_2, a_y_1, a_y_2."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if not match:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [name for option in match.group(1).split(",") for name in expand(head + option + tail)]


def section(start: str) -> str:
    text = README[README.index(start) :]
    return text[: text.index("\n\n", text.index("\n\n") + 2)]  # the heading line's paragraph and the list after it


def test_the_ready_made_config_list_is_the_folder():
    lines = [line for line in section("Ready-made configs").splitlines() if line.startswith("- ")]
    listed = [name for line in lines for name in re.findall(r"`([^`]+)`", line.split(": ", 1)[0])]  # the names before the colon
    expanded = [stem for pattern in listed for stem in expand(pattern)]
    assert len(expanded) == len(set(expanded)), "a config is listed twice"
    assert set(expanded) == {p.stem for p in (ROOT / "export_configs").glob("*.yaml")}


def test_the_config_example_names_every_method():
    line = next(line for line in README.splitlines() if line.strip().startswith("method: tome"))
    assert [m.strip() for m in line.split("#", 1)[1].split("(")[0].split("|")] == sorted(METHODS)


def test_op_and_kernel_counts_and_the_selftest_op_list():
    from deploytk_plugins.aot import standard_variants

    assert {int(n) for n in re.findall(r"\b(\d+) ops\b", README)} == {len(OPS)}
    assert {int(n) for n in re.findall(r"\b(\d+) kernels\b", README)} == {len(standard_variants())}
    row = next(line for line in README.splitlines() if line.startswith("| `deploytk selftest"))
    listed = re.search(r"one per deploytk op: ([^)]*)\)", row).group(1).split(", ")
    assert sorted(listed) == sorted(OPS)


def test_the_cli_table_lists_the_backends():
    for command, names in (
        ("profile", list(BACKENDS)),
        ("validate", [n for n, b in BACKENDS.items() if b.validates]),
        ("eval", [n for n, b in BACKENDS.items() if b.validates]),
    ):
        row = next(line for line in README.splitlines() if line.startswith(f"| `deploytk {command} "))
        assert re.search(r"--backend ([a-z\\|-]+)\]", row).group(1).split("\\|") == names, command


def test_the_install_table_lists_the_extras():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    listed = re.findall(r"^\| `deploytk\[([a-z0-9]+)\]`", README, flags=re.M)
    assert listed and sorted(listed) == sorted(extras)


def test_the_output_kinds_table_is_what_its_command_prints():
    """The README's measured table of dense features and token sets is `output_kinds.py --markdown` of the committed JSON."""
    from benchmarks.output_kinds import markdown

    for name in (
        "output_kinds_amd_epyc.json",
        "output_kinds_amd_epyc_dinov2_unmerge_gather.json",
        "output_kinds_amd_epyc_visionzip_pitome.json",
        "output_kinds_amd_epyc_pitome.json",
        "multiscale_profile_amd_epyc.json",
    ):
        result = json.loads((ROOT / "benchmarks" / "results" / name).read_text())
        assert markdown(result) in README, name


def test_the_multiscale_table_is_what_its_command_prints():
    """The README's multi-scale parameters / GFLOPs table is `multiscale_vs_paper.py`'s table of the committed JSON."""
    from benchmarks.multiscale_vs_paper import markdown

    result = json.loads((ROOT / "benchmarks" / "results" / "multiscale_vs_paper.json").read_text())
    assert markdown(result) in README


@pytest.mark.parametrize("name", ["int8_amd_epyc.json", "int8_amd_epyc_avx512_vnni.json"])
def test_the_int8_tables_are_what_their_command_prints(name):
    """The README's int8 tables (an AVX2 CPU, an AVX512-VNNI CPU) are `benchmarks/int8.py --markdown` of the committed JSON."""
    from benchmarks.int8 import markdown

    result = json.loads((ROOT / "benchmarks" / "results" / name).read_text())
    assert not result["smoke"] and markdown(result) in README


def test_the_digits_int8_table_is_what_its_command_prints():
    """The README's digits int8 accuracy table is `benchmarks/digits_int8.py --markdown` of the committed JSON."""
    from benchmarks.digits_int8 import markdown

    result = json.loads((ROOT / "benchmarks" / "results" / "digits_int8_accuracy.json").read_text())
    assert markdown(result) in README


def test_the_triton_load_table_is_what_its_command_prints():
    """The README's serving load table is `benchmarks/triton_load.py --markdown` of the committed JSON."""
    from benchmarks.triton_load import markdown

    result = json.loads((ROOT / "benchmarks" / "results" / "triton_load_amd_epyc.json").read_text())
    assert not result["smoke"] and markdown(result) in README


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
    claimed = {int(n) for n in re.findall(r"`tests/serve/`, (\d+) tests", README)}
    assert claimed == {collected}, (claimed, collected)
