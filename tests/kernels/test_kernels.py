"""The Triton kernels: selftest in Triton's CPU interpreter, bad input, and that selftest can fail."""

import json
import os
import subprocess
import sys

import pytest
import torch

from deploytk.errors import DeploytkError
from deploytk.kernels import launch, selftest


def run_cli(*args, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-c", "from deploytk.cli import main; main()", *args], capture_output=True, text=True, env=env)


def test_interpreter_selftest_passes_for_both_ops():
    """What CI runs: TRITON_INTERPRET=1 deploytk selftest --json (a subprocess: the variable must be set before Triton decorates the kernels)."""
    result = run_cli("selftest", "--json", env_extra={"TRITON_INTERPRET": "1"})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["environment"]["mode"] == "interpreter" and report["passed"]
    cases = report["cases"]
    assert {c["op"] for c in cases} == {"TokenAggregate", "ProportionalAttention"}
    assert {c["dtype"] for c in cases} == {"fp32", "fp16"}  # bf16: GPU only (interpreter's bf16 dot is wrong)
    assert all(set(c) >= {"op", "dtype", "shape", "max_abs_err", "passed"} for c in cases)
    assert len({c["shape"]["B"] for c in cases}) >= 3  # several batch sizes
    for c in cases:  # real agreement, not just "passed"
        assert c["max_abs_err"] <= (1e-5 if c["dtype"] == "fp32" else 5e-3), c


def test_selftest_without_gpu_or_interpreter_says_what_to_do():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: selftest would run natively")
    result = run_cli("selftest", env_extra={"TRITON_INTERPRET": "0"})
    assert result.returncode == 2 and "TRITON_INTERPRET=1 deploytk selftest" in result.stderr


def test_selftest_fails_when_a_kernel_is_wrong(monkeypatch):
    monkeypatch.setattr(launch, "interpreting", lambda: True)  # CPU tensors, interpreter-sized shapes
    ops = torch.ops.deploytk
    monkeypatch.setattr(launch, "token_aggregate", lambda x, w, d, t, n: ops.token_aggregate(x.float(), w, d, t, n) * 1.1)
    monkeypatch.setattr(launch, "proportional_attention", lambda q, k, v, s, sc: ops.proportional_attention(q.float(), k.float(), v.float(), s, sc) + 0.1)
    cases = selftest.run()
    assert cases and not any(c.passed for c in cases)


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
        ((torch.zeros(2, 5, 4, dtype=torch.float64), torch.ones(2, 5, 1), torch.zeros(2, 5, dtype=torch.long), 3, True), "float64 is not supported"),
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
    monkeypatch.setattr(launch, "interpreting", lambda: False)
    with pytest.raises(DeploytkError, match="CUDA tensors"):
        launch.proportional_attention(q, q, q, torch.ones(2, 10, 1), 0.25)
