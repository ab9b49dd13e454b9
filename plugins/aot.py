"""Ahead-of-time compilation of the deploytk Triton kernels to PTX (what the AOT plugins embed).

``compile_variant`` is the one place that turns a kernel + dtype + attributes into PTX and
launch metadata; the TensorRT plugins' ``aot_impl`` and ``deploytk plugins compile`` both use
it. Compiling needs Triton's LLVM backend only, no GPU.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from deploytk.errors import DeploytkError

ARCHES = {"sm_80": 80, "sm_86": 86, "sm_89": 89, "sm_90": 90}
#: Dynamic shared memory a kernel may use without opting in (cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE)).
#: Triton's own launcher (the torch path) opts in; TensorRT's launch of an AOT plugin kernel is not
#: documented to, so every plugin kernel is compiled to fit this limit.
SHARED_MEM_LIMIT = 48 * 1024
#: software-pipelining depths tried in order (Triton's default first); fewer stages, less shared memory
NUM_STAGES = (3, 2, 1)
#: Triton pointer types per tensor dtype name (TensorRT: FP32, FP16, BF16)
POINTER = {"fp32": "*fp32", "fp16": "*fp16", "bf16": "*bf16"}


@dataclass
class KernelVariant:
    """One compiled form: which op, dtype and compile-time constants."""

    op: str  # ONNX / plugin op name
    dtype: str  # fp32 | fp16 | bf16 (x / q,k,v and the output)
    constexprs: dict
    signature: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        consts = "_".join(f"{k.lower()}{str(v).replace('.', 'p')}" for k, v in self.constexprs.items() if k != "PRECISION")
        return f"{self.op}_{self.dtype}_{consts}"


def token_aggregate_variant(dtype: str, channels: int, normalize: bool) -> KernelVariant:
    from deploytk.kernels import token_aggregate as k

    sig = {"x_ptr": POINTER[dtype], "w_ptr": "*fp32", "dest_ptr": "*i64", "N": "i32", "C": "i32", "T": "i32", "out_ptr": POINTER[dtype]}
    consts = {"NORMALIZE": bool(normalize), "PRECISION": _precision(dtype), **k.config(channels)}
    return KernelVariant("TokenAggregate", dtype, consts, sig)


def proportional_attention_variant(dtype: str, head_dim: int, scale: float) -> KernelVariant:
    from deploytk.kernels import proportional_attention as pa

    p = POINTER[dtype]
    sig = {"q_ptr": p, "k_ptr": p, "v_ptr": p, "size_ptr": "*fp32", "N": "i32", "H": "i32", "out_ptr": p}
    consts = {"SCALE": float(scale), "HEAD_D": int(head_dim), "PRECISION": _precision(dtype), **pa.config(head_dim, dtype == "fp32")}
    return KernelVariant("ProportionalAttention", dtype, consts, sig)


def tome_match_variant(dtype: str, tokens: int, channels: int, sort_unmerged: bool) -> KernelVariant:
    from deploytk.kernels import tome_match as k

    sig = {"metric_ptr": POINTER[dtype], "N": "i32", "D": "i32", "R": "i32", "PROTECTED": "i32", "dest_ptr": "*i64"}
    return KernelVariant("ToMeMatch", dtype, {"SORT_UNMERGED": bool(sort_unmerged), **k.config(tokens, channels)}, sig)


def topk_select_variant(dtype: str, tokens: int) -> KernelVariant:
    from deploytk.kernels import topk_select as k

    sig = {"scores_ptr": POINTER[dtype], "N": "i32", "KEEP": "i32", "PROTECTED": "i32", "dest_ptr": "*i64"}
    return KernelVariant("TopKSelect", dtype, k.config(tokens), sig)


def crucial_match_variant(dtype: str, tokens: int, channels: int) -> KernelVariant:
    from deploytk.kernels import crucial_match as k

    sig = {
        "metric_ptr": POINTER[dtype],
        "scores_ptr": POINTER[dtype],
        "N": "i32",
        "D": "i32",
        "KEEP": "i32",
        "PROTECTED": "i32",
        "dest_ptr": "*i64",
    }
    return KernelVariant("CrucialMatch", dtype, k.config(tokens, channels), sig)


def size_split_match_variant(dtype: str, tokens: int, channels: int) -> KernelVariant:
    from deploytk.kernels import size_split_match as k

    sig = {
        "metric_ptr": POINTER[dtype],
        "size_ptr": POINTER[dtype],
        "N": "i32",
        "D": "i32",
        "R": "i32",
        "PROTECTED": "i32",
        "dest_ptr": "*i64",
    }
    return KernelVariant("SizeSplitMatch", dtype, k.config(tokens, channels), sig)


def mctf_match_variant(
    dtype: str, tokens: int, channels: int, tau_sim: float, tau_info: float, tau_size: float, bidirection: bool
) -> KernelVariant:
    """The taus become compile-time exponents (1/tau, 0 = off), as the attention scale does: AOT plugin scalars are ints."""
    from deploytk.kernels import mctf_match as k

    p = POINTER[dtype]
    sig = {"metric_ptr": p, "recv_ptr": p, "size_ptr": p, "N": "i32", "D": "i32", "R": "i32", "PROTECTED": "i32", "dest_ptr": "*i64"}
    return KernelVariant("MctfMatch", dtype, k.constants(tokens, channels, tau_sim, tau_info, tau_size, bidirection), sig)


def _num_warps(variant: KernelVariant) -> int:
    """The torch launcher's choice for the same kernel and tiles."""
    from deploytk.kernels import mctf_match, tome_match, topk_select

    rule = {
        "ToMeMatch": tome_match.num_warps,
        "MctfMatch": mctf_match.num_warps,
        "TopKSelect": topk_select.num_warps,
        "CrucialMatch": topk_select.num_warps,
        "SizeSplitMatch": topk_select.num_warps,
    }.get(variant.op)
    return rule(variant.constexprs) if rule else 4


