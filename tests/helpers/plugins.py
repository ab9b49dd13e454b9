"""What `deploytk build` hands TensorRT, checked without TensorRT."""

from __future__ import annotations


def assert_every_deploytk_node_builds_as_a_plugin(model):
    """Every deploytk node a plugin node, its types among those the plugin declares."""
    import onnx
    from deploytk_plugins.tensorrt_plugins import PLUGIN_OPS, type_combinations
    from onnx import TensorProto

    from deploytk.build.graph import prepare_for_build
    from deploytk.build.options import BuildOptions

    prepared, used = prepare_for_build(model, BuildOptions(), PLUGIN_OPS)
    nodes = [n for n in prepared.graph.node if n.domain == "deploytk"]
    assert used == sorted({n.op_type for n in nodes})
    assert all(any(a.name == "plugin_namespace" for a in n.attribute) for n in nodes)
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    trt_name = {TensorProto.FLOAT: "FP32", TensorProto.FLOAT16: "FP16", TensorProto.BFLOAT16: "BF16", TensorProto.INT64: "INT64"}
    for n in nodes:
        assert ", ".join(trt_name[types[t]] for t in [*n.input, *n.output]) in type_combinations(n.op_type), n.op_type
