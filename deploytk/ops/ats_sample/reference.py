"""Eager reference of ``ATSSample``: ATS's inverse-transform sampling (Fayyaz et al., ECCV 2022), as the study runs it.

The significance scores are normalised (sum + 1e-6) into a CDF over the candidate tokens;
empty tokens (size 0: slots an earlier ATS block left empty) get CDF + 0.1, as the official
code does for its masked tokens; each of the fixed ``steps`` picks the token whose CDF is
nearest (|step - cdf|, the first token on ties). The distinct picked tokens keep their
order and take the first slots; a step that picks an already picked token leaves a slot
empty at the end (it receives no token, so its size is 0).
"""

from __future__ import annotations

import torch


def ats_steps(count: int) -> torch.Tensor:
    """The study's CDF steps for sample count K: arange(1/(2K), (2K-1)/(2K), 1/K) in float32 (K - 1 or K of them)."""
    return torch.arange(1 / (2 * count), (2 * count - 1) / (2 * count), 2 / (2 * count))


def ats_cdf(scores: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
    """[B, M] the official CDF: normalised cumulative significance, + 0.1 on empty tokens."""
    cdf = (scores / (scores.sum(dim=-1, keepdim=True) + 1e-6)).cumsum(dim=1)
    return torch.where(size[..., 0] > 0, cdf, cdf + 0.1)


def ats_sample(scores: torch.Tensor, size: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """dest [B, M]: picked tokens -> slots 0.. in token order; the others -> slot len(steps) (dropped)."""
    cdf = ats_cdf(scores, size)
    picked = (steps[None, :, None] - cdf[:, None, :]).abs().argmin(dim=-1)  # [B, S]
    sampled = torch.zeros_like(cdf, dtype=torch.bool).scatter(1, picked, True)
    return torch.where(sampled, sampled.long().cumsum(dim=1) - 1, steps.shape[0])


#: how far apart two CDF gaps may be and still be a tie: a few float32 ulps of a CDF near 1 (runtimes sum it
#: in other orders: ONNX Runtime and OpenVINO in sequence, torch's CPU cumsum not; 1.8e-7..3.6e-7 apart measured)
CDF_TIE = 1e-6


def ats_near_tie(scores: torch.Tensor, size: torch.Tensor, steps: torch.Tensor, dest: torch.Tensor, tol: float = CDF_TIE) -> bool:
    """Is ``dest`` [1, M] what ATS picks when its CDF is rounded differently by up to ``tol``?

    Each step may pick any token whose gap |step - cdf| is within ``tol`` of its smallest gap. ``dest``
    qualifies if every step has such a token among the ones ``dest`` keeps, every kept token is such
    a token for some step, and ``dest``'s slots are those of its kept tokens in order. A random input
    perturbation cannot prove this: one large enough to move a single gap moves the other 175 steps' too.
    """
    cdf = ats_cdf(scores.double(), size.double())[0]
    gap = (steps.double()[:, None] - cdf[None, :]).abs()  # [S, M]
    admissible = gap <= gap.min(dim=1, keepdim=True).values + tol
    kept = dest[0] < steps.shape[0]
    slots = torch.where(kept, kept.long().cumsum(0) - 1, steps.shape[0])
    return bool((admissible & kept[None]).any(1).all() and admissible[:, kept].any(0).all() and torch.equal(slots, dest[0]))
