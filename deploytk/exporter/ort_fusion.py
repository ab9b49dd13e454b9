"""ONNX Runtime's fused copy of an export (``model.ort.onnx``): the same numbers in fewer, larger CPU kernels.

ONNX Runtime inlines the deploytk functions of model.onnx and runs their bodies as plain MatMul / Softmax / Add chains;
its session optimizer fuses some of what follows (LayerNormalization, a scaled MatMul) but not the rest. This copy is
made for it ahead of time:

1. each ``deploytk.ProportionalAttention`` becomes the standard ``Attention`` op of opset 23 with the log(size) bias as
   its additive mask (``native_attention.use_native_attention``; the mask expanded to [B, 1, N, N], which ONNX Runtime's
   CPU kernel requires). Its flash path (contrib ``MultiHeadAttention``) takes no bias, so it is not used; the benchmark
   ``benchmarks/ort_fusion.py`` measures what that costs;
2. the remaining deploytk functions are inlined (the optimizer below does not look inside functions);
3. onnxruntime's transformers optimizer (``onnxruntime.transformers.optimizer``) fuses the residual add + LayerNorm
   (SkipLayerNormalization), the MLP's bias + GELU (BiasGelu) and the rest of its list, with its own attention fusion
   off: its ViT pattern wants separate Q, K and V projections, and attention is already one op after step 1.

The dense baseline that `profile` compares with gets the same steps (``deploytk.exporter.baseline``), so a speedup is
never measured against a handicapped baseline. The copy holds ONNX Runtime's contrib ops (``com.microsoft``): it is
for ONNX Runtime only; model.onnx stays the file for TensorRT and every other runtime.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import onnx

from deploytk.errors import DeploytkError
from deploytk.exporter.inline import inline_deploytk_functions
from deploytk.exporter.native_attention import OP_NAME, use_native_attention
from deploytk.exporter.onnx_io import save_onnx
from deploytk.ops import DOMAIN

#: the precisions ONNX Runtime's CPU provider has kernels for (bf16 is emulated there, never timed)
FUSABLE_PRECISIONS = ("fp32", "fp16")
#: ONNX Runtime's own ops (SkipLayerNormalization, BiasGelu, ...)
CONTRIB_DOMAIN = "com.microsoft"


def fuse_for_ort(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    """The fused copy of ``proto`` and what was fused (op type -> count; ``Attention`` counts the rewritten nodes)."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    attention = sum(n.domain == DOMAIN and n.op_type == OP_NAME for n in proto.graph.node)
    graph = use_native_attention(proto, expand_mask=True) if attention else proto
    graph = inline_deploytk_functions(graph)
    options = FusionOptions("vit")
    options.enable_attention = False  # attention is one op already (step 1); its ViT pattern needs separate Q/K/V MatMuls
    options.enable_shape_inference = False  # its symbolic shape inference stops at the inlined bodies' data-dependent shapes
    logging.disable(logging.WARNING)  # its modules log under their bare names ("onnx_model", ...): hush them all meanwhile
    try:
        with tempfile.TemporaryDirectory() as tmp:  # the optimizer reads a file (external data past protobuf's limit)
            path = Path(tmp) / "model.onnx"
            save_onnx(graph, path, check=False)
            optimized = optimize_model(str(path), model_type="vit", opt_level=0, optimization_options=options, only_onnxruntime=False)
            optimized.model.graph.name = proto.graph.name
            fused = {op: int(n) for op, n in optimized.get_fused_operator_statistics().items() if n}
            model = onnx.ModelProto()
            model.CopyFrom(optimized.model)  # its weights loaded from tmp, which goes away
            del model.graph.value_info[:]  # shapes recorded before its fusions, some stale after them (multi-scale ViT)
            if not any(o.domain == CONTRIB_DOMAIN for o in model.opset_import):  # its save_model_to_file adds it; we save ourselves
                model.opset_import.append(onnx.helper.make_opsetid(CONTRIB_DOMAIN, 1))
    except (ValueError, RuntimeError, onnx.checker.ValidationError) as error:
        raise DeploytkError(
            f"ONNX Runtime's transformers optimizer failed on the graph: {error}",
            hint="Export with `fmt='onnx'` (model.onnx runs on ONNX Runtime as it is) and report the model and method.",
        ) from error
    finally:
        logging.disable(logging.NOTSET)
    return model, ({"Attention": attention} if attention else {}) | fused
