"""Each deploytk op's ONNX function body (run by ONNX Runtime) against its torch op."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import deploytk.ops  # noqa: F401
from deploytk.errors import DeploytkError
from deploytk.ops import OPS, PLUGIN_ATTRIBUTES


def run_single_node(op_name: str, inputs: dict[str, np.ndarray], n_out: int, **attrs) -> list[np.ndarray]:
    """A one-node model calling the op's local function, as the exporter writes it."""
    fn = OPS[op_name].onnx_function.to_function_proto()
    rank = next(iter(inputs.values())).ndim
    node = helper.make_node(op_name, list(inputs), [f"out{i}" for i in range(n_out)], domain="deploytk", **attrs, **PLUGIN_ATTRIBUTES)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, ["batch", *v.shape[1:]]) for k, v in inputs.items()],
        [helper.make_tensor_value_info(f"out{i}", TensorProto.FLOAT, [None] * rank) for i in range(n_out)],
    )
    model = helper.make_model(graph, functions=[fn], opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("deploytk", 1)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


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
