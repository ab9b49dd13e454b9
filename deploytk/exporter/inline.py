"""The plugin-ready ONNX with every deploytk node replaced by its function body: standard ops only.

For runtimes that do not take model-local functions of a custom domain (OpenVINO's ONNX reader
stops at ``deploytk.ToMeMatch``); ONNX Runtime runs either file, TensorRT wants the plugin-ready
one. The bodies are the same standard ops ONNX Runtime inlines itself, so both files compute
the same numbers.
"""

from __future__ import annotations

import onnx
from onnx import inliner

from deploytk.errors import DeploytkError
from deploytk.exporter.onnx_export import IR_VERSION
from deploytk.exporter.onnx_io import infer_shapes, restore_weights, without_large_weights
from deploytk.ops import DOMAIN


def inline_deploytk_functions(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` without deploytk nodes, functions or opset import (the graph's outputs keep their names).

    Every inlined node is named ``<Op>/<its name in the body>`` (plus the inliner's call suffix), so
    a runtime's per-node profile still says which deploytk op a node came from.
    """
    named = without_large_weights(proto)  # the inliner serialises the model for ONNX's C++: without its weights, any size
    for function in named.functions:
        if function.domain == DOMAIN:
            for i, node in enumerate(function.node):
                node.name = f"{function.name}/{node.name or f'{node.op_type}_{i}'}"
    out = inliner.inline_local_functions(named, convert_version=False)
    if any(n.domain == DOMAIN for n in out.graph.node) or out.functions:
        raise DeploytkError("internal: inlining left deploytk nodes or functions in the graph.")
    opsets = [o for o in out.opset_import if o.domain != DOMAIN]
    del out.opset_import[:]
    out.opset_import.extend(opsets)
    out.ir_version = IR_VERSION
    restore_weights(out, proto)
    # the bodies are untyped (functions are generic); a Loop's carried values (KMedoidsSelect's rounds) then have no
    # type inside the inlined body, and OpenVINO cannot convert the body's ArgMin/GatherElements: infer them
    return infer_shapes(out)
