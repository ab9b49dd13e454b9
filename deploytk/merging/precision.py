"""Run the reference in fp16/bf16 with the accuracy-critical parts kept in fp32.

TensorRT >= 11 networks are strongly typed: every tensor's type is the one in the ONNX, so
the mixed-precision decisions are made here, in the PyTorch model the exporter traces, and
nowhere else. Low precision: weights, activations, the big matmuls. fp32: normalization
(LayerNorm/RMSNorm statistics and affine), attention softmax, token sizes and the merge's
weighted sums (inside the deploytk ops), the matching scores, the average pool and the
graph's input and output (users feed and read fp32 in every precision).
"""

from __future__ import annotations

import torch
from torch import nn

from deploytk.errors import DeploytkError

#: export.precision -> the dtype of weights and activations
PRECISION_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class Fp32Module(nn.Module):
    """A module computed in fp32 (weights too) on a low-precision stream.

    Used for normalization layers (fp16 LayerNorm statistics lose digits over a ViT's
    width; TensorRT fuses the two casts into the normalization kernel) and, in bf16, for
    the patch-embedding Conv: ONNX Conv has no bfloat16 before opset 22.
    """

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module.float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x.float()).to(x.dtype)


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, (nn.LayerNorm, nn.GroupNorm)) or type(module).__name__.endswith(("LayerNorm", "RmsNorm"))


def to_precision(model: nn.Module, precision: str) -> nn.Module:
    """Cast a MergedViT in place to ``precision`` (fp32: unchanged) and return it.

    Norm layers (and in bf16 the patch-embedding Conv) are wrapped in :class:`Fp32Module`; the model's ``compute_dtype`` makes its
    forward cast the input down and the logits back up to fp32.
    """
    if precision not in PRECISION_DTYPES:
        raise DeploytkError(f"precision {precision!r} is not supported; allowed: {', '.join(PRECISION_DTYPES)}.")
    dtype = PRECISION_DTYPES[precision]
    if dtype == torch.float32:
        return model
    keep = [name for name, m in model.vit.named_modules() if name and _is_norm(m)]
    if dtype == torch.bfloat16:
        embedding = model.family.patch_embedding_path()
        keep += [name for name, m in model.vit.get_submodule(embedding).named_modules(prefix=embedding) if isinstance(m, nn.Conv2d)]
    model.vit.to(dtype)
    for name in keep:
        parent_name, _, attr = name.rpartition(".")
        parent = model.vit.get_submodule(parent_name) if parent_name else model.vit
        setattr(parent, attr, Fp32Module(getattr(parent, attr)))
    model.compute_dtype = dtype
    return model
