"""Ahead-of-time compilation of the deploytk Triton kernels to PTX (what the AOT plugins embed).

``kernel_variant`` turns an op, its input shapes, node attributes and dtype into the kernel's
launch plan (the op's own ``kernel.plan``, the one the torch launcher uses) and its Triton
signature; ``compile_variant`` turns that into PTX and launch metadata. The TensorRT plugins'
``aot_impl`` and ``deploytk plugins compile`` both use them. Compiling needs Triton's LLVM
backend only, no GPU.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from deploytk_plugins.definitions import PLUGINS

from deploytk.errors import DeploytkError
from deploytk.files import DirectoryKind, claim_directory
from deploytk.ops import OPS
from deploytk.ops.spec import FP32, INT64
from deploytk.progress import SILENT, Progress

#: the GPU architectures deploytk compiles its plugin kernels for: Ampere (A100, A10/RTX 30, Orin), Ada (L4/L40/RTX 40),
#: Hopper (H100/H200), Blackwell (B200/GB200, B300, Thor, RTX 50/RTX PRO, DGX Spark). The installed Triton must
#: know the target too (``check_arch``); Triton 3.8 compiles all of them.
ARCHES = {
    "sm_80": 80,
    "sm_86": 86,
    "sm_87": 87,
    "sm_89": 89,
    "sm_90": 90,
    "sm_100": 100,
    "sm_103": 103,
    "sm_110": 110,
    "sm_120": 120,
    "sm_121": 121,
}
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
    """One compiled form: which op, dtype and compile-time constants, and the plan it launches with."""

    op: str  # ONNX / plugin op name
    dtype: str  # fp32 | fp16 | bf16 (x / q,k,v and the output)
    constexprs: dict
    signature: dict = field(default_factory=dict)
    plan: object = None

    @property
    def label(self) -> str:
        consts = "_".join(f"{k.lower()}{str(v).replace('.', 'p')}" for k, v in self.constexprs.items() if k != "PRECISION")
        return f"{self.op}_{self.dtype}_{consts}"


def arch_of_capability(capability: str) -> str:
    """'major.minor' (torch / nvidia-smi) -> 'sm_XY', refused unless deploytk compiles for it."""
    major, minor = (int(v) for v in capability.split("."))
    arch = f"sm_{major}{minor}"
    if arch not in ARCHES:
        raise DeploytkError(
            f"this GPU (compute capability {capability}, {arch}) is not one deploytk compiles its TensorRT plugin kernels for; "
            f"supported: {', '.join(ARCHES)}.",
            hint="Build with `merge_impl=native` and `attention_impl=native` (TensorRT runs the function bodies, no plugin kernels).",
        )
    return arch


def check_arch(arch: str) -> None:
    """Refuse an arch deploytk does not target, or one the installed Triton cannot compile for (probed once per arch)."""
    if arch not in ARCHES:
        raise DeploytkError(f"`arch={arch!r}` is not supported; choose one of {', '.join(ARCHES)}.")
    failure = _triton_cannot_compile(arch)
    if failure:
        import triton

        raise DeploytkError(
            f"the installed Triton {triton.__version__} cannot compile for {arch}: {failure}",
            hint="Install a newer Triton (`pip install -U triton`; Triton 3.8 compiles every arch deploytk lists).",
        )


@functools.cache
def _triton_cannot_compile(arch: str) -> str:
    """'' if Triton compiles a one-line kernel to PTX for ``arch``, else its error (first line)."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def probe(x_ptr):
        tl.store(x_ptr, tl.load(x_ptr) + 1)

    try:
        triton.compile(ASTSource(fn=probe, signature={"x_ptr": "*fp32"}), target=GPUTarget("cuda", ARCHES[arch], 32))
    except Exception as err:  # Triton raises assorted types (ptxas errors, ValueError, RuntimeError) for an unknown target
        return (str(err).strip().splitlines() or [type(err).__name__])[0]
    return ""


