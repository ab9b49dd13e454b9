"""``onnx_io._copy_field``: the field-by-field copy behind ``without_large_weights`` (OpenVINO's inlining, shape
inference past 2 GiB). Protobuf 7 removed ``FieldDescriptor.label`` (``pip install ".[openvino]"`` alone resolves it);
protobuf before 6.31 has no ``is_repeated``. The copy is held to protobuf's own message equality, and to ONNX's schema
(which fields are repeated) under descriptors that offer only one of the two APIs."""

import onnx
import pytest
from onnx import TensorProto, helper

from deploytk.exporter import onnx_io


def _model() -> onnx.ModelProto:
    """A model that sets every kind of field ``without_large_weights`` copies: scalars, strings, single messages,
    repeated messages (opset_import, metadata_props, node, input) and repeated scalars (a tensor's dims)."""
    weight = helper.make_tensor("w", TensorProto.FLOAT, [2, 3], [float(i) for i in range(6)])
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])],
        [weight],
        doc_string="a graph",
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("deploytk", 1)])
    model.producer_name, model.doc_string = "test", "a model"
    helper.set_model_props(model, {"a": "1", "b": "2"})
    return model


def _copy(message, field_type=None):
    """A fresh message of ``message``'s type with every set field copied by ``_copy_field`` (``field_type`` wraps each
    descriptor)."""
    out = type(message)()
    for field, value in message.ListFields():
        onnx_io._copy_field(out, field if field_type is None else field_type(field), value)
    return out


@pytest.mark.parametrize("part", ["model", "graph", "initializer"])
def test_copy_field_reproduces_every_set_field_under_the_installed_protobuf(part):
    model = _model()
    message = {"model": model, "graph": model.graph, "initializer": model.graph.initializer[0]}[part]
    copy = _copy(message)
    assert copy == message
    assert copy.SerializeToString(deterministic=True) == message.SerializeToString(deterministic=True)


# ONNX's schema (onnx.proto), written out: which fields the test model sets are repeated, an answer independent of protobuf
REPEATED = {"opset_import": True, "metadata_props": True, "ir_version": False, "producer_name": False, "doc_string": False, "graph": False}
REPEATED_GRAPH = {"node": True, "initializer": True, "input": True, "output": True, "name": False, "doc_string": False}


class _Protobuf7Field:
    """A descriptor as protobuf 7's upb has it: ``is_repeated``, no ``label``."""

    def __init__(self, field):
        self.name, self.type, self.TYPE_MESSAGE, self.is_repeated = field.name, field.type, field.TYPE_MESSAGE, _repeated(field)


class _OldProtobufField:
    """A descriptor as protobuf before 6.31 has it: ``label``, no ``is_repeated``."""

    LABEL_OPTIONAL, LABEL_REPEATED = 1, 3

    def __init__(self, field):
        self.name, self.type, self.TYPE_MESSAGE = field.name, field.type, field.TYPE_MESSAGE
        self.label = self.LABEL_REPEATED if _repeated(field) else self.LABEL_OPTIONAL


def _repeated(field) -> bool:
    return (REPEATED if field.containing_type.name == "ModelProto" else REPEATED_GRAPH)[field.name]


@pytest.mark.parametrize("field_type", [_Protobuf7Field, _OldProtobufField], ids=["protobuf7", "protobuf-before-6.31"])
def test_copy_field_works_with_either_protobuf_descriptor_api(field_type):
    model = _model()
    assert not hasattr(
        field_type(model.DESCRIPTOR.fields_by_name["opset_import"]), "label" if field_type is _Protobuf7Field else "is_repeated"
    )
    assert {f.name for f, _ in model.ListFields()} == set(REPEATED)  # the schema above covers every field set
    assert {f.name for f, _ in model.graph.ListFields()} == set(REPEATED_GRAPH)
    assert _copy(model, field_type) == model
    assert _copy(model.graph, field_type) == model.graph
    for message, schema in ((model, REPEATED), (model.graph, REPEATED_GRAPH)):  # the helper answers as the schema does
        for name, repeated in schema.items():
            descriptor = message.DESCRIPTOR.fields_by_name[name]
            assert onnx_io._is_repeated(field_type(descriptor)) is repeated
            assert onnx_io._is_repeated(descriptor) is repeated  # and so does the installed protobuf's own descriptor


def test_without_large_weights_keeps_the_graph_and_drops_only_large_data():
    model = _model()
    skeleton = onnx_io.without_large_weights(model, keep_bytes=0)
    stub = skeleton.graph.initializer[0]
    assert (stub.name, stub.data_type, list(stub.dims), stub.float_data[:], stub.raw_data) == ("w", TensorProto.FLOAT, [2, 3], [], b"")
    assert skeleton.opset_import == model.opset_import and skeleton.metadata_props == model.metadata_props
    assert skeleton.graph.node == model.graph.node and skeleton.graph.input == model.graph.input
    assert onnx_io.without_large_weights(model) == model  # under keep_bytes every tensor stays whole