def _precision(dtype: str) -> str:
    import torch

    from deploytk.kernels.launch import precision

    return precision({"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype])  # the torch launcher's rule


def _kernel_fn(op: str):
    from deploytk.kernels.crucial_match import crucial_match_kernel
    from deploytk.kernels.mctf_match import mctf_match_kernel
    from deploytk.kernels.proportional_attention import proportional_attention_kernel
    from deploytk.kernels.size_split_match import size_split_match_kernel
    from deploytk.kernels.token_aggregate import token_aggregate_kernel
    from deploytk.kernels.tome_match import tome_match_kernel
    from deploytk.kernels.topk_select import topk_select_kernel

    return {
        "TokenAggregate": token_aggregate_kernel,
        "ProportionalAttention": proportional_attention_kernel,
        "ToMeMatch": tome_match_kernel,
        "MctfMatch": mctf_match_kernel,
        "SizeSplitMatch": size_split_match_kernel,
        "TopKSelect": topk_select_kernel,
        "CrucialMatch": crucial_match_kernel,
    }[op]


def strip_hidden_params(ptx: str, kernel_name: str, visible: int) -> str:
    """Drop the parameters Triton appends after the kernel's own (global/profile scratch pointers).

    TensorRT launches an AOT kernel with exactly inputs, extra ints and outputs; Triton >= 3.3
    adds two pointer parameters at the end. They are dead when the kernel needs no scratch
    (checked: no instruction names them), so the entry is declared with the visible ones only.
    """
    head = f".entry {kernel_name}("
    start = ptx.index(head) + len(head)
    end = ptx.index(")", start)
    params = [p.strip() for p in ptx[start:end].split(",")]
    hidden = [p.split()[-1] for p in params[visible:]]
    body = ptx[end:]
    used = [name for name in hidden if re.search(rf"\b{re.escape(name)}\b", body)]
    if used:
        raise DeploytkError(
            f"internal: kernel {kernel_name} uses Triton's hidden parameters {used}; TensorRT AOT plugins cannot pass them."
        )
    return ptx[:start] + "\n\t" + ",\n\t".join(params[:visible]) + "\n" + ptx[end:]


@dataclass
class CompiledKernel:
    kernel_name: str
    ptx: str
    num_warps: int
    shared_mem: int
    arch: str
    num_stages: int


def compile_variant(variant: KernelVariant, arch: str) -> CompiledKernel:
    """triton.compile -> PTX for ``arch`` (sm_80/86/89/90); no GPU needed.

    The deepest software pipeline (``NUM_STAGES``) whose shared memory fits ``SHARED_MEM_LIMIT``
    (none of the shipped tiles needs fewer than Triton's default 3 today).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if arch not in ARCHES:
        raise DeploytkError(f"--arch {arch!r} is not supported; choose one of {', '.join(ARCHES)}.")
    fn = _kernel_fn(variant.op)
    signature = dict(variant.signature) | {name: "constexpr" for name in variant.constexprs}
    params = inspect.signature(ASTSource.__init__).parameters
    key = "constexprs" if "constexprs" in params else "constants"  # renamed in Triton 3.3
    tried = []
    for stages in NUM_STAGES:
        src = ASTSource(fn=fn, signature=signature, **{key: dict(variant.constexprs)})
        compiled = triton.compile(
            src, target=GPUTarget("cuda", ARCHES[arch], 32), options={"num_warps": _num_warps(variant), "num_stages": stages}
        )
        md = compiled.metadata
        tried.append(f"{md.shared} B at {stages} stage(s)")
        if md.shared <= SHARED_MEM_LIMIT:
            break
    else:
        raise DeploytkError(
            f"internal: kernel {variant.label} needs more than {SHARED_MEM_LIMIT} B of shared memory for {arch} "
            f"({'; '.join(tried)}), the most a TensorRT AOT plugin kernel can count on."
        )
    if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
        raise DeploytkError(f"internal: kernel {md.name} needs Triton global scratch memory, which TensorRT AOT plugins do not provide.")
    ptx = strip_hidden_params(compiled.asm["ptx"], md.name, len(variant.signature))
    return CompiledKernel(md.name, ptx, md.num_warps, md.shared, arch, stages)


def standard_variants() -> list[KernelVariant]:
    """What `deploytk plugins compile` writes: every kernel in every dtype at ViT shapes
    (channels >= 64, head dim 64 with its scale 1/8, 197 tokens, MCTF's default taus 1/20/40).
    Builds compile their own attributes."""
    out = []
    for dtype in POINTER:
        out += [token_aggregate_variant(dtype, 384, normalize) for normalize in (True, False)]
        out.append(proportional_attention_variant(dtype, 64, 64**-0.5))
        out += [tome_match_variant(dtype, 197, 64, sort) for sort in (True, False)]
        out += [mctf_match_variant(dtype, 197, 384, 1.0, 20.0, 40.0, bidirection) for bidirection in (True, False)]  # MCTF's taus
        out += [size_split_match_variant(dtype, 197, 64), topk_select_variant(dtype, 197), crucial_match_variant(dtype, 197, 384)]
    return out


def compile_all(arch: str, output: Path, variants: list[KernelVariant] | None = None, step=lambda msg: None) -> dict:
    """Write ``<label>.ptx`` for every variant plus ``kernels.json``; all or nothing."""
    from deploytk.export.artifacts import atomic_directory

    variants = variants if variants is not None else standard_variants()
    records = []
    with atomic_directory(Path(output)) as tmp:
        for v in variants:
            step(f"compiling {v.label} for {arch}")
            k = compile_variant(v, arch)
            (tmp / f"{v.label}.ptx").write_text(k.ptx)
            records.append(
                {
                    "op": v.op,
                    "dtype": v.dtype,
                    "constexprs": v.constexprs,
                    "file": f"{v.label}.ptx",
                    "kernel_name": k.kernel_name,
                    "num_warps": k.num_warps,
                    "num_stages": k.num_stages,
                    "block_x": k.num_warps * 32,
                    "shared_mem": k.shared_mem,
                    "arch": arch,
                    "ptx_sha256": hashlib.sha256(k.ptx.encode()).hexdigest(),
                }
            )
        index = {"arch": arch, "kernels": records}
        (tmp / "kernels.json").write_text(json.dumps(index, indent=2) + "\n")
    return index


__all__ = [
    "ARCHES",
    "SHARED_MEM_LIMIT",
    "KernelVariant",
    "CompiledKernel",
    "compile_variant",
    "compile_all",
    "standard_variants",
    "token_aggregate_variant",
    "proportional_attention_variant",
    "tome_match_variant",
    "mctf_match_variant",
    "size_split_match_variant",
    "topk_select_variant",
    "crucial_match_variant",
    "strip_hidden_params",
]
