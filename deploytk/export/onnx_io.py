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
