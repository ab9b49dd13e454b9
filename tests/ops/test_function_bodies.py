"""Each deploytk op's ONNX function body against its torch op: on ONNX Runtime, and TokenAggregate's on OpenVINO too."""

import numpy as np
import pytest
import torch
from onnx import TensorProto

import deploytk.ops  # noqa: F401
from deploytk.errors import DeploytkError

from helpers.aggregate import aggregate_model, aggregate_runner
from helpers.bodies import body_model, ort_session


def run_single_node(op_name: str, inputs: dict[str, np.ndarray], n_out: int, **attrs) -> list[np.ndarray]:
    """A one-node model calling the op's local function, as the exporter writes it."""
    rank = next(iter(inputs.values())).ndim
    return ort_session(body_model(op_name, inputs, [TensorProto.FLOAT] * n_out, rank, **attrs)).run(None, inputs)


@pytest.mark.parametrize("batch,heads,n,d", [(2, 6, 197, 64), (3, 3, 50, 16)])
def test_proportional_attention_body_equals_torch(batch, heads, n, d):
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(batch, heads, n, d, generator=g) for _ in range(3))
    size = torch.randint(1, 6, (batch, n, 1), generator=g).float()
    want = torch.ops.deploytk.proportional_attention(q, k, v, size, d**-0.5)
    got = run_single_node("ProportionalAttention", {"q": q.numpy(), "k": k.numpy(), "v": v.numpy(), "size": size.numpy()}, 1, scale=d**-0.5)
    np.testing.assert_allclose(got[0], want.numpy(), rtol=1e-5, atol=1e-5)


def test_proportional_attention_counts_a_merged_token_as_size_copies():
    # Independent check: a token of size 3 attends like 3 identical unit tokens.
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 1, 4, 8, generator=g) for _ in range(3))
    size = torch.tensor([[[1.0], [3.0], [1.0], [1.0]]])
    got = torch.ops.deploytk.proportional_attention(q, k, v, size, 0.5)
    k3 = torch.cat([k, k[:, :, 1:2], k[:, :, 1:2]], dim=2)
    v3 = torch.cat([v, v[:, :, 1:2], v[:, :, 1:2]], dim=2)
    want = torch.softmax(q * 0.5 @ k3.transpose(-1, -2), -1) @ v3
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_tome_match_rejects_bad_input_before_compute():
    metric = torch.randn(2, 11, 3)
    with pytest.raises(DeploytkError, match=r"r=6 is not allowed for 11 tokens with 1 protected; r must be in \[1, 5\]"):
        torch.ops.deploytk.tome_match(metric, 6, 1, True)
    with pytest.raises(DeploytkError, match="expects metric \\[B, N, D\\]"):
        torch.ops.deploytk.tome_match(metric[0], 2, 1, True)
    with pytest.raises(DeploytkError, match=r"protected=12 must be in \[0, 11\]"):
        torch.ops.deploytk.tome_match(metric, 2, 12, True)


def test_proportional_attention_rejects_bad_input():
    q = torch.randn(2, 3, 5, 4)
    with pytest.raises(DeploytkError, match="expects size \\[B, N, 1\\] = \\[2, 5, 1\\]"):
        torch.ops.deploytk.proportional_attention(q, q, q, torch.ones(2, 4, 1), 0.5)
    with pytest.raises(DeploytkError, match="q, k \\[B, H, N, D\\]"):
        torch.ops.deploytk.proportional_attention(q[0], q[0], q[0], torch.ones(2, 5, 1), 0.5)


# ---- TokenAggregate: the body against the torch op, on ONNX Runtime and OpenVINO ------------------------------------


def assignment(kind: str, b: int, n: int, t: int, gen: torch.Generator) -> torch.Tensor:
    """dest [b, n] of one kind the matching ops produce (each meets the op's contract, deploytk/ops/token_aggregate)."""
    rows = []
    for _ in range(b):
        perm = torch.randperm(n, generator=gen)
        dest = torch.empty(n, dtype=torch.long)
        dest[perm[:t]] = torch.arange(t)  # every slot one token first
        rest = perm[t:]
        if kind == "merge":  # ToMe, MCTF, ...: the other tokens into random slots, a few dropped
            dest[rest] = torch.randint(0, t + 1, (n - t,), generator=gen)
        elif kind == "drop":  # EViT / top-k: all the others into the drop slot t
            dest[rest] = t
        elif kind == "one_slot":  # one slot receives every other token
            dest[rest] = 3
        elif kind == "empty":  # ATS: some slots left empty, their would-be tokens dropped
            dest[rest] = t
            dest[perm[: t // 4]] = t  # the first quarter of the slots get no token
        rows.append(dest)
    return torch.stack(rows)


AGGREGATE_CASES = [  # (kind, B, N, T, C)
    ("merge", 2, 197, 181, 64),
    ("merge", 1, 1568, 1445, 768),  # VideoMAE-B's first ToMe block (r=123)
    ("merge", 3, 40, 40, 16),  # tokens_out == N: nothing to add
    ("merge", 2, 1, 1, 8),
    ("drop", 2, 197, 60, 32),
    ("one_slot", 2, 197, 90, 32),
    ("empty", 2, 60, 30, 16),
]


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize("runtime", ["ort", "openvino"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("kind,b,n,t,c", AGGREGATE_CASES, ids=[f"{k}-{b}x{n}to{t}x{c}" for k, b, n, t, c in AGGREGATE_CASES])
def test_token_aggregate_body_equals_torch(kind, b, n, t, c, normalize, dtype, runtime):
    gen = torch.Generator().manual_seed(n + t)
    x = torch.randn(b, n, c, generator=gen).to(torch.from_numpy(np.zeros(0, dtype)).dtype)
    weight = torch.randint(1, 6, (b, n, 1), generator=gen).float() * torch.rand(b, n, 1, generator=gen)
    dest = assignment(kind, b, n, t, gen)
    want = torch.ops.deploytk.token_aggregate(x, weight, dest, t, normalize).numpy()
    x_type = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    run = aggregate_runner(runtime, aggregate_model(n, c, t, normalize, x_type))
    got = run({"x": x.numpy(), "weight": weight.numpy(), "dest": dest.numpy()})
    assert got.dtype == dtype and got.shape == (b, t, c)
    if kind == "empty":  # an empty slot: 0, or 0/0 normalised, in both
        empty = (dest[:, :, None] != torch.arange(t)).all(1).numpy()
        assert empty.any() and np.isnan(want[empty]).all() == normalize and np.isnan(got[empty]).all() == normalize
    if dtype == np.float32:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.nanmax(np.abs(want)))
    else:  # the same fp32 sums, each rounded once to fp16: at most one fp16 step apart
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-3, atol=1e-3)
