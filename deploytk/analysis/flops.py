"""GFLOPs as fvcore's FlopCountAnalysis counts them (the ToMe/MCTF papers' convention).

One multiply-add = one FLOP for matmul/linear/conv, fvcore's own handlers for the norms,
softmax/activations/elementwise ignored. fvcore does not know deploytk's custom ops or
PyTorch's fused attention, so handlers for them count their two matmuls (Q K^T and A V)
and the merge's matching matmul, exactly as fvcore counts the unfused ops.
"""

from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass

import torch

from deploytk.merging.patch import MergedViT


def _shape(value) -> list[int]:
    return value.type().sizes()


def _attention_flops(inputs, outputs) -> int:
    # q, k: [B, H, N, D]; v: [B, H, N, Dv] -> Q K^T (B*H*N*N*D) + A V (B*H*N*N*Dv)
    b, h, n, d = _shape(inputs[0])
    dv = _shape(inputs[2])[-1]
    return b * h * n * n * (d + dv)


def _alternation_scores_flops(inputs, outputs) -> int:
    # ToMe and MCTF matching scores A @ B^T on the metric: [B, ceil(N/2), D] x [B, D, floor(N/2)]
    b, n, d = _shape(inputs[0])
    return b * ((n + 1) // 2) * (n // 2) * d


def _size_split_flops(inputs, outputs) -> int:
    # ATM size-split: small half @ large half^T (prefix excluded); protected is the 4th argument
    b, n, d = _shape(inputs[0])
    m = n - int(inputs[3].toIValue())
    return b * ((m + 1) // 2) * (m // 2) * d


def _crucial_flops(inputs, outputs) -> int:
    # token-to-token cosine similarity [B, N, D] @ [B, D, N]
    b, n, d = _shape(inputs[0])
    return b * n * n * d


def _no_flops(inputs, outputs) -> int:
    return 0  # index selection and scatter-add: no multiply-adds in fvcore's convention


_EXTRA_HANDLES = {
    "deploytk::mctf_match": _alternation_scores_flops,
    "deploytk::size_split_match": _size_split_flops,
    "deploytk::crucial_match": _crucial_flops,
    "deploytk::topk_select": _no_flops,
    "deploytk::token_aggregate": _no_flops,
    "deploytk::proportional_attention": _attention_flops,
    "aten::scaled_dot_product_attention": _attention_flops,
    "deploytk::tome_match": _alternation_scores_flops,
}


@dataclass
class FlopReport:
    total_gflops: float
    per_block_gflops: list[float]
    other_gflops: float  # patch embedding, head, final norm


def count_flops(model: MergedViT, img_size: tuple[int, int]) -> FlopReport:
    """FLOPs for one image, per block and in total."""
    from fvcore.nn import FlopCountAnalysis

    x = torch.zeros(1, 3, *img_size)
    analysis = FlopCountAnalysis(model.eval(), x).set_op_handle(**_EXTRA_HANDLES)
    analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
    logging.getLogger("fvcore").setLevel(logging.ERROR)
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        total = analysis.total()
        by_module = analysis.by_module()
    blocks = [by_module.get(f"vit.blocks.{i}", 0) / 1e9 for i in range(len(model.vit.blocks))]
    total_g = total / 1e9
    return FlopReport(total_g, blocks, total_g - sum(blocks))
