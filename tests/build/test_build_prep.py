"""Everything of `deploytk build` that needs no TensorRT: options, plugin/native graph prep, engine manifest checks."""

import onnx
import pytest
from onnx import TensorProto, helper

from deploytk.backends.engine_manifest import check_engine, engine_manifest
from deploytk.build.graph import check_tensorrt_supports, prepare_for_build
from deploytk.build.options import BuildOptions, build_options, parse_batch
from deploytk.errors import DeploytkError
from deploytk.ops import OPS, PLUGIN_ATTRIBUTES


def test_batch_profile_parsing():
    assert parse_batch("1,8,64") == (1, 8, 64)
    assert parse_batch("16") == (16, 16, 16)
    with pytest.raises(DeploytkError, match="has 2 values; use min,opt,max"):
        parse_batch("1,8")
    with pytest.raises(DeploytkError, match="not a list of integers"):
        parse_batch("1,eight,64")
    with pytest.raises(DeploytkError, match="`batch_sizes=8,1,64`: min,opt,max must satisfy 1 <= min <= opt <= max"):
        build_options("8,1,64")
    with pytest.raises(DeploytkError, match="merge_impl"):
        build_options("1,8,64", merge_impl="fast")
    with pytest.raises(DeploytkError, match=r"`opt_level=7`: must be 0..5"):
        build_options("1", opt_level=7)


def _tome_like_model(f=TensorProto.FLOAT) -> onnx.ModelProto:
    """metric -> ToMeMatch -> dest; x, size, dest -> TokenAggregate; q,k,v,size -> ProportionalAttention (functions attached).

    ``f``: the token tensors' type (size and the matching metric stay fp32, as in exported fp16/bf16 graphs)."""
    nodes = [
        helper.make_node(
            "ToMeMatch", ["metric"], ["dest"], domain="deploytk", r=2, protected=1, sort_unmerged=1, tokens=9, **PLUGIN_ATTRIBUTES
        ),
        helper.make_node("TokenAggregate", ["x", "size", "dest"], ["y"], domain="deploytk", tokens_out=7, normalize=1, **PLUGIN_ATTRIBUTES),
        helper.make_node("ProportionalAttention", ["q", "k", "v", "size"], ["o"], domain="deploytk", scale=0.25, **PLUGIN_ATTRIBUTES),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("metric", TensorProto.FLOAT, ["b", 9, 4]),
            helper.make_tensor_value_info("x", f, ["b", 9, 8]),
            helper.make_tensor_value_info("size", TensorProto.FLOAT, ["b", 9, 1]),
        ]
        + [helper.make_tensor_value_info(n, f, ["b", 2, 9, 4]) for n in "qkv"],
        [helper.make_tensor_value_info("y", f, ["b", 7, 8]), helper.make_tensor_value_info("o", f, ["b", 2, 9, 4])],
    )
    functions = [OPS[n].onnx_function.to_function_proto() for n in ("ToMeMatch", "TokenAggregate", "ProportionalAttention")]
    model = helper.make_model(graph, functions=functions, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("deploytk", 1)])
    model.ir_version = 10
    return model


def _plugin_nodes(model):
    return sorted(n.op_type for n in model.graph.node if any(a.name == "plugin_namespace" for a in n.attribute))


@pytest.mark.parametrize(
    "merge, attention, plugins",
    [
        ("plugin", "plugin", ["ProportionalAttention", "ToMeMatch", "TokenAggregate"]),
        ("native", "plugin", ["ProportionalAttention"]),
        ("plugin", "native", ["ToMeMatch", "TokenAggregate"]),
        ("native", "native", []),
    ],
)
def test_prepare_for_build_switches_each_op(merge, attention, plugins):
    model = _tome_like_model()
    prepared, used = prepare_for_build(
        model, BuildOptions(merge_impl=merge, attention_impl=attention), ("ToMeMatch", "TokenAggregate", "ProportionalAttention")
    )
    assert used == plugins and _plugin_nodes(prepared) == plugins
    assert _plugin_nodes(model) == ["ProportionalAttention", "ToMeMatch", "TokenAggregate"]  # input untouched
    ops = [n.op_type for n in prepared.graph.node]
    assert ("Attention" in ops) == (attention == "native") and ("ProportionalAttention" in ops) == (attention == "plugin")
    onnx.checker.check_model(prepared, full_check=True)


