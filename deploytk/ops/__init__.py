"""The deploytk custom ops, one package each (``deploytk/ops/<op>/``), found and listed here.

Importing this package registers every op's torch custom op (``torch.ops.deploytk.*``) and
makes its Triton kernel the op's CUDA implementation (the kernel module, and Triton, load on
the first CUDA call). A new op is a new package with a ``SPEC``; nothing here changes.
"""

from __future__ import annotations

import importlib
import pkgutil

import torch

from deploytk.ops.onnx_common import DOMAIN, DOMAIN_VERSION, PLUGIN_ATTRIBUTES
from deploytk.ops.spec import OpSpec


def _discover() -> dict[str, OpSpec]:
    specs = []
    for info in pkgutil.iter_modules(__path__):
        if info.ispkg:  # one package per op; plain modules here are shared helpers
            specs.append(importlib.import_module(f"{__name__}.{info.name}").SPEC)
    return {spec.name: spec for spec in sorted(specs, key=lambda s: s.name)}


#: ONNX op type -> spec, for every deploytk op
OPS: dict[str, OpSpec] = _discover()


def spec_for(torch_name: str) -> OpSpec:
    """The spec of ``torch.ops.deploytk.<torch_name>`` (what ``MergedViT.match`` and its hooks are called with)."""
    return next(spec for spec in OPS.values() if spec.torch_name == torch_name)


#: the ops that make a discrete choice (``dest``) which the validator diagnoses at near-ties
MATCHING_OPS = frozenset(name for name, spec in OPS.items() if spec.matching)


def custom_translation_table() -> dict:
    """Map each torch custom op overload to its ONNX translation for ``torch.onnx.export``."""
    return {spec.overload: spec.translation for spec in OPS.values()}


def _register_cuda_kernel(spec: OpSpec) -> None:
    def cuda_impl(*args, **kwargs):
        return spec.kernel_module().launch(*args, **kwargs)

    torch.library.register_kernel(f"{DOMAIN}::{spec.torch_name}", "cuda", cuda_impl)


for _spec in OPS.values():
    _register_cuda_kernel(_spec)

__all__ = ["OPS", "spec_for", "MATCHING_OPS", "OpSpec", "DOMAIN", "DOMAIN_VERSION", "PLUGIN_ATTRIBUTES", "custom_translation_table"]
