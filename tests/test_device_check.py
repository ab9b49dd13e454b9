"""The GPU check (scripts/device_check.sh) as a dry run on the CPU, and the device kit's pins against what deploytk needs.

The dry run is the GPU run's steps on the CPU (Triton's interpreter, small shapes, one iteration), so the one command
the rare GPU machine runs has run here first: every step ok, every result file JSON that names its device, and the
summary it prints last. The dry-run tests share one run of about 90 s on the 2-core machine (the interpreted selftest,
~35 s, and the interpreted end-to-end variants, ~35 s, are most of it), in the default suite: the script cannot rot.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch
from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from device_kit import IMAGE_MARKERS, normalize, read_image_packages, read_pins  # noqa: E402  (scripts/device_kit.py)

STEPS = ["install", "doctor", "selftest", "gpu_tests", "kernel_bandwidth", "end_to_end_latency"]
RESULTS = {
    "doctor": "doctor.json",
    "selftest": "selftest.json",
    "gpu_tests": "gpu_tests.json",
    "kernel_bandwidth": "kernel_bandwidth.json",
    "end_to_end_latency": "end_to_end_latency.json",
}
KERNEL_OPS = {"TokenAggregate", "ProportionalAttention", "ToMeMatch", "MctfMatch", "SizeSplitMatch", "TopKSelect", "CrucialMatch"}


def run_check(outdir: Path, **env_extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "TRITON_INTERPRET", "DEVICE_DRY_RUN")}
    env |= {"PYTHON": sys.executable, **env_extra}
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "device_check.sh"), str(outdir)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900
    )


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    outdir = tmp_path_factory.mktemp("device-check")
    done = run_check(outdir, DEVICE_DRY_RUN="1")
    return outdir, done


def read(outdir: Path, name: str) -> dict:
    return json.loads((outdir / name).read_text())


@pytest.mark.slow  # the dry run (one module fixture) takes about 70 s on the 2-core machine: the slow tier runs it
def test_dry_run_passes_every_step_and_writes_json_naming_the_device(dry_run):
    outdir, done = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = sorted(p.name for p in outdir.iterdir())
    assert files == sorted([*RESULTS.values(), "summary.json", "device_check.log"])  # the device tool brings back 8 files at most
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in files)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    for step, name in [*RESULTS.items(), ("summary", "summary.json")]:
        stamp = read(outdir, name)["device_check"]
        assert stamp["gpu"] == gpu and stamp["device"] == ("cuda" if gpu else "cpu") and stamp["dry_run"] is True, (name, stamp)
        assert stamp["step"] == step
        if step != "summary":
            assert stamp["status"] == "ok" and stamp["seconds"] > 0
    summary = read(outdir, "summary.json")
    assert [s["name"] for s in summary["steps"]] == STEPS
    assert all(s["status"] == "ok" and s["exit"] == 0 and 0 < s["seconds"] <= s["limit_s"] for s in summary["steps"]), summary["steps"]
    budgets, allowed = dict(zip(STEPS, (30, 30, 240, 60, 30, 150), strict=True)), 0
    for s in summary["steps"]:  # each step's budget, plus what the steps before it left
        allowed += budgets[s["name"]]
        assert budgets[s["name"]] <= s["limit_s"] <= allowed, s
    assert summary["passed"] and summary["dry_run"] and summary["device"]["gpu"] == gpu and summary["requirement_mismatches"] == []
    log = (outdir / "device_check.log").read_text()
    assert all(f"== {step}: ok (exit 0" in log for step in STEPS)


@pytest.mark.slow
def test_dry_run_selftest_runs_every_kernel_in_the_interpreter(dry_run):
    from deploytk.ops import OPS

    outdir, _ = dry_run
    report = read(outdir, "selftest.json")
    assert report["environment"]["mode"] == "interpreter" and report["passed"]
    cases = report["cases"]
    assert all(c["passed"] for c in cases) and {c["op"] for c in cases} == set(OPS) and {c["dtype"] for c in cases} == {"fp32", "fp16"}
    numbers = read(outdir, "summary.json")["numbers"]["selftest"]
    assert numbers["cases"] == numbers["passed_cases"] == len(cases) and numbers["ops"] == len(OPS) and numbers["passed"]
    assert all(c["seconds"] > 0 for c in cases) and set(numbers["seconds_by_op"]) == set(OPS)  # where the selftest's time goes
    assert list(numbers["seconds_by_op"].values()) == sorted(numbers["seconds_by_op"].values(), reverse=True)


@pytest.mark.slow
def test_dry_run_gpu_tests_step_collects_the_gpu_tests(dry_run):
    outdir, _ = dry_run
    report = read(outdir, "gpu_tests.json")
    names = [t["name"] for t in report["tests"]]
    # the selftest test repeats the selftest step, so the step deselects it
    assert "tests/kernels/test_kernels_gpu.py::test_native_selftest_passes_for_every_op_and_dtype" not in names
    assert sum(n.startswith("tests/kernels/test_kernels_gpu.py::test_merged_model_on_cuda") for n in names) >= 6  # one per method
    assert report["failed"] == report["errors"] == 0 and report["passed"] + report["skipped"] == len(names)
    if not torch.cuda.is_available():  # marked gpu: they skip themselves, with the reason
        assert report["skipped"] == len(names) and all("needs a CUDA GPU" in t["message"] for t in report["tests"])


@pytest.mark.slow
def test_dry_run_benchmarks_run_the_kernels(dry_run):
    outdir, _ = dry_run
    numbers = read(outdir, "summary.json")["numbers"]
    bandwidth = read(outdir, "kernel_bandwidth.json")
    assert bandwidth["smoke"] and bandwidth["environment"]["device"] == "cpu" and {c["op"] for c in bandwidth["cases"]} == KERNEL_OPS
    assert numbers["kernel_bandwidth"]["x_bound"] == {c["op"]: c["x_bound"] for c in bandwidth["cases"]}
    latency = read(outdir, "end_to_end_latency.json")
    (row,) = latency["results"]
    variants = {"dense", "tome", "tome_sdpa", "tome_eager", "mctf_r16", "atm_calibrated", "evit_k70", "crucial_k70"}
    assert latency["kernels"] == "triton-interpreter" and latency["failed"] == {} and set(row["median_ms"]) == variants
    launches = latency["kernel_launches"][row["model"]]
    assert launches["dense"] == launches["tome_eager"] == {}  # the eager reference ran no kernel
    assert launches["tome"] == {"proportional_attention": 12, "tome_match": 12, "token_aggregate": 24}  # 12 blocks, x and size merged
    assert launches["tome_sdpa"] == {"tome_match": 12, "token_aggregate": 24} and launches["mctf_r16"]["mctf_match"] > 0
    (summary_row,) = numbers["end_to_end_latency"]["rows"]
    assert summary_row["speedup"] == {k.removeprefix("speedup_"): v for k, v in row.items() if k.startswith("speedup_")}
    assert set(summary_row["speedup"]) == variants - {"dense"}


@pytest.mark.slow
def test_dry_run_prints_the_summary_last(dry_run):
    outdir, done = dry_run
    printed = done.stdout.rstrip("\n").split("\n\n")[-1]
    assert printed == read(outdir, "summary.json")["text"]
    lines = printed.splitlines()
    assert lines[0].startswith("deploytk GPU check, DRY RUN") and lines[-1].startswith("result: all 6 steps ok;")
    for step in STEPS:
        assert any(re.match(rf"{step}\s+ok\s+\d+\.\d\s+\d+\s", line) for line in lines), step
    assert any(line.startswith("selftest: ") and " cases passed (interpreter;" in line for line in lines)
    assert sum(line.strip().startswith(tuple(KERNEL_OPS)) and "x_bound" in line for line in lines) == len(KERNEL_OPS)
    assert any("deit_tiny_patch16_224 b=1" in line and "tome_eager" in line for line in lines)


def test_without_the_kit_the_check_stops_at_once_naming_make_device_kit(tmp_path):
    (tmp_path / "kit").mkdir()
    done = run_check(tmp_path / "out", DEVICE_KIT=str(tmp_path / "kit"))
    assert done.returncode == 2 and "make device-kit" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert done.stdout == "" and not (tmp_path / "out" / "summary.json").exists()


def test_the_kit_carries_exactly_what_deploytk_needs_beyond_the_gpu_image():
    """The Requires-Dist closure of deploytk's dependencies (no extras, the GPU machine's markers), stopping at what the
    image has: each of those distributions is pinned in scripts/device_kit.txt, and nothing else is."""
    image = read_image_packages()
    assert {"torch", "triton", "timm", "onnx", "onnxruntime", "typer", "rich", "pyyaml", "py-cpuinfo", "typing-extensions"} <= image
    environment = {**default_environment(), **IMAGE_MARKERS}
    needed, todo = set(), ["deploytk"]
    while todo:
        name = todo.pop()
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            pytest.fail(f"{name} (needed on the GPU machine, which lacks it) is not installed here to read its requirements")
        for req in map(Requirement, requires):
            dist = normalize(req.name)
            if (req.marker is None or req.marker.evaluate(environment)) and dist not in image and dist not in needed:
                needed.add(dist)
                todo.append(req.name)
    pins = read_pins()
    assert {normalize(name) for name, _, _ in pins} == needed
    assert len(pins) == len(needed)  # one version each: two stop the install
    assert {"pydantic", "pydantic-core", "fvcore", "iopath", "polygraphy"} <= needed
