"""The table of deploytk custom ops: torch op <-> ONNX function (<-> GPU kernel, later).

Importing this package registers the torch ops (``torch.ops.deploytk.*``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from onnxscript import OnnxFunction

from deploytk.ops._onnx_common import DOMAIN, DOMAIN_VERSION, PLUGIN_ATTRIBUTES
from deploytk.ops.attention_select import (
    CrucialMatch,
    TopKSelect,
    crucial_match,
    topk_select,
    translate_crucial_match,
    translate_topk_select,
)
from deploytk.ops.mctf_match import MctfMatch, mctf_match, translate_mctf_match
from deploytk.ops.proportional_attention import ProportionalAttention, proportional_attention
from deploytk.ops.size_split_match import SizeSplitMatch, size_split_match, translate_size_split_match
from deploytk.ops.token_aggregate import TokenAggregate, token_aggregate, translate_token_aggregate
from deploytk.ops.tome_match import ToMeMatch, tome_match, translate_tome_match


@dataclass(frozen=True)
class CustomOp:
    """One deploytk op: its torch op (reference + what the exporter traces) and ONNX function."""

    onnx_name: str
    torch_name: str
    torch_op: object
    onnx_function: OnnxFunction
    #: what torch.onnx calls for the torch op (the function itself unless attributes need deriving)
    translation: object = None
    #: a matching/selection op: a discrete choice whose output ``dest`` feeds TokenAggregate
    matching: bool = False

    @property
    def overload(self):
        """The ``torch.ops.deploytk.<name>.default`` overload that export graphs contain."""
        return getattr(torch.ops.deploytk, self.torch_name).default


OPS: dict[str, CustomOp] = {
    "ToMeMatch": CustomOp("ToMeMatch", "tome_match", tome_match, ToMeMatch, translate_tome_match, matching=True),
    "ProportionalAttention": CustomOp("ProportionalAttention", "proportional_attention", proportional_attention, ProportionalAttention),
    "TokenAggregate": CustomOp("TokenAggregate", "token_aggregate", token_aggregate, TokenAggregate, translate_token_aggregate),
    "MctfMatch": CustomOp("MctfMatch", "mctf_match", mctf_match, MctfMatch, translate_mctf_match, matching=True),
    "SizeSplitMatch": CustomOp(
        "SizeSplitMatch", "size_split_match", size_split_match, SizeSplitMatch, translate_size_split_match, matching=True
    ),
    "TopKSelect": CustomOp("TopKSelect", "topk_select", topk_select, TopKSelect, translate_topk_select, matching=True),
    "CrucialMatch": CustomOp("CrucialMatch", "crucial_match", crucial_match, CrucialMatch, translate_crucial_match, matching=True),
}


MATCHING_OPS = frozenset(name for name, op in OPS.items() if op.matching)


def custom_translation_table() -> dict:
    """Map each torch custom op overload to its ONNX function for ``torch.onnx.export``."""
    return {o.overload: o.translation or o.onnx_function for o in OPS.values()}


def _register_gpu_kernels() -> None:
    from deploytk.kernels.launch import register_cuda_kernels

    register_cuda_kernels()  # the Triton kernels become the CUDA implementation (imported lazily on first CUDA call)


_register_gpu_kernels()

__all__ = ["OPS", "MATCHING_OPS", "CustomOp", "DOMAIN", "DOMAIN_VERSION", "PLUGIN_ATTRIBUTES", "custom_translation_table"]
