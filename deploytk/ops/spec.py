"""``OpSpec``: everything deploytk knows about one custom op, in one object.

Each op lives in its own package ``deploytk/ops/<op>/``: ``reference.py`` (eager PyTorch, the
ground truth), ``onnx_function.py`` (the standard-op body every runtime can inline) and
``kernel.py`` (the Triton kernel, its launch plan and its torch launcher), tied together by
the ``SPEC`` in its ``__init__.py``. Every list that the rest of deploytk needs (the exporter's
translation table, the CUDA registrations, the TensorRT plugins and their AOT kernels, the
FLOP handlers, the selftest cases, the validator's matching ops) is derived from the specs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from onnxscript import OnnxFunction

from deploytk.ops.onnx_common import PLUGIN_ATTRIBUTES

#: how an input's element type follows the graph's precision
FLOAT = "float"  # the graph's float type (fp32, fp16 or bf16): activations, matching metrics
FP32 = "fp32"  # always fp32 whatever the precision: token sizes and merge weights
INT64 = "int64"  # assignments (``dest``)


@dataclass(frozen=True)
class Tensor:
    """One input of an op: how its element type follows the precision, and its layout ("B N D"; B is the batch)."""

    kind: str
    layout: str
    #: a Euclidean distance, the square root of a matrix product (``merging.distances``): runtimes agree on its
    #: square to rounding, but sqrt magnifies that rounding near 0 (a self-distance is sqrt(rounding), up to 5e-3)
    #: by orders of magnitude, so near-tie proofs compare it squared
    distance: bool = False

    @property
    def rank(self) -> int:
        return len(self.layout.split())

    @property
    def batched(self) -> bool:
        """Whether the first dimension is the (dynamic) batch; inputs such as ATSSample's steps [S] have none."""
        return self.layout.split()[0] == "B"


def floats(layout: str) -> Tensor:
    return Tensor(FLOAT, layout)


def distances(layout: str) -> Tensor:
    """Pairwise distances (``Tensor.distance``)."""
    return Tensor(FLOAT, layout, distance=True)


def fp32(layout: str) -> Tensor:
    return Tensor(FP32, layout)


def int64(layout: str) -> Tensor:
    return Tensor(INT64, layout)


@dataclass(frozen=True)
class SelftestPlan:
    """How ``deploytk selftest`` checks the op's kernel against its reference.

    ``family`` names the seeded input draw the op shares with others (``ops.selftest.FAMILIES``);
    ``calls`` turns one draw into the op's calls: (positional torch-op arguments, what the report
    shows of them). ``ties`` judges a discrete choice: (reference, args, kernel output) -> the number
    of images that differ only at a near-tie, or None for a wrong result; ``None`` for ops whose
    output is compared numerically within the dtype's tolerance.
    """

    family: str
    calls: Callable[[dict], list[tuple[list, dict]]]
    ties: Callable | None = None


@dataclass(frozen=True)
class OpSpec:
    """One deploytk op: the name shared by ONNX and TensorRT, its three implementations and its rules."""

    #: ONNX op type in the ``deploytk`` domain and TensorRT plugin name
    name: str
    #: the ``torch.library`` custom op: the reference at run time and what ``torch.onnx`` traces
    torch_op: object
    onnx_function: OnnxFunction
    #: what torch.onnx calls for the torch op (derives attributes such as the static ``tokens``)
    translation: Callable
    #: the eager reference (the torch op's CPU implementation, after its argument checks)
    reference: Callable
    #: every input in ONNX order (and torch-op order), and the element-type kind of the output
    inputs: tuple[Tensor, ...]
    output: str
    #: output dims from the input dims and the node's attributes; dims may be symbolic (a TensorRT batch)
    output_shape: Callable[[list[list], dict], list]
    #: fvcore handle: FLOPs of one call from its traced inputs and outputs (fvcore's convention)
    flops: Callable
    #: module of the Triton kernel, imported on first use (Triton is optional)
    kernel: str
    selftest: SelftestPlan
    #: a discrete choice (``dest`` [B, N]) that feeds TokenAggregate; the validator diagnoses its near-ties
    matching: bool = False
    #: an op-specific proof that a different choice is a near-tie, where random input perturbations
    #: cannot show it: (the op's arguments for one image, the other choice) -> bool (ATS's nearest-CDF picks)
    near_tie: Callable | None = None
    #: matching ops: ``dest`` numbers the patch tokens only (its slots count after the protected prefix), not every token
    dest_covers_patches_only: bool = False
    #: matching ops that drop tokens into one slot: that slot, from the op's torch arguments (TopKSelect: protected + keep)
    rest_slot: Callable[[tuple], int] | None = None
    #: matching ops whose ``dest`` may send a token to the drop bucket (the slot past the last output token): an unmerged
    #: output (``patch_features``) then keeps the dropped patches' last features, which the others need not carry
    drops_tokens: bool = False

    @property
    def torch_name(self) -> str:
        """``tome_match`` for ``torch.ops.deploytk.tome_match``."""
        return self.torch_op._qualname.split("::", 1)[1]

    @property
    def overload(self):
        """The ``torch.ops.deploytk.<name>.default`` overload that export graphs contain."""
        return getattr(torch.ops.deploytk, self.torch_name).default

    @property
    def input_names(self) -> list[str]:
        return [p.name for p in self.onnx_function.op_signature.inputs]

    @property
    def attributes(self) -> dict[str, str]:
        """Node attribute name -> ONNX type name (INT, FLOAT), in signature order, without the plugin attributes."""
        return {p.name: p.type.name for p in self.onnx_function.op_signature.attributes if p.name not in PLUGIN_ATTRIBUTES}

    def kernel_module(self):
        """The op's ``kernel.py`` (``plan`` and ``launch``); imports Triton."""
        return importlib.import_module(self.kernel)
