"""ONNX files of any size: a model whose weights pass protobuf's 2 GiB limit (ViT-H, ViT-g in fp32) keeps them in one
external data file beside it (``model.onnx.data``), as ONNX's external-data format defines it.

Everything that writes an ONNX file (``save_onnx``) or hands a graph to a runtime (``runnable``) goes through here, so a
large model is written, checked and read the same way as a small one.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx

from deploytk.files import default_mode

#: weights above this many bytes go to an external data file: protobuf cannot serialise a message of 2 GiB or more, and the
#: graph itself adds a little to the weights (module-level so that a test can lower it for a small model)
EXTERNAL_DATA_BYTES = 1 << 30


def weight_bytes(proto: onnx.ModelProto) -> int:
    """Bytes of the graph's initializers (the weights)."""
    return sum(t.ByteSize() for t in proto.graph.initializer)


def data_file_name(model_file: str) -> str:
    """The external data file of ``model_file``: ``model.onnx`` -> ``model.onnx.data``."""
    return f"{model_file}.data"


def save_onnx(proto: onnx.ModelProto, path: Path, name: str | None = None, check: bool = True) -> str | None:
    """Write ``proto`` to ``path`` and check it with ``onnx.checker`` (by path, which is what reads external data).

    Weights above ``EXTERNAL_DATA_BYTES`` go to one external file named after ``name`` (the file's final name, when
    ``path`` is a temporary one), written beside ``path``; returns that file's name, or None when everything fits in
    ``path``. ``proto`` itself is left as it was (its weights stay in memory). ``check=False``: a
    runtime's working copy (a graph with probe outputs, say), which the runtime checks itself.
    """
    path = Path(path)
    if weight_bytes(proto) <= EXTERNAL_DATA_BYTES:
        onnx.save_model(proto, str(path))
        return None
    data = data_file_name(name or path.name)
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    onnx.save_model(copy, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data, size_threshold=1024)
    default_mode(path.parent / data, 0o666)  # onnx creates it owner-only; it is as much the user's output as the model
    if check:
        onnx.checker.check_model(str(path), full_check=True)
    return data


def infer_shapes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``onnx.shape_inference.infer_shapes`` for a model of any size. Past the limit (where protobuf cannot serialise the
    model for ONNX's C++ inference) it infers on the graph without its large weights, whose shapes and types are all
    inference reads of them, and writes the inferred ``value_info`` into ``proto`` itself, which it returns."""
    if weight_bytes(proto) <= EXTERNAL_DATA_BYTES:
        return onnx.shape_inference.infer_shapes(proto)
    inferred = onnx.shape_inference.infer_shapes(without_large_weights(proto))
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(inferred.graph.value_info)
    return proto


def without_large_weights(proto: onnx.ModelProto, keep_bytes: int = 1024) -> onnx.ModelProto:
    """A copy of ``proto`` whose initializers above ``keep_bytes`` keep their name, type and shape but not their data
    (small ones, such as the shapes a Reshape reads, stay whole)."""
    out = onnx.ModelProto()
    for field, value in proto.ListFields():
        if field.name != "graph":
            _copy_field(out, field, value)
    for field, value in proto.graph.ListFields():
        if field.name != "initializer":
            _copy_field(out.graph, field, value)
    for tensor in proto.graph.initializer:
        if tensor.ByteSize() <= keep_bytes:
            out.graph.initializer.add().CopyFrom(tensor)
        else:
            stub = out.graph.initializer.add()
            stub.name, stub.data_type = tensor.name, tensor.data_type
            stub.dims.extend(tensor.dims)
    return out


def restore_weights(skeleton: onnx.ModelProto, proto: onnx.ModelProto) -> onnx.ModelProto:
    """``skeleton`` (made by ``without_large_weights`` and transformed since) with ``proto``'s weights put back by name."""
    weights = {t.name: t for t in proto.graph.initializer}
    for tensor in skeleton.graph.initializer:
        if tensor.name in weights and not tensor.HasField("raw_data") and weights[tensor.name].ByteSize() > tensor.ByteSize():
            tensor.CopyFrom(weights[tensor.name])
    return skeleton


def _copy_field(target, field, value) -> None:
    """Set ``field`` (a descriptor from ``ListFields``) on ``target`` to ``value``: extend a repeated field, copy a message."""
    if _is_repeated(field):
        getattr(target, field.name).extend(value)
    elif field.type == field.TYPE_MESSAGE:
        getattr(target, field.name).CopyFrom(value)
    else:
        setattr(target, field.name, value)


def _is_repeated(field) -> bool:
    """Protobuf 7 removed ``FieldDescriptor.label`` (``is_repeated``, added in 6.31, replaces it); ``onnx>=1.17`` admits
    protobuf from before 6.31 too (onnx 1.23 needs 6.31.1, older releases less), so ask whichever the installed one has."""
    is_repeated = getattr(field, "is_repeated", None)
    if is_repeated is not None:
        return bool(is_repeated)
    return field.label == field.LABEL_REPEATED


@contextlib.contextmanager
def runnable(proto: onnx.ModelProto) -> Iterator[bytes | str]:
    """What a runtime reads ``proto`` from: its bytes, or, past the limit, the path of a temporary copy with external data
    (removed when the block ends: create the session inside it)."""
    if weight_bytes(proto) <= EXTERNAL_DATA_BYTES:
        yield proto.SerializeToString()
        return
    with tempfile.TemporaryDirectory(prefix="deploytk-onnx-") as folder:
        path = Path(folder) / "model.onnx"
        save_onnx(proto, path, check=False)
        yield str(path)
