"""torch.onnx (dynamo) export of the merged reference into deploytk custom ops.

The torch custom ops are translated to calls of the ONNX functions in ``deploytk.ops``;
the exporter adds those as model-local functions, so every deploytk node (ToMeMatch,
TokenAggregate, ProportionalAttention, ...) is backed by a standard-op body (ONNX Runtime inlines it) and
carries ``plugin_namespace``/``plugin_version`` for TensorRT's parser.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxscript.optimizer
import torch
from onnx_ir import serde
from torch import nn
from torch.onnx._internal._lazy_import import onnxscript_apis

from deploytk.errors import DeploytkError
from deploytk.exporter import onnx_io
from deploytk.exporter.onnx_io import save_onnx, weight_bytes
from deploytk.inputs import InputKind
from deploytk.ops import DOMAIN, DOMAIN_VERSION, OPS, PLUGIN_ATTRIBUTES, custom_translation_table

#: ONNX Runtime 1.31 rejects IR > 13 and onnx 1.23 writes 14; IR 10 is what ORT and TensorRT's parser both read.
IR_VERSION = 10
OUTPUT_NAME = "logits"


@contextlib.contextmanager
def _keep_local_functions():
    """Skip torch.onnx's opset conversion when the graph is already at the target opset.

    torch.onnx always runs onnxscript's version converter, which inlines every local
    function first (it only converts inlined models) and so would erase the deploytk
    nodes. The exporter builds the graph at the requested opset (>= 18), so the
    conversion has nothing to do; we skip it only in exactly that case.
    """
    original = onnxscript_apis.convert_version

    def convert_unless_same(model, target_version, *args, **kwargs):
        if model.opset_imports.get("") == target_version:
            return model
        return original(model, target_version, *args, **kwargs)

    onnxscript_apis.convert_version = convert_unless_same
    try:
        yield
    finally:
        onnxscript_apis.convert_version = original


@contextlib.contextmanager
def _quiet():
    """torch.onnx prints progress to stdout; keep stdout clean for the CLI's JSON."""
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()) as out:
        warnings.simplefilter("ignore")
        try:
            yield
        except Exception:
            sys.stderr.write(out.getvalue()[-4000:])
            raise


def export_model(
    model: nn.Module,
    kind: InputKind,
    batch_size: int,
    opset: int,
    path: Path,
    name: str | None = None,
    output_names: list[str] | None = None,
) -> onnx.ModelProto:
    """Export ``model`` (its input as ``kind`` lays it out -> its outputs: ``output_names``, by default the model's own
    or ``logits``) with a symbolic batch dimension.

    The file must hold exactly the deploytk ops the traced model calls (torch.export drops
    dead ones, such as a last size aggregation nothing reads): one custom node per call.
    Weights past protobuf's limit go to an external data file named after ``name`` (``path``'s final name; see onnx_io).
    """
    example = torch.from_numpy(kind.synthetic(batch_size, np.random.default_rng(0)))
    batch = torch.export.Dim("batch", min=1, max=65536)
    with _quiet(), _keep_local_functions(), torch.no_grad():
        program = torch.onnx.export(
            model.eval(),
            (example,),
            dynamo=True,
            input_names=[kind.onnx_name],
            output_names=output_names or getattr(model, "output_names", [OUTPUT_NAME]),
            dynamic_shapes=({0: batch},),
            custom_translation_table=custom_translation_table(),
            opset_version=opset,
            optimize=False,
            verbose=False,
        )
        # The exporter's default optimisation inlines local functions; keep them.
        onnxscript.optimizer.optimize_ir(program.model, inline=False)
        proto = serde.serialize_model(program.model)
    proto = finalize(proto)
    traced = traced_op_counts(program.exported_program.graph)
    if custom_op_counts(proto) != traced:
        raise DeploytkError(f"internal: the ONNX file's custom ops {custom_op_counts(proto)} differ from the traced model's {traced}.")
    save_onnx(proto, path, name)
    return proto


def traced_op_counts(graph) -> dict[str, int]:
    """deploytk op calls in an exported program's graph, by ONNX op name (ops that do not occur are left out)."""
    names = {spec.overload: name for name, spec in OPS.items()}
    counts = Counter(names[n.target] for n in graph.nodes if n.op == "call_function" and n.target in names)
    return {name: counts[name] for name in OPS if counts.get(name)}


def finalize(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Pin the IR version, name the batch axis, stamp plugin attributes, and fully check."""
    proto.ir_version = IR_VERSION
    for value in list(proto.graph.input) + list(proto.graph.output):
        dim = value.type.tensor_type.shape.dim[0]
        dim.ClearField("dim_value")
        dim.dim_param = "batch"
    functions = {(f.domain, f.name) for f in proto.functions}
    if not _custom_nodes(proto) and _uses_custom_ops(proto):
        raise DeploytkError("internal: torch.onnx inlined the deploytk custom ops; this torch version is not supported.")
    for node in _custom_nodes(proto):
        if (node.domain, node.op_type) not in functions:
            raise DeploytkError(f"internal: exported node {node.op_type} has no local function body.")
        present = {a.name for a in node.attribute}
        for key, value in PLUGIN_ATTRIBUTES.items():
            if key not in present:
                node.attribute.append(onnx.helper.make_attribute(key, value))
    if not any(o.domain == DOMAIN for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    if weight_bytes(proto) <= onnx_io.EXTERNAL_DATA_BYTES:  # a larger one is checked by path when saved (save_onnx)
        onnx.checker.check_model(proto, full_check=True)
    return proto


def _uses_custom_ops(proto: onnx.ModelProto) -> bool:
    return any(o.domain == DOMAIN for o in proto.opset_import)


def _custom_nodes(proto: onnx.ModelProto):
    return [n for n in proto.graph.node if n.domain == DOMAIN]


def custom_op_counts(proto: onnx.ModelProto) -> dict[str, int]:
    """Number of nodes of each deploytk op in the main graph (ops that do not occur are left out)."""
    counts = Counter(n.op_type for n in _custom_nodes(proto))
    return {name: counts[name] for name in OPS if counts.get(name)}
