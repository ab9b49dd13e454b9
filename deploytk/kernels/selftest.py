"""`deploytk selftest`: every Triton kernel against the PyTorch reference.

Randomized shapes (seeded), all dtypes and several batch sizes; natively on a GPU, or in
Triton's interpreter on a CPU (``TRITON_INTERPRET=1``, small shapes). The reference runs in
fp32 on the same (rounded) inputs; the error is measured relative to the output's scale.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

import torch

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
    #: matching ops: images whose assignment differs from the reference's only at float64 near-ties
    near_ties: int = 0


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


def attention_shapes(interpreter: bool, rng: random.Random) -> list[tuple[int, int, int, int]]:
    """(B, H, N, D) cases."""
    if interpreter:
        fixed = [(1, 1, 17, 16), (2, 3, 65, 32), (1, 3, 197, 64)]
        rand = [(rng.randint(1, 2), rng.randint(1, 3), n, rng.choice([16, 64])) for n in rng.sample(range(2, 100), 2)]
    else:
        fixed = [(64, 12, 197, 64), (64, 6, 197, 64), (2, 16, 577, 64), (8, 3, 181, 64)]
        rand = [(rng.randint(1, 64), rng.choice([3, 6, 12]), n, 64) for n in rng.sample(range(2, 578), 4)]
    return fixed + rand


def match_shapes(interpreter: bool, rng: random.Random) -> list[tuple[int, int, int, int, int]]:
    """(B, N, D, r, protected) cases for ToMeMatch; r = the largest allowed and a random one."""
    if interpreter:
        fixed = [(2, 17, 16, 8, 1), (3, 65, 32, 4, 2), (2, 197, 64, 16, 1), (1, 261, 24, 40, 5)]
        rand = [(rng.randint(1, 3), n, rng.choice([8, 40, 64]), 0, rng.randint(0, 2)) for n in rng.sample(range(5, 300), 2)]
    else:
        fixed = [(64, 197, 64, 16, 1), (64, 577, 64, 144, 1), (8, 197, 64, 98, 1), (64, 198, 64, 8, 2), (3, 1025, 64, 100, 1)]
        rand = [(rng.randint(1, 64), n, rng.choice([32, 64, 128]), 0, rng.randint(0, 5)) for n in rng.sample(range(8, 578), 4)]
    return fixed + [(b, n, d, r or rng.randint(1, (n - p) // 2), p) for b, n, d, r, p in rand]


def tome_near_ties(metric: torch.Tensor, got: torch.Tensor, r: int, protected: int, sort_unmerged: bool, tol: float = 1e-5) -> int | None:
    """How many images' ``got`` differ from the reference but are ToMe matchings in float64 up to ``tol`` ties.

    A valid matching: B tokens in their slots; exactly r A tokens (unprotected) merge, each into
    a B token scoring within ``tol`` of its row's best; no unmerged A token beats a merged one by
    more than ``tol``; unmerged tokens in index order (``sort_unmerged``) or by descending
    score within ``tol``. Returns None if an image is not valid (a real error).
    """
    from deploytk.merging.tome import protected_split, tome_dest, tome_slots

    want = tome_dest(metric.float(), r, protected, sort_unmerged)
    b, n, _ = metric.shape
    na, nb = (n + 1) // 2, n // 2
    pa, pb = protected_split(protected)
    unm_slot, b_slot = tome_slots(na, nb, r, protected)
    j_of_slot, k_of_slot = {s: j for j, s in enumerate(b_slot)}, {s: k for k, s in enumerate(unm_slot)}
    m = metric.double() / metric.double().norm(dim=-1, keepdim=True)
    scores = m[:, ::2] @ m[:, 1::2].transpose(-1, -2)
    scores[:, :pa], scores[:, :, :pb] = -float("inf"), -float("inf")
    best = scores.max(-1).values
    ties = 0
    for i in range(b):
        if torch.equal(got[i], want[i]):
            continue
        da, db = got[i, ::2].tolist(), got[i, 1::2].tolist()
        src = [a for a in range(na) if da[a] in j_of_slot]
        unm = sorted((a for a in range(na) if da[a] in k_of_slot), key=lambda a: k_of_slot[da[a]])
        if db != b_slot or len(src) != r or len(unm) != na - r or [k_of_slot[da[a]] for a in unm] != list(range(na - r)):
            return None
        if any(a < pa or scores[i, a, j_of_slot[da[a]]] < best[i, a] - tol for a in src):
            return None
        if unm and src and max(best[i, a] for a in unm if a >= pa) > min(best[i, a] for a in src) + tol:
            return None
        order_ok = unm == sorted(unm) if sort_unmerged else all(best[i, x] >= best[i, y] - tol for x, y in zip(unm, unm[1:]))
        if not order_ok:
            return None
        ties += 1
    return ties


def selection_shapes(interpreter: bool, rng: random.Random) -> list[tuple[int, int, int, int]]:
    """(B, N, D, protected) cases for the other matching/selection ops (MCTF, ATM, Top-K/EViT, crucial)."""
    if interpreter:
        fixed = [(2, 17, 16, 1), (3, 65, 32, 2), (2, 197, 64, 1), (2, 50, 24, 0)]
        rand = [(rng.randint(1, 3), n, rng.choice([8, 24, 64]), rng.randint(0, 3)) for n in rng.sample(range(6, 120), 1)]
    else:
        fixed = [(64, 197, 64, 1), (64, 577, 64, 1), (8, 1025, 64, 1), (64, 198, 384, 2), (64, 196, 64, 0)]
        rand = [(rng.randint(1, 64), n, rng.choice([32, 64, 384]), rng.randint(0, 5)) for n in rng.sample(range(8, 578), 3)]
    return fixed + rand


def rounding_ties(reference, args: list, got: torch.Tensor, perturb: int | None) -> int | None:
    """How many images' ``got`` differ from ``reference(*args)`` but are its choice once input
    ``perturb`` is perturbed at float32 rounding level (the validator's test of a near-tie
    flip, ``validate.branches``); None if an image is not explained that way (a real error).
    ``perturb=None``: no arithmetic is involved, so any difference is an error.
    """
    from deploytk.validate.branches import PERTURBATION_TRIALS, ROUNDING_PERTURBATION

    want = reference(*args)
    gen = torch.Generator().manual_seed(0)
    ties = 0
    for i in range(got.shape[0]):
        if torch.equal(got[i], want[i]):
            continue
        if perturb is None:
            return None
        rows = [a[i : i + 1] if isinstance(a, torch.Tensor) else a for a in args]
        for _ in range(PERTURBATION_TRIALS):
            x = rows[perturb]
            trial = [*rows[:perturb], x * (1 + ROUNDING_PERTURBATION * torch.randn(x.shape, generator=gen)), *rows[perturb + 1 :]]
            if torch.equal(reference(*trial)[0], got[i]):
                break
        else:
            return None
        ties += 1
    return ties


def selection_cases(dtype: torch.dtype, device: str, interpreter: bool, rng: random.Random, gen: torch.Generator) -> list[Case]:
    """MctfMatch, SizeSplitMatch, TopKSelect and CrucialMatch against their references (``merging``).

    Scores and sizes take few distinct values, so exact ties occur and the tie rules (lower
    index / lower size rank first) are checked too; only the metric's arithmetic may flip
    near-ties, and each flip must be reproduced by the reference at rounding level.
    """
    from deploytk.kernels import launch
    from deploytk.merging.atm import size_split_match
    from deploytk.merging.mctf import mctf_match
    from deploytk.merging.pruning import crucial_match, topk_select

    def case(op, shape, reference, args, run, perturb):
        got = run(*[a.to(dtype).to(device) if isinstance(a, torch.Tensor) else a for a in args]).cpu()
        args = [a.to(dtype).float() if isinstance(a, torch.Tensor) else a for a in args]  # the reference sees the rounded inputs
        ties = rounding_ties(reference, args, got, perturb)
        err = float((got - reference(*args)).abs().max())
        return Case(op, DTYPE_NAMES[dtype], shape, err, 0.0, ties is not None, ties or 0)

    cases = []
    for k, (b, n, d, p) in enumerate(selection_shapes(interpreter, rng)):
        metric = torch.randn(b, n, d, generator=gen)
        levels = 8 if k % 2 == 0 else 1000  # few levels: many exact ties
        scores = torch.randint(1, levels + 1, (b, n), generator=gen).float() / levels
        size = torch.randint(1, 5, (b, n, 1), generator=gen).float()
        received = torch.rand(b, n, generator=gen) * 0.02 + 1e-3
        keep, r = rng.randint(1, n - p - 1), rng.randint(1, (n - p) // 2)
        taus = (1.0, 20.0, 40.0) if k % 2 == 0 else (1.0, 0.0, 0.0)  # MCTF's defaults; similarity only
        base = {"B": b, "N": n, "D": d, "protected": p}
        cases.append(case("TopKSelect", {**base, "keep": keep}, topk_select, [scores, keep, p], launch.topk_select, None))
        cases.append(case("CrucialMatch", {**base, "keep": keep}, crucial_match, [metric, scores, keep, p], launch.crucial_match, 0))
        cases.append(case("SizeSplitMatch", {**base, "r": r}, size_split_match, [metric, size, r, p], launch.size_split_match, 0))
        for bidirection in (True, False):
            args = [metric, received, size, r, p, *taus, bidirection]
            shape = {**base, "r": r, "taus": list(taus), "bidirection": bidirection}
            cases.append(case("MctfMatch", shape, mctf_match, args, launch.mctf_match, 0))
    return cases


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).abs().max() / max(1.0, float(want.abs().max())))


def run(seed: int = 0, device: str | None = None) -> list[Case]:
    from deploytk.kernels import launch
    from deploytk.merging.assign import token_aggregate as aggregate_reference
    from deploytk.merging.tome import tome_dest
    from deploytk.ops.proportional_attention import attention_reference

    interpreter = launch.interpreting()
    device = device or ("cpu" if interpreter else "cuda")
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    cases = []
    for dtype, tol in TOLERANCE.items():
        if interpreter and dtype in INTERPRETER_SKIPS:
            continue
        for b, n, c, t in aggregate_shapes(interpreter, rng):
            x = torch.randn(b, n, c, generator=gen).to(dtype)
            w = torch.rand(b, n, 1, generator=gen) * 4 + 0.05
            dest = valid_assignment(b, n, t, gen)
            for normalize in (True, False):
                want = aggregate_reference(x.float(), w, dest, t, normalize)
                got = launch.token_aggregate(x.to(device), w.to(device), dest.to(device), t, normalize).cpu()
                err = _error(got, want)
                shape = {"B": b, "N": n, "C": c, "tokens_out": t, "normalize": normalize}
                cases.append(Case("TokenAggregate", DTYPE_NAMES[dtype], shape, err, tol, err <= tol))
        for b, h, n, d in attention_shapes(interpreter, rng):
            q, k, v = (torch.randn(b, h, n, d, generator=gen).to(dtype) for _ in range(3))
            size = torch.randint(1, 8, (b, n, 1), generator=gen).float()
            scale = d**-0.5
            want = attention_reference(q.float(), k.float(), v.float(), size, scale)
            got = launch.proportional_attention(q.to(device), k.to(device), v.to(device), size.to(device), scale).cpu()
            err = _error(got, want)
            cases.append(Case("ProportionalAttention", DTYPE_NAMES[dtype], {"B": b, "H": h, "N": n, "D": d}, err, tol, err <= tol))
        for b, n, d, r, p in match_shapes(interpreter, rng):
            metric = torch.randn(b, n, d, generator=gen).to(dtype)
            for sort_unmerged in (True, False):
                got = launch.tome_match(metric.to(device), r, p, sort_unmerged).cpu()
                want = tome_dest(metric.float(), r, p, sort_unmerged)
                err = float((got - want).abs().max())
                ties = tome_near_ties(metric, got, r, p, sort_unmerged)
                shape = {"B": b, "N": n, "D": d, "r": r, "protected": p, "sort_unmerged": sort_unmerged}
                cases.append(Case("ToMeMatch", DTYPE_NAMES[dtype], shape, err, 0.0, ties is not None, ties or 0))
        cases += selection_cases(dtype, device, interpreter, rng, gen)
    return cases


def environment() -> dict:
    import triton

    from deploytk.kernels.launch import interpreting

    info = {"mode": "interpreter" if interpreting() else "gpu", "triton": triton.__version__, "torch": torch.__version__}
    if not interpreting() and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    if interpreting():
        info["skipped"] = {DTYPE_NAMES[d]: why for d, why in INTERPRETER_SKIPS.items()}
    return info


def to_json(cases: list[Case]) -> dict:
    return {"environment": environment(), "cases": [asdict(c) for c in cases], "passed": all(c.passed for c in cases)}


__all__ = ["Case", "run", "to_json", "valid_assignment", "tome_near_ties", "rounding_ties", "TOLERANCE"]
