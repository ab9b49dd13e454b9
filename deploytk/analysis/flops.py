"""GFLOPs as fvcore's FlopCountAnalysis counts them (the ToMe/MCTF papers' convention).

One multiply-add = one FLOP for matmul/linear/conv, fvcore's own handlers for the norms,
softmax/activations/elementwise ignored. fvcore does not know deploytk's custom ops or
PyTorch's fused attention, so handlers for them count their two matmuls (Q K^T and A V)
and the merge's matching matmul, exactly as fvcore counts the unfused ops. A block's GFLOPs are its
own modules', the attention and matching ops the framework calls for it (inside its ``BlockScope``)
and a learned reducer's layers (DynamicViT's predictor, PatchMerger's queries, ...) that reduce there.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from dataclasses import dataclass

import torch

from deploytk.merging.merged_vit import MergedViT
from deploytk.ops import OPS
from deploytk.ops.proportional_attention import attention_flops

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)  # fvcore.nn scripts a loss with torch.jit at import (deprecated in torch 2.x)
    from fvcore.nn import FlopCountAnalysis


def _handles() -> dict:
    """fvcore handles: every deploytk op's own rule, and PyTorch's fused attention counted as its two matmuls."""
    return {f"deploytk::{spec.torch_name}": spec.flops for spec in OPS.values()} | {"aten::scaled_dot_product_attention": attention_flops}


@dataclass
class FlopReport:
    total_gflops: float
    per_block_gflops: list[float]
    other_gflops: float  # patch embedding, head, final norm (and a family's stem beyond its blocks)
    #: the family's own parts outside the blocks (``ModelFamily.flop_parts``: a multi-scale fusion's LKA, PEG, ...)
    parts_gflops: dict[str, float]


def count_flops(model: MergedViT) -> FlopReport:
    """FLOPs for one sample (an image, a clip, a spectrogram), per block and in total."""
    x = torch.zeros(1, *model.family.input_kind.shape)
    analysis = FlopCountAnalysis(model.eval(), x).set_op_handle(**_handles())
    analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
    logging.getLogger("fvcore").setLevel(logging.ERROR)
    model.scoped_blocks = True  # each block's framework ops under its BlockScope
    try:
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
            total = analysis.total()
            by_module = analysis.by_module()
    finally:
        model.scoped_blocks = False
    # fvcore files an op under the innermost module running it: a block's own modules under vit.<block_path>, the attention
    # and matching ops the framework calls under the block's BlockScope, a learned reducer's layers under reduction.<name>
    blocks = [
        (by_module.get(f"vit.{model.family.block_path(i)}", 0) + by_module.get(f"block_scopes.{i}", 0)) / 1e9
        for i in range(model.family.depth)
    ]
    for name, i in model.reduction.flop_blocks().items():  # a learned reducer's layers count in the block they reduce for
        blocks[i] += by_module.get(f"reduction.{name}", 0) / 1e9
    total_g = total / 1e9
    parts = {label: by_module.get(f"vit.{path}", 0) / 1e9 for label, path in model.family.flop_parts().items()}
    return FlopReport(total_g, blocks, total_g - sum(blocks), parts)
