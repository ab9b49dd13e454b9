"""ProportionalAttention -> standard opset-23 Attention (TensorRT's native fused attention path)."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import deploytk.ops  # noqa: F401  (registers torch.ops.deploytk.*)
from deploytk.errors import DeploytkError
from deploytk.exporter.native_attention import count_native_attention, use_native_attention
from deploytk.ops import OPS, PLUGIN_ATTRIBUTES

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "export_configs" / "digits_vit_tome_r4.yaml"


def cpu_session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def count_prop_attn(model: onnx.ModelProto) -> int:
    return sum(n.domain == "deploytk" and n.op_type == "ProportionalAttention" for n in model.graph.node)


@pytest.fixture(scope="module")
def digits_export(tmp_path_factory):
    from deploytk.config import load_config
    from deploytk.exporter.onnx_export import export_model
    from deploytk.exporter.pipeline import img_size_of
    from deploytk.models import build_reference

    model = build_reference(load_config(CONFIG))
    path = tmp_path_factory.mktemp("native") / "model.onnx"
    return export_model(model, model.family.input_kind, 2, 18, path), img_size_of(model)


def test_exported_model_rewritten_equals_plugin_graph(digits_export):
    proto, img = digits_export
    before = proto.SerializeToString()
    native = use_native_attention(proto)
    assert proto.SerializeToString() == before  # input untouched

    n_prop = count_prop_attn(proto)
    assert n_prop == 12
    assert count_prop_attn(native) == 0
    assert count_native_attention(native) == n_prop
    assert all(a.op_type != "Attention" for a in proto.graph.node)
    assert {o.domain: o.version for o in native.opset_import}[""] == 23
    assert all(f.name != "ProportionalAttention" for f in native.functions)
    assert {f.name for f in native.functions} == {"ToMeMatch", "TokenAggregate"}
    names = [n.name for n in native.graph.node]
    assert len(names) == len(set(names))
    assert [o.name for o in native.graph.output] == ["logits"]
    onnx.checker.check_model(native, full_check=True)

    want_sess, got_sess = cpu_session(proto), cpu_session(native)
    rng = np.random.default_rng(7)
    for batch in (1, 3):
        x = rng.standard_normal((batch, 3, *img)).astype(np.float32)
        want = want_sess.run(None, {"input": x})[0]
        got = got_sess.run(None, {"input": x})[0]
        assert got.shape == (batch, 10)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)


def single_node_model(elem_type=TensorProto.FLOAT, scale=0.25, n_heads=3, d=16) -> onnx.ModelProto:
    fn = OPS["ProportionalAttention"].onnx_function.to_function_proto()
    node = helper.make_node(
        "ProportionalAttention", ["q", "k", "v", "size"], ["out"], name="attn", domain="deploytk", scale=scale, **PLUGIN_ATTRIBUTES
    )
    qkv = [helper.make_tensor_value_info(x, elem_type, ["batch", n_heads, "n", d]) for x in "qkv"]
    graph = helper.make_graph(
        [node],
        "g",
        [*qkv, helper.make_tensor_value_info("size", elem_type, ["batch", "n", 1])],
        [helper.make_tensor_value_info("out", elem_type, ["batch", n_heads, "n", d])],
    )
    model = helper.make_model(graph, functions=[fn], opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("deploytk", 1)])
    model.ir_version = 10
    return model


def random_inputs(batch, heads, n, d, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, n, d, generator=g) for _ in range(3))
    size = torch.randint(1, 6, (batch, n, 1), generator=g).float()
    assert (size > 1).any()
    return q, k, v, size


@pytest.mark.parametrize("batch,n", [(1, 17), (3, 50)])
def test_single_node_equals_torch_op_with_sizes(batch, n):
    heads, d, scale = 3, 16, 16**-0.5
    native = use_native_attention(single_node_model(scale=scale, n_heads=heads, d=d))
    onnx.checker.check_model(native, full_check=True)
    assert [n.op_type for n in native.graph.node].count("Attention") == 1
    assert not native.functions and all(o.domain != "deploytk" for o in native.opset_import)
    q, k, v, size = random_inputs(batch, heads, n, d, seed=n)
    got = cpu_session(native).run(None, {"q": q.numpy(), "k": k.numpy(), "v": v.numpy(), "size": size.numpy()})[0]
    want = torch.ops.deploytk.proportional_attention(q, k, v, size, scale).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    # log(size) really enters: unit sizes give a different result
    plain = torch.ops.deploytk.proportional_attention(q, k, v, torch.ones_like(size), scale).numpy()
    assert np.abs(plain - want).max() > 1e-2


def test_single_node_fp16_graph_uses_castlike():
    heads, d, scale = 3, 16, 0.25
    native = use_native_attention(single_node_model(TensorProto.FLOAT16, scale=scale, n_heads=heads, d=d))
    onnx.checker.check_model(native, full_check=True)
    ops = [n.op_type for n in native.graph.node]
    assert ops.count("CastLike") == 2 and ops.count("Attention") == 1
    q, k, v, size = random_inputs(2, heads, 20, d, seed=5)
    feeds = {"q": q, "k": k, "v": v, "size": size}
    got = cpu_session(native).run(None, {name: t.half().numpy() for name, t in feeds.items()})[0]
    assert got.dtype == np.float16
    want = torch.ops.deploytk.proportional_attention(*(t.half().float() for t in (q, k, v, size)), scale).numpy()
    np.testing.assert_allclose(got.astype(np.float32), want, atol=1e-2, rtol=1e-2)


def test_model_without_proportional_attention_is_refused():
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(DeploytkError, match="no deploytk.ProportionalAttention node to replace") as err:
        use_native_attention(model)
    assert "prop_attn" in str(err.value)
