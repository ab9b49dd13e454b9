"""The TensorRT plugin of every deploytk op: one ``PluginDefinition`` each.

A plugin's signature (inputs, attributes and their types), its output shape and type rule,
its type combinations and its launch come from the op's ``SPEC`` (``deploytk/ops/<op>/``) and
kernel plan, so they cannot drift from the ONNX node; what is left to say here per op is the
kernels `deploytk plugins compile` compiles ahead of time at ViT shapes (ViT-S/16 at 224 px:
197 tokens, 384 channels, head dim 64 with its scale 1/8; MCTF's default taus 1/20/40). A
build compiles the shapes and attributes of the graph it builds. Every op needs an entry.
"""

from __future__ import annotations

from dataclasses import dataclass

B, N, C, HEADS, HEAD_DIM = 8, 197, 384, 6, 64


@dataclass(frozen=True)
class Example:
    """Input shapes (ONNX order) and node attributes of one precompiled kernel."""

    shapes: list
    attrs: dict


@dataclass(frozen=True)
class PluginDefinition:
    examples: tuple[Example, ...]


def _match(dims: list, **attrs) -> Example:
    return Example([[B, N, d] if d else [B, N] for d in dims], {"protected": 1, "tokens": N, **attrs})


PLUGINS: dict[str, PluginDefinition] = {
    "TokenAggregate": PluginDefinition(
        tuple(Example([[B, N, C], [B, N, 1], [B, N]], {"tokens_out": N - 16, "normalize": norm}) for norm in (1, 0))
    ),
    "ProportionalAttention": PluginDefinition(
        (Example([[B, HEADS, N, HEAD_DIM]] * 3 + [[B, N, 1]], {"scale": HEAD_DIM**-0.5}),),
    ),
    "ToMeMatch": PluginDefinition(tuple(_match([HEAD_DIM], r=16, sort_unmerged=s) for s in (1, 0))),
    "MctfMatch": PluginDefinition(
        tuple(_match([C, None, 1], r=16, tau_sim=1.0, tau_info=20.0, tau_size=40.0, bidirection=bidirection) for bidirection in (1, 0))
    ),
    "SizeSplitMatch": PluginDefinition((_match([HEAD_DIM, 1], r=16),)),
    # PiToMe's first (all tokens matched) and last (high-energy tokens only) kind of block, at DeiT's margin ends
    "PiToMeMatch": PluginDefinition(tuple(_match([HEAD_DIM], r=16, margin=m, alpha=1.0, protect=p) for p, m in ((0, 0.75), (1, 0.0625)))),
    "TopKSelect": PluginDefinition((_match([None], keep=137),)),
    "CrucialMatch": PluginDefinition((_match([C, None], keep=137),)),
    # VisionZip's LLaVA-1.5 split at 64 of 576 tokens (53 dominant patches + 10 contextual), scaled to 196 patches
    "VisionZipSelect": PluginDefinition((_match([None, HEAD_DIM], dominant=18, contextual=4),)),
    # the clustering ops take the 196 patches' pairwise distances (and K-Medoids' token weights)
    "KMedoidsSelect": PluginDefinition((Example([[B, N - 1, N - 1], [B, N - 1]], {"clusters": 137, "iterations": 3}),)),
    "DPCKNNAssign": PluginDefinition((Example([[B, N - 1, N - 1]], {"clusters": 137, "neighbors": 5}),)),
    # ATS at keep rate 0.7 on the 196 patches: 137 CDF steps
    "ATSSample": PluginDefinition((Example([[B, N - 1], [B, N - 1, 1], [137]], {}),)),
}
