"""The table of deploytk custom ops: torch op <-> ONNX function (<-> GPU kernel, later).

Importing this package registers the torch ops (``torch.ops.deploytk.*``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from onnxscript import OnnxFunction

from deploytk.ops._onnx_common import DOMAIN, DOMAIN_VERSION, PLUGIN_ATTRIBUTES
from deploytk.ops.proportional_attention import ProportionalAttention, proportional_attention
from deploytk.ops.token_merge import TokenMerge, token_merge, translate_token_merge


@dataclass(frozen=True)
class CustomOp:
    """One deploytk op: its torch op (reference + what the exporter traces) and ONNX function."""

    onnx_name: str
    torch_name: str
    torch_op: object
    onnx_function: OnnxFunction
    #: what torch.onnx calls for the torch op (the function itself unless attributes need deriving)
    translation: object = None

    @property
    def overload(self):
        """The ``torch.ops.deploytk.<name>.default`` overload that export graphs contain."""
        return getattr(torch.ops.deploytk, self.torch_name).default


OPS: dict[str, CustomOp] = {
    "TokenMerge": CustomOp("TokenMerge", "token_merge", token_merge, TokenMerge, translate_token_merge),
    "ProportionalAttention": CustomOp("ProportionalAttention", "proportional_attention", proportional_attention, ProportionalAttention),
}


def custom_translation_table() -> dict:
    """Map each torch custom op overload to its ONNX function for ``torch.onnx.export``."""
    return {o.overload: o.translation or o.onnx_function for o in OPS.values()}


__all__ = ["OPS", "CustomOp", "DOMAIN", "DOMAIN_VERSION", "PLUGIN_ATTRIBUTES", "custom_translation_table"]
