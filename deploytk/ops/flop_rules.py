"""fvcore FLOP rules shared by several ops (fvcore's convention: one multiply-add = one FLOP).

fvcore does not know the deploytk ops; each spec's ``flops`` counts what fvcore would count
for the unfused ops: the matmuls, nothing for selections, scatters, softmax or elementwise ops.
"""

from __future__ import annotations


def sizes(value) -> list[int]:
    """The static shape of a traced value (a torch._C.Value)."""
    return value.type().sizes()


def no_flops(inputs, outputs) -> int:
    return 0  # index selection and scatter-add: no multiply-adds in fvcore's convention


def alternation_scores_flops(inputs, outputs) -> int:
    """The matching scores A @ B^T of the alternation split: [B, ceil(N/2), D] x [B, D, floor(N/2)]."""
    b, n, d = sizes(inputs[0])
    return b * ((n + 1) // 2) * (n // 2) * d