def ptx_isa(ptx: str) -> str:
    """The PTX ISA version the module declares: the GPU driver that JIT-compiles it must support that version."""
    match = re.search(r"^\.version (\d+\.\d+)$", ptx, re.M)
    return match.group(1) if match else "unknown"


def _pointer(kind: str, dtype: str) -> str:
    return {FP32: "*fp32", INT64: "*i64"}.get(kind, POINTER[dtype])


def kernel_variant(op: str, shapes: list, attrs: dict, dtype: str) -> KernelVariant:
    """The kernel of ``op`` for these input shapes (the batch may be symbolic), node attributes and dtype.

    Its Triton signature follows from the op's spec: input pointers typed by their kind, the
    plan's int arguments, the output pointer (TensorRT's AOT order), named as the kernel names them.
    """
    spec = OPS[op]
    plan = spec.kernel_module().plan(shapes, attrs, dtype)
    kinds = [_pointer(t.kind, dtype) for t in spec.inputs] + ["i32"] * len(plan.ints) + [_pointer(spec.output, dtype)]
    signature = dict(zip(plan.kernel.arg_names, kinds, strict=False))
    return KernelVariant(op, dtype, dict(plan.constexprs), signature, plan)


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
    """triton.compile -> PTX for ``arch`` (one of ``ARCHES``); no GPU needed.

    The deepest software pipeline (``NUM_STAGES``) whose shared memory fits ``SHARED_MEM_LIMIT``
    (none of the shipped tiles needs fewer than Triton's default 3 today).
    """
    import triton  # optional: only AOT compilation needs it
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    check_arch(arch)
    fn = variant.plan.kernel
    signature = dict(variant.signature) | {name: "constexpr" for name in variant.constexprs}
    params = inspect.signature(ASTSource.__init__).parameters
    key = "constexprs" if "constexprs" in params else "constants"  # renamed in Triton 3.3
    tried = []
    for stages in NUM_STAGES:
        src = ASTSource(fn=fn, signature=signature, **{key: dict(variant.constexprs)})
        compiled = triton.compile(
            src, target=GPUTarget("cuda", ARCHES[arch], 32), options={"num_warps": variant.plan.num_warps, "num_stages": stages}
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
    """What `deploytk plugins compile` writes: every op's examples (``definitions.PLUGINS``) in every dtype.
    Builds compile their own shapes and attributes."""
    return [
        kernel_variant(op, example.shapes, example.attrs, dtype)
        for dtype in POINTER
        for op, definition in PLUGINS.items()
        for example in definition.examples
    ]


def _kernel_files(folder: Path) -> set[str] | None:
    """kernels.json and the .ptx files it lists, if ``folder`` is an earlier `plugins compile` output."""
    try:
        index = json.loads((folder / KERNELS_INDEX).read_text())
        return {KERNELS_INDEX, *(str(record["file"]) for record in index["kernels"])}
    except (OSError, ValueError, UnicodeDecodeError, KeyError, TypeError):
        return None


KERNELS_INDEX = "kernels.json"
#: the `output` folder of `deploytk plugins compile`
KERNEL_SET = DirectoryKind("deploytk kernel folder", KERNELS_INDEX, _kernel_files)


def compile_all(
    arch: str, output: Path, variants: list[KernelVariant] | None = None, progress: Progress = SILENT, force: bool = False
) -> dict:
    """Write ``<label>.ptx`` for every variant plus ``kernels.json``; all or nothing (``output`` claimed first, deploytk.files)."""
    check_arch(arch)
    with claim_directory(Path(output), KERNEL_SET, force=force) as target:
        variants = variants if variants is not None else standard_variants()
        records = []
        with target.write() as tmp:
            for v in variants:
                progress.step(f"compiling {v.label} for {arch}")
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
                        "ptx_isa": ptx_isa(k.ptx),
                        "ptx_sha256": hashlib.sha256(k.ptx.encode()).hexdigest(),
                    }
                )
            index = {"arch": arch, "kernels": records}
            (tmp / KERNELS_INDEX).write_text(json.dumps(index, indent=2) + "\n")
        return index
