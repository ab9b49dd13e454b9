"""`deploytk selftest`: every op's Triton kernel against its PyTorch reference.

Randomized shapes (seeded), all dtypes and several batch sizes; natively on a GPU, or in
Triton's interpreter on a CPU (``TRITON_INTERPRET=1``, small shapes). The reference runs in
fp32 on the same (rounded) inputs; numeric outputs are compared relative to the output's
scale, discrete choices exactly or up to proven near-ties (each op's ``SelftestPlan``).

Ops share seeded input draws by *family* (``FAMILIES``): one draw per shape, every op of the
family checked on it. The draw order is fixed, so a seed always gives the same cases.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from deploytk.errors import DeploytkError
from deploytk.ops import OPS
from deploytk.ops.spec import FLOAT, OpSpec
from deploytk.optional import require_triton, triton_version
from deploytk.progress import SILENT, Progress

#: max |kernel - reference| / max(1, max |reference|) allowed per dtype
TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 4e-2}
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
#: Triton 3.8's interpreter computes tl.dot on bf16 operands wrongly (checked with a one-dot kernel), so bf16 runs on GPUs only
INTERPRETER_SKIPS = {torch.bfloat16: "tl.dot on bf16 is wrong in Triton's CPU interpreter; bf16 is checked on a GPU"}


@dataclass
class Case:
    op: str
    dtype: str
    shape: dict
    max_abs_err: float
    tolerance: float
    passed: bool
    #: matching ops: images whose assignment differs from the reference's only at near-ties
    near_ties: int = 0
    #: wall seconds of the kernel call (its first call per op and dtype includes Triton's compile) and the check
    seconds: float = 0.0


def valid_assignment(b: int, n: int, t: int, gen: torch.Generator) -> torch.Tensor:
    """dest [b, n] where every output slot 0..t-1 receives >= 1 token (what the matching ops produce) and some tokens are dropped (t)."""
    dest = torch.empty(b, n, dtype=torch.long)
    for i in range(b):
        perm = torch.randperm(n, generator=gen)
        dest[i, perm[:t]] = torch.arange(t)
        dest[i, perm[t:]] = torch.randint(0, t + 1, (n - t,), generator=gen)
    return dest


def aggregate_shapes(interpreter: bool, rng: random.Random) -> list[tuple[int, int, int, int]]:
    """(B, N, C, T) cases: fixed ViT shapes plus seeded random ones."""
    if interpreter:
        fixed = [(1, 17, 24, 9), (2, 65, 96, 50), (3, 197, 64, 181)]
        rand = [(rng.randint(1, 3), n, rng.choice([16, 40, 72]), 0) for n in rng.sample(range(5, 120), 2)]
    else:
        fixed = [(64, 197, 768, 181), (8, 577, 1024, 561), (1, 577, 384, 289), (64, 197, 384, 140)]
        rand = [(rng.randint(1, 64), n, rng.choice([192, 384, 768, 1024]), 0) for n in rng.sample(range(5, 578), 4)]
    return fixed + [(b, n, c, rng.randint(1, n)) for b, n, c, _ in rand]


def _aggregate_draw(shape: tuple, k: int, rng: random.Random, gen: torch.Generator) -> dict:
    b, n, c, t = shape
    x = torch.randn(b, n, c, generator=gen)
    w = torch.rand(b, n, 1, generator=gen) * 4 + 0.05
    dest = valid_assignment(b, n, t, gen)
    return {"x": x, "weight": w, "dest": dest, "tokens_out": t, "shape": {"B": b, "N": n, "C": c, "tokens_out": t}}


def attention_shapes(interpreter: bool, rng: random.Random) -> list[tuple[int, int, int, int]]:
    """(B, H, N, D) cases."""
    if interpreter:
        fixed = [(1, 1, 17, 16), (2, 3, 65, 32), (1, 3, 197, 64)]
        rand = [(rng.randint(1, 2), rng.randint(1, 3), n, rng.choice([16, 64])) for n in rng.sample(range(2, 100), 2)]
    else:
        fixed = [(64, 12, 197, 64), (64, 6, 197, 64), (2, 16, 577, 64), (8, 3, 181, 64)]
        rand = [(rng.randint(1, 64), rng.choice([3, 6, 12]), n, 64) for n in rng.sample(range(2, 578), 4)]
    return fixed + rand


def _attention_draw(shape: tuple, k: int, rng: random.Random, gen: torch.Generator) -> dict:
    b, h, n, d = shape
    q, k_, v = (torch.randn(b, h, n, d, generator=gen) for _ in range(3))
    size = torch.randint(1, 8, (b, n, 1), generator=gen).float()
    return {"q": q, "k": k_, "v": v, "size": size, "scale": d**-0.5, "shape": {"B": b, "H": h, "N": n, "D": d}}


def match_shapes(interpreter: bool, rng: random.Random) -> list[tuple[int, int, int, int, int]]:
    """(B, N, D, r, protected) cases for ToMeMatch; r = the largest allowed and a random one."""
    if interpreter:
        fixed = [(2, 17, 16, 8, 1), (3, 65, 32, 4, 2), (2, 197, 64, 16, 1), (1, 261, 24, 40, 5)]
        rand = [(rng.randint(1, 3), n, rng.choice([8, 40, 64]), 0, rng.randint(0, 2)) for n in rng.sample(range(5, 300), 2)]
    else:
        fixed = [(64, 197, 64, 16, 1), (64, 577, 64, 144, 1), (8, 197, 64, 98, 1), (64, 198, 64, 8, 2), (3, 1025, 64, 100, 1)]
        rand = [(rng.randint(1, 64), n, rng.choice([32, 64, 128]), 0, rng.randint(0, 5)) for n in rng.sample(range(8, 578), 4)]
    return fixed + [(b, n, d, r or rng.randint(1, (n - p) // 2), p) for b, n, d, r, p in rand]


def zero_keys(metric: torch.Tensor, k: int, protected: int) -> torch.Tensor:
    """On odd draws, zero metric rows: the protected tokens' (AST's class and distillation tokens under transformers'
    own init have zero keys) and one other token's. Their cosine is 0 to every token (the tie rule, ``ops.ties``)."""
    if k % 2:
        metric[:, :protected] = 0.0
        metric[:, (protected + metric.shape[1]) // 2] = 0.0
    return metric


def _tome_draw(shape: tuple, k: int, rng: random.Random, gen: torch.Generator) -> dict:
    b, n, d, r, p = shape
    metric = zero_keys(torch.randn(b, n, d, generator=gen), k, p)
    return {"metric": metric, "r": r, "protected": p, "shape": {"B": b, "N": n, "D": d, "r": r, "protected": p}}


def selection_shapes(interpreter: bool, rng: random.Random) -> list[tuple[int, int, int, int]]:
    """(B, N, D, protected) cases for the other matching/selection ops (MCTF, ATM, Top-K/EViT, crucial)."""
    if interpreter:
        fixed = [(2, 17, 16, 1), (3, 65, 32, 2), (2, 197, 64, 1), (2, 50, 24, 0)]
        rand = [(rng.randint(1, 3), n, rng.choice([8, 24, 64]), rng.randint(0, 3)) for n in rng.sample(range(6, 120), 1)]
    else:
        fixed = [(64, 197, 64, 1), (64, 577, 64, 1), (8, 1025, 64, 1), (64, 198, 384, 2), (64, 196, 64, 0)]
        rand = [(rng.randint(1, 64), n, rng.choice([32, 64, 384]), rng.randint(0, 5)) for n in rng.sample(range(8, 578), 3)]
    return fixed + rand


def _selection_draw(shape: tuple, k: int, rng: random.Random, gen: torch.Generator) -> dict:
    """Scores and sizes take few distinct values, so exact ties occur and the tie rules (lower
    index / lower size rank first) are checked too; only the metric's arithmetic may flip near-ties.
    Odd draws have zero metric rows (``zero_keys``)."""
    b, n, d, p = shape
    metric = zero_keys(torch.randn(b, n, d, generator=gen), k, p)
    levels = 8 if k % 2 == 0 else 1000  # few levels: many exact ties
    scores = torch.randint(1, levels + 1, (b, n), generator=gen).float() / levels
    size = torch.randint(1, 5, (b, n, 1), generator=gen).float()
    received = torch.rand(b, n, generator=gen) * 0.02 + 1e-3
    keep, r = rng.randint(1, n - p - 1), rng.randint(1, (n - p) // 2)
    taus = (1.0, 20.0, 40.0) if k % 2 == 0 else (1.0, 0.0, 0.0)  # MCTF's defaults; similarity only
    return {
        "metric": metric,
        "scores": scores,
        "size": size,
        "received": received,
        "keep": keep,
        "r": r,
        "protected": p,
        "taus": taus,
        "shape": {"B": b, "N": n, "D": d, "protected": p},
    }


def clustering_shapes(interpreter: bool, rng: random.Random) -> list[tuple[int, int, int, int]]:
    """(B, M, C, clusters) cases for the clustering ops (K-Medoids, DPC-KNN); M = the candidate tokens."""
    if interpreter:
        fixed = [(2, 16, 8, 5), (2, 64, 16, 44), (1, 196, 32, 137)]
        rand = [(rng.randint(1, 3), m, rng.choice([8, 24]), 0) for m in rng.sample(range(6, 100), 1)]
    else:
        fixed = [(64, 196, 384, 137), (64, 137, 384, 96), (8, 576, 768, 403), (64, 196, 192, 49), (2, 1024, 64, 512)]
        rand = [(rng.randint(1, 64), m, rng.choice([64, 384]), 0) for m in rng.sample(range(8, 578), 3)]
    return fixed + [(b, m, c, k or rng.randint(1, m)) for b, m, c, k in rand]


def _clustering_draw(shape: tuple, k: int, rng: random.Random, gen: torch.Generator) -> dict:
    """Points around a few centres, some of them exact duplicates (distance ties), and weights
    of few levels on even draws (weight ties): the tie rules are checked too."""
    b, m, c, clusters = shape
    centres = torch.randn(b, max(1, m // 8), c, generator=gen) * 3
    points = centres.gather(1, torch.randint(0, centres.shape[1], (b, m, 1), generator=gen).expand(b, m, c))
    points = points + torch.randn(b, m, c, generator=gen)
    points[:, 1::7] = points[:, ::7][:, : points[:, 1::7].shape[1]]  # duplicates
    dist = torch.cdist(points, points)
    levels = 6 if k % 2 == 0 else 10000
    weight = torch.randint(1, levels + 1, (b, m), generator=gen).float() / levels
    return {"dist": dist, "weight": weight, "clusters": clusters, "shape": {"B": b, "M": m, "C": c}}


def sampling_shapes(interpreter: bool, rng: random.Random) -> list[tuple[int, int]]:
    """(B, M) cases for ATSSample; M = the candidate tokens."""
    if interpreter:
        fixed = [(2, 16), (3, 64), (2, 196)]
        rand = [(rng.randint(1, 3), m) for m in rng.sample(range(3, 120), 1)]
    else:
        fixed = [(64, 196), (64, 137), (8, 576), (2, 1024)]
        rand = [(rng.randint(1, 64), m) for m in rng.sample(range(3, 578), 3)]
    return fixed + rand


def _sampling_draw(shape: tuple, k: int, rng: random.Random, gen: torch.Generator) -> dict:
    """Significance scores (some 0, few levels on even draws: ties) and sizes with empty (0) tokens at the end."""
    b, m = shape
    levels = 5 if k % 2 == 0 else 10000
    scores = torch.randint(0, levels + 1, (b, m), generator=gen).float() / levels
    size = torch.ones(b, m, 1)
    for row in range(b):
        size[row, m - rng.randint(0, m // 4) :] = 0.0
    return {"scores": scores, "size": size, "shape": {"B": b, "M": m}}


@dataclass(frozen=True)
class Family:
    """Seeded shapes (native or interpreter-sized) and one input draw per shape."""

    shapes: Callable[[bool, random.Random], list[tuple]]
    draw: Callable[[tuple, int, random.Random, torch.Generator], dict]


#: in run order; an op names its family in ``SelftestPlan.family``
FAMILIES = {
    "aggregate": Family(aggregate_shapes, _aggregate_draw),
    "attention": Family(attention_shapes, _attention_draw),
    "tome": Family(match_shapes, _tome_draw),
    "selection": Family(selection_shapes, _selection_draw),
    "clustering": Family(clustering_shapes, _clustering_draw),
    "sampling": Family(sampling_shapes, _sampling_draw),
}


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).abs().max() / max(1.0, float(want.abs().max())))


def check_call(spec: OpSpec, dtype: torch.dtype, device: str, args: list, shape: dict) -> Case:
    """One kernel call against the reference on the same dtype-rounded inputs."""
    n_in = len(spec.inputs)
    kernel_args = [a.to(dtype).to(device) if t.kind == FLOAT else a.to(device) for a, t in zip(args, spec.inputs, strict=False)]
    ref_args = [a.to(dtype).float() if t.kind == FLOAT else a for a, t in zip(args, spec.inputs, strict=False)]
    kernel_args += args[n_in:]
    ref_args += args[n_in:]
    got = spec.kernel_module().launch(*kernel_args).cpu()
    if spec.selftest.ties is None:
        err, tol = _error(got, spec.reference(*ref_args)), TOLERANCE[dtype]
        return Case(spec.name, DTYPE_NAMES[dtype], shape, err, tol, err <= tol)
    ties = spec.selftest.ties(spec.reference, ref_args, got)
    err = float((got - spec.reference(*ref_args)).abs().max())
    return Case(spec.name, DTYPE_NAMES[dtype], shape, err, 0.0, ties is not None, ties or 0)


def timed(check: Callable[..., Case], *args) -> Case:
    """The case with its wall time: the first H200 run's selftest took about 210 s, and the cases say where."""
    start = time.perf_counter()
    case = check(*args)
    case.seconds = round(time.perf_counter() - start, 3)
    return case


def run(seed: int = 0, device: str | None = None) -> list[Case]:
    from deploytk.ops import kernel_common  # imports Triton, an optional dependency

    interpreter = kernel_common.interpreting()
    device = device or ("cpu" if interpreter else "cuda")
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    cases = []
    for dtype in TOLERANCE:
        if interpreter and dtype in INTERPRETER_SKIPS:
            continue
        for family_name, family in FAMILIES.items():
            specs = [spec for spec in OPS.values() if spec.selftest.family == family_name]
            for k, shape in enumerate(family.shapes(interpreter, rng)):
                draw = family.draw(shape, k, rng, gen)
                for spec in specs:
                    cases += [timed(check_call, spec, dtype, device, args, record) for args, record in spec.selftest.calls(draw)]
    return cases


def environment() -> dict:
    from deploytk.ops import kernel_common  # imports Triton, an optional dependency

    interpreting = kernel_common.interpreting()
    info = {"mode": "interpreter" if interpreting else "gpu", "triton": triton_version(), "torch": torch.__version__}
    if not interpreting and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    if interpreting:
        info["skipped"] = {DTYPE_NAMES[d]: why for d, why in INTERPRETER_SKIPS.items()}
    return info


def to_json(cases: list[Case]) -> dict:
    return {"environment": environment(), "cases": [asdict(c) for c in cases], "passed": all(c.passed for c in cases)}


def run_selftest(seed: int = 0, progress: Progress = SILENT) -> dict:
    """`deploytk selftest`: natively on a CUDA GPU, or in Triton's interpreter with TRITON_INTERPRET=1; the JSON report."""
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        raise DeploytkError(
            "selftest runs the Triton kernels natively on a CUDA GPU, and none is available here.",
            hint="Run `TRITON_INTERPRET=1 deploytk selftest` to run them in Triton's CPU interpreter (small shapes).",
        )
    require_triton("selftest")
    progress.step("running the kernels against the PyTorch reference")
    return to_json(run(seed))