def test_native_attention_for_tensorrt_leaves_softmax_precision_off():
    """TensorRT's parser refuses Attention nodes that set softmax_precision (onnx-tensorrt's op checker)."""
    from deploytk.exporter.native_attention import use_native_attention

    model = _tome_like_model(TensorProto.FLOAT16)
    prepared, _ = prepare_for_build(model, BuildOptions(attention_impl="native"), ("ToMeMatch", "TokenAggregate"))
    (attention,) = [n for n in prepared.graph.node if n.op_type == "Attention"]
    assert [a.name for a in attention.attribute] == ["scale"]
    onnx.checker.check_model(prepared, full_check=True)
    # for ONNX Runtime the fp16 graph keeps asking for an fp32 softmax
    (ort_attention,) = [n for n in use_native_attention(model).graph.node if n.op_type == "Attention"]
    assert {a.name: helper.get_attribute_value(a) for a in ort_attention.attribute} == {
        "scale": 1.0,
        "softmax_precision": TensorProto.FLOAT,
    }


@pytest.mark.parametrize(
    "version, attention, refused",
    [
        ("10.13.3.9", "native", True),
        ("10.9.0.34", "native", True),
        ("10.14.1.48", "native", False),
        ("11.1.0", "native", False),
        ("10.9.0.34", "plugin", False),
    ],
)
def test_native_attention_needs_tensorrt_10_14(version, attention, refused):
    options = BuildOptions(attention_impl=attention)
    if not refused:
        check_tensorrt_supports(_tome_like_model(), options, version)
        return
    with pytest.raises(DeploytkError, match=rf"`attention_impl=native` needs TensorRT >= 10.14 .*this is TensorRT {version}") as err:
        check_tensorrt_supports(_tome_like_model(), options, version)
    assert "`attention_impl=plugin`" in err.value.hint


def test_a_graph_without_attention_builds_natively_on_any_tensorrt():
    model = _tome_like_model()
    del model.graph.node[2]
    check_tensorrt_supports(model, BuildOptions(attention_impl="native"), "10.9.0")


def test_ops_without_a_plugin_always_go_native():
    _, used = prepare_for_build(_tome_like_model(), BuildOptions(), ("TokenAggregate",))
    assert used == ["TokenAggregate"]


def _manifest(**over):
    base = dict(
        onnx_sha256="a" * 64,
        tensorrt="10.13.0",
        gpu="NVIDIA H200",
        compute_capability="9.0",
        options=BuildOptions().model_dump(mode="json"),
        plugin_ops=["ToMeMatch"],
        build_seconds=12.34,
        created="2026-11-21T00:00:00+00:00",
    )
    return engine_manifest(**(base | over))


def test_engine_manifest_records_the_build():
    m = _manifest()
    assert m["build"] == {
        "batch": [1, 8, 64],
        "merge_impl": "plugin",
        "attention_impl": "plugin",
        "opt_level": 3,
        "timing_cache": None,
        "baseline": True,
    }
    assert m["build_seconds"] == 12.3 and m["format"] == "deploytk-engine/1" and m["baseline"] is None
    check_engine(m, onnx_sha256="a" * 64, tensorrt="10.13.0", compute_capability="9.0", gpu="NVIDIA H200")  # matches: no error


def test_mismatched_engine_is_refused_with_every_reason():
    with pytest.raises(DeploytkError) as err:
        check_engine(_manifest(), onnx_sha256="b" * 64, tensorrt="11.0.0", compute_capability="8.9", gpu="NVIDIA L4")
    text = str(err.value)
    assert "different model.onnx" in text and "TensorRT 10.13.0, this is TensorRT 11.0.0" in text
    assert "built for NVIDIA H200 (compute capability 9.0), this GPU is NVIDIA L4 (8.9)" in text
    assert "deploytk build" in (err.value.hint or "")


def test_batch_sizes_outside_the_engine_profile_are_refused_with_a_rebuild_command():
    from deploytk.backends.trt import check_batch_sizes

    m = _manifest(options=BuildOptions(batch=(2, 8, 32)).model_dump(mode="json"))
    check_batch_sizes(m, [2, 8, 32], "profile `backend=trt`")  # inside: no error
    with pytest.raises(DeploytkError, match=r"batch size\(s\) 1, 64 outside the engine's optimization profile 2\.\.32") as err:
        check_batch_sizes(m, [1, 8, 64], "profile `backend=trt`")
    assert "`batch_sizes=1,8,64`" in err.value.hint
