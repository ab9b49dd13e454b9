"""Honest progress (issue 41): real counts where the work's size is known (images validated, runs profiled), a
spinner and no ``0/?`` where it is not; and `profile` says when the reduced model is slower than dense."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from deploytk.backends import Backend, LoadedModel
from deploytk.cli import render
from deploytk.cli.render import RichProgress
from deploytk.data import synthetic_batches
from deploytk.exporter.artifacts import Artifact
from deploytk.profile.profiler import profile
from deploytk.progress import Progress
from deploytk.validate.validator import Tolerances, validate_each


class Recorded(Progress):
    """Every call, in order."""

    def __init__(self):
        self.calls = []

    def step(self, message):
        self.calls.append(("step", message))

    def start(self, total, message):
        self.calls.append(("start", total, message))

    def advance(self, units=1):
        self.calls.append(("advance", units))


def phases(calls) -> list[tuple[int, str, int]]:
    """(total, message, units advanced) of each counted phase."""
    found = []
    for call in calls:
        if call[0] == "start":
            found.append([call[1], call[2], 0])
        elif call[0] == "advance":
            found[-1][2] += call[1]
    return [tuple(p) for p in found]


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_validate_counts_the_images_through_the_reference_and_each_runtime(exported):
    art = exported("digits_vit_tome_r4", fmt="onnx-inlined")
    batches = synthetic_batches(10, 4, Artifact.open(art).input_kind)  # 4 + 4 + 2: the count is images, not batches
    progress = Recorded()
    reports = validate_each(art, ["ort", "openvino"], batches, Tolerances(), progress)
    assert all(r.passed for r in reports)
    assert phases(progress.calls) == [
        (10, "running 10 images through the PyTorch reference", 10),
        (10, "running 10 images through ort", 10),
        (10, "running 10 images through openvino", 10),
    ]
    assert [units for kind, *rest in progress.calls if kind == "advance" for units in rest] == [4, 4, 2] * 3


class Constant(LoadedModel):
    """A model whose every run takes ``ms[batch size]`` milliseconds: a verdict that hangs on no real timing."""

    def __init__(self, ms: dict[int, float]):
        self.ms = ms

    def run(self, batch):
        raise AssertionError("profile only times")

    def timer(self, batch_size):
        return lambda: self.ms[batch_size] / 1e3


class Timed(Backend):
    """ONNX Runtime's name and device, made-up latencies: reduced slower than dense at batch 1, faster at 8."""

    name = "ort"
    display_name = "made-up timings"

    def device(self):
        return "cpu"

    def load(self, artifact, batch_sizes, graph=None, progress=None):
        raise AssertionError("profile only times")

    def load_for_timing(self, artifact, batch_sizes, progress=None):
        return Constant({1: 2.0, 8: 4.0}), Constant({1: 1.0, 8: 8.0})


def test_profile_counts_its_runs_and_warns_where_the_reduced_model_is_slower(exported, capsys):
    art = exported("digits_vit_tome_r4")
    progress = Recorded()
    result = profile(art, Timed(), [1, 8], warmup=2, iterations=3, progress=progress)
    assert phases(progress.calls) == [
        (2, "batch 1: 2 warm-up runs of each model", 2),
        (3, "batch 1: 3 timed runs of each model, alternating", 3),
        (2, "batch 8: 2 warm-up runs of each model", 2),
        (3, "batch 8: 3 timed runs of each model, alternating", 3),
    ]
    assert [row["speedup_vs_dense"] for row in result["results"]] == [0.5, 2.0]
    (warning,) = result["warnings"]  # batch 8 is faster: no warning for it
    assert warning["batch_size"] == 1 and warning["speedup_vs_dense"] == 0.5
    assert warning["message"] == "at batch 1 the reduced model is slower than dense (0.50x on ort)"
    tried = "\n".join(warning["suggestions"])
    assert "a larger batch than 1" in tried and "a lower r than 4" in tried and "`backend=openvino`" in tried
    assert "`backend=ort`" not in tried and "ort-cuda" not in tried  # not itself, not a GPU runtime on a CPU run

    render.profile(result, json_out=False)
    printed = " ".join(capsys.readouterr().out.split())
    assert "warning: at batch 1 the reduced model is slower than dense (0.50x on ort); try:" in printed
    assert "a lower r than 4" in printed and "warning: at batch 8" not in printed
    render.profile(result, json_out=True)
    assert json.loads(capsys.readouterr().out)["warnings"] == result["warnings"]


def test_a_faster_reduced_model_gets_no_warning(exported):
    class Faster(Timed):
        def load_for_timing(self, artifact, batch_sizes, progress=None):
            return Constant({2: 1.0}), Constant({2: 1.5})

    result = profile(exported("digits_vit_tome_r4"), Faster(), [2], warmup=0, iterations=1)
    assert result["warnings"] == [] and result["results"][0]["speedup_vs_dense"] == 1.5


def drawn(progress: RichProgress, console: Console) -> str:
    progress._bar.refresh()
    return console.file.getvalue()


def test_the_bar_shows_counts_for_a_counted_phase_and_only_a_spinner_otherwise():
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    with RichProgress(console=console) as progress:
        progress.step("exporting to ONNX")
        step = drawn(progress, console)
        progress.start(64, "running 64 images through ort")
        progress.advance(8)
        progress.advance(8)
        counted = drawn(progress, console)
    assert "exporting to ONNX..." in step and "0/?" not in step and "/" not in step.split("exporting to ONNX...")[-1]
    assert "16/64" in counted
