"""The Triton kernels: selftest in Triton's CPU interpreter, bad input, and that selftest can fail."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from deploytk.errors import DeploytkError
from deploytk.ops import OPS, kernel_common, selftest
from deploytk.ops.crucial_match.reference import crucial_match
from deploytk.ops.ties import rounding_ties
from deploytk.ops.tome_match import tome_near_ties
from deploytk.ops.tome_match.reference import tome_dest

#: every op's torch launcher by torch-op name (launch.tome_match(...)), as the CUDA dispatch calls them
launch = SimpleNamespace(**{spec.torch_name: spec.kernel_module().launch for spec in OPS.values()})


def run_cli(*args, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-c", "from deploytk.cli import main; main()", *args], capture_output=True, text=True, env=env)


@pytest.mark.slow  # every op through Triton's interpreter on the CPU: 33 s, out of the quick check
def test_interpreter_selftest_passes_for_every_op():
    """What CI runs: TRITON_INTERPRET=1 deploytk selftest --json (a subprocess: the variable must be set before
    Triton decorates the kernels)."""
    from deploytk.ops import OPS

    result = run_cli("selftest", "--json", env_extra={"TRITON_INTERPRET": "1"})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["environment"]["mode"] == "interpreter" and report["passed"]
    cases = report["cases"]
    assert {c["op"] for c in cases} == set(OPS)  # every deploytk op has a kernel
    assert {c["dtype"] for c in cases} == {"fp32", "fp16"}  # bf16: GPU only (interpreter's bf16 dot is wrong)
    assert all(set(c) >= {"op", "dtype", "shape", "max_abs_err", "passed"} for c in cases)
    assert len({c["shape"]["B"] for c in cases}) >= 3  # several batch sizes
    for c in cases:  # real agreement, not just "passed"
        assert c["max_abs_err"] <= (1e-5 if c["dtype"] == "fp32" else 5e-3), c
    matches = [c for c in cases if c["op"] == "ToMeMatch"]
    assert {c["shape"]["sort_unmerged"] for c in matches} == {True, False} and {c["shape"]["protected"] for c in matches} >= {1, 2}
    assert all(c["max_abs_err"] == 0 and c["near_ties"] == 0 for c in matches)  # the interpreter reproduces the reference exactly
    selections = [c for c in cases if c["op"] in ("MctfMatch", "SizeSplitMatch", "TopKSelect", "CrucialMatch")]
    assert all(c["max_abs_err"] == 0 and c["near_ties"] == 0 for c in selections)
    mctf = [c["shape"] for c in cases if c["op"] == "MctfMatch"]
    assert {m["bidirection"] for m in mctf} == {True, False} and {m["protected"] for m in mctf} >= {0, 1, 2}  # all slot orders
    assert {tuple(m["taus"]) for m in mctf} == {(1.0, 20.0, 40.0), (1.0, 0.0, 0.0)}
    assert_readme_counts(cases)


def assert_readme_counts(cases):
    """The "Verified on" page's counts of interpreter selftest cases are this run's counts."""
    from collections import Counter

    readme = (Path(__file__).resolve().parents[2] / "docs" / "results" / "verified-on.md").read_text()
    paragraph = " ".join(readme[readme.index("TRITON_INTERPRET=1 deploytk selftest` passes") :].split("\n- ")[0].split())
    assert f"{len(cases)} cases over the {len({c['op'] for c in cases})} ops" in paragraph
    per_op = Counter(c["op"] for c in cases)
    for op, count in per_op.items():
        claims = re.findall(rf"{op}[^()]*\((\d+)[^)]*\)", paragraph)
        if claims:
            assert int(claims[0]) == count, (op, count, claims)
    claimed = {op for op in per_op if re.search(rf"{op}[^()]*\(\d+", paragraph)}
    assert claimed == set(per_op) - {"TokenAggregate", "ProportionalAttention"}, claimed  # every matching op's count is stated


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_selftest_without_gpu_or_interpreter_says_what_to_do():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: selftest would run natively")
    result = run_cli("selftest", env_extra={"TRITON_INTERPRET": "0"})
    assert result.returncode == 2 and "TRITON_INTERPRET=1 deploytk selftest" in result.stderr


def test_selftest_fails_when_a_kernel_is_wrong(monkeypatch):
    monkeypatch.setattr(kernel_common, "interpreting", lambda: True)  # CPU tensors, interpreter-sized shapes
    ops = torch.ops.deploytk

    def shifted_match(m, r, p, srt):  # A tokens' slots rotated by one
        dest = ops.tome_match(m.float(), r, p, srt)
        dest[:, 0::2] = dest[:, 0::2].roll(1, dims=1)
        return dest

    def rotate(dest):  # every token sent to the next token's slot
        return dest.roll(1, dims=1)

    wrong = {
        "TokenAggregate": lambda x, w, d, t, n: ops.token_aggregate(x.float(), w, d, t, n) * 1.1,
        "ProportionalAttention": lambda q, k, v, s, sc: ops.proportional_attention(q.float(), k.float(), v.float(), s, sc) + 0.1,
        "ToMeMatch": shifted_match,
        "TopKSelect": lambda s, k, p: rotate(ops.topk_select(s.float(), k, p)),
        "CrucialMatch": lambda m, s, k, p: rotate(ops.crucial_match(m.float(), s.float(), k, p)),
        "SizeSplitMatch": lambda m, s, r, p: rotate(ops.size_split_match(m.float(), s.float(), r, p)),
        "MctfMatch": lambda m, rc, s, *a: rotate(ops.mctf_match(m.float(), rc.float(), s.float(), *a)),
        "KMedoidsSelect": lambda d, w, k, it: rotate(ops.kmedoids_select(d.float(), w.float(), k, it)),
        "DPCKNNAssign": lambda d, k, nb: rotate(ops.dpcknn_assign(d.float(), k, nb)),
        "ATSSample": lambda s, z, st: rotate(ops.ats_sample(s.float(), z, st)),
        "PiToMeMatch": lambda m, r, p, mg, a, pr: rotate(ops.pitome_match(m.float(), r, p, mg, a, pr)),
        "VisionZipSelect": lambda s, m, d, c, p: rotate(ops.visionzip_select(s.float(), m.float(), d, c, p)),
    }
    assert set(wrong) == set(OPS)
    for name, fn in wrong.items():
        monkeypatch.setattr(OPS[name].kernel_module(), "launch", fn)
    cases = selftest.run()
    assert {c.op for c in cases} == set(OPS)
    assert cases and not any(c.passed for c in cases)


def test_rounding_ties_accepts_only_choices_the_reference_makes_at_rounding_level():
    g = torch.Generator().manual_seed(0)
    metric, scores = torch.randn(2, 12, 8, generator=g), torch.rand(2, 12, generator=g)
    dest = crucial_match(metric, scores, 4, 1)
    assert rounding_ties(crucial_match, [metric, scores, 4, 1], dest, 0) == 0
    wrong = dest.clone()
    wrong[0] = wrong[0].roll(1)
    assert rounding_ties(crucial_match, [metric, scores, 4, 1], wrong, 0) is None
    # crucial tokens 1 and 2 identical, token 5 parallel to both: it may join either (the reference takes the first)
    scores = torch.tensor([[0.0, 0.9, 0.8, 0.7, 0.6] + [0.1] * 7] * 2)  # token 0 protected; tokens 1-4 are crucial
    tied = metric.clone()
    tied[0, 2] = tied[0, 1]
    tied[0, 5] = 2 * tied[0, 1]
    want = crucial_match(tied, scores, 4, 1)
    assert want[0, 5] == want[0, 1] == 1
    other = want.clone()
    other[0, 5] = want[0, 2]
    assert rounding_ties(crucial_match, [tied, scores, 4, 1], other, 0) == 1
    assert rounding_ties(crucial_match, [tied, scores, 4, 1], other, None) is None  # no arithmetic to perturb: an error


def test_tome_near_ties_accepts_only_tie_equivalent_matchings():
    g = torch.Generator().manual_seed(3)
    metric = torch.randn(2, 21, 8, generator=g)
    dest = tome_dest(metric, 5, 1, True)
    assert tome_near_ties(metric, dest, 5, 1, True) == 0
    swapped = dest.clone()
    swapped[0, [2, 4]] = swapped[0, [4, 2]]  # two A tokens trade slots: a wrong merge, not a tie
    if not torch.equal(swapped, dest):
        assert tome_near_ties(metric, swapped, 5, 1, True) is None
    # an exact tie: B0 and B1 (tokens 3 and 5 when token 1 is protected... here protected=1 so B starts at token 1)
    tied = metric.clone()
    tied[:, 5] = tied[:, 3]  # B1 == B2: every A token scores them equally
    want = tome_dest(tied, 5, 1, True)
    other = want.clone()
    b_slots = {int(want[0, 3]): int(want[0, 5]), int(want[0, 5]): int(want[0, 3])}
    other[0, ::2] = torch.tensor([b_slots.get(int(v), int(v)) for v in want[0, ::2]])  # sources sent to the twin
    if not torch.equal(other, want):
        assert tome_near_ties(tied, other, 5, 1, True) == 1


def test_tome_match_bad_input_fails_before_launch(monkeypatch):
    with pytest.raises(DeploytkError, match=r"r=9 is not allowed for 17 tokens with 1 protected"):
        launch.tome_match(torch.zeros(2, 17, 8), 9, 1, True)
    with pytest.raises(DeploytkError, match=r"expects metric \[B, N, D\]"):
        launch.tome_match(torch.zeros(17, 8), 2, 1, True)
    with pytest.raises(DeploytkError, match="float64 is not supported"):
        launch.tome_match(torch.zeros(2, 17, 8, dtype=torch.float64), 2, 1, True)
    monkeypatch.setattr(kernel_common, "interpreting", lambda: False)
    with pytest.raises(DeploytkError, match="CUDA tensors"):
        launch.tome_match(torch.zeros(2, 17, 8), 2, 1, True)


def test_valid_assignment_fills_every_slot():
    dest = selftest.valid_assignment(3, 50, 20, torch.Generator().manual_seed(0))
    for row in dest:
        assert set(range(20)) <= set(row.tolist()) and int(row.max()) <= 20


@pytest.mark.parametrize(
    "args, message",
    [
        ((torch.zeros(2, 5), torch.ones(2, 5, 1), torch.zeros(2, 5, dtype=torch.long), 3, True), "expects x [B, N, C]"),
        ((torch.zeros(2, 5, 4), torch.ones(3, 5, 1), torch.zeros(2, 5, dtype=torch.long), 3, True), "disagree on batch"),
        ((torch.zeros(2, 5, 4), torch.ones(2, 5, 1), torch.zeros(2, 5, dtype=torch.long), 6, True), "tokens_out=6 must be in [1, 5]"),
        (
            (torch.zeros(2, 5, 4, dtype=torch.float64), torch.ones(2, 5, 1), torch.zeros(2, 5, dtype=torch.long), 3, True),
            "float64 is not supported",
        ),
    ],
)
def test_token_aggregate_bad_input_fails_before_launch(args, message):
    with pytest.raises(DeploytkError, match=message.replace("[", r"\[").replace("]", r"\]")):
        launch.token_aggregate(*args)


def test_attention_bad_input_fails_before_launch(monkeypatch):
    q = torch.zeros(2, 3, 10, 16)
    with pytest.raises(DeploytkError, match="size"):
        launch.proportional_attention(q, q, q, torch.ones(3, 10, 1), 0.25)  # mismatched batch
    with pytest.raises(DeploytkError, match="v of q's shape"):
        launch.proportional_attention(q, q, torch.zeros(2, 3, 10, 8), torch.ones(2, 10, 1), 0.25)
    monkeypatch.setattr(kernel_common, "interpreting", lambda: False)
    with pytest.raises(DeploytkError, match="CUDA tensors"):
        launch.proportional_attention(q, q, q, torch.ones(2, 10, 1), 0.25)


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: launch.topk_select(torch.rand(2, 10), 9, 1),
            "keep=9 is not allowed for 10 tokens with 1 protected; keep must be in [1, 8]",
        ),
        (lambda: launch.topk_select(torch.rand(2, 10, 1), 3, 1), "expects scores [B, N]"),
        (lambda: launch.crucial_match(torch.zeros(3, 10, 8), torch.rand(2, 10), 3, 1), "expects scores [B, N] and metric [B, N, D]"),
        (lambda: launch.size_split_match(torch.zeros(2, 10, 8), torch.ones(2, 9, 1), 2, 1), "disagree on batch/token count"),
        (
            lambda: launch.size_split_match(torch.zeros(2, 10, 8), torch.ones(2, 10, 1), 5, 1),
            "r=5 is not allowed for 10 tokens with 1 protected; r must be in [1, 4]",
        ),
        (
            lambda: launch.mctf_match(torch.zeros(2, 10, 8), torch.ones(1, 10), torch.ones(2, 10, 1), 2, 1, 1.0, 20.0, 40.0, True),
            "disagree on batch",
        ),
        (
            lambda: launch.mctf_match(
                torch.zeros(2, 10, 8), torch.ones(2, 10), torch.ones(2, 10, 1, dtype=torch.float64), 2, 1, 1.0, 0.0, 0.0, False
            ),
            "float64 is not supported",
        ),
        (lambda: launch.topk_select(torch.rand(1, 4097), 8, 1), "supports up to 4096 tokens; got 4097"),
    ],
    ids=["keep", "scores-rank", "crucial-batch", "size-tokens", "r", "mctf-batch", "dtype", "tokens"],
)
def test_selection_kernels_bad_input_fails_before_launch(call, message):
    with pytest.raises(DeploytkError, match=message.replace("[", r"\[").replace("]", r"\]")):
        call()


def test_selection_kernels_need_cuda_tensors_outside_the_interpreter(monkeypatch):
    monkeypatch.setattr(kernel_common, "interpreting", lambda: False)
    with pytest.raises(DeploytkError, match="CUDA tensors"):
        launch.crucial_match(torch.zeros(2, 10, 8), torch.rand(2, 10), 3, 1)
