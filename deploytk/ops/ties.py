"""When a matching op may choose differently from its reference: near-ties at float32 rounding level.

Matching ops make discrete choices. Two candidates whose scores agree to float32 rounding may
be ordered either way by any correct implementation (another summation order, a fused
kernel), and the choice then differs. A different choice is accepted as such a near-tie only
if the reference itself makes it once its input is perturbed at rounding level. ``deploytk
selftest`` holds the kernels to this rule and ``deploytk validate`` the runtimes' graphs.
"""

from __future__ import annotations

import torch

#: relative size of the perturbation, a few float32 ulps
ROUNDING_PERTURBATION = 1e-6
#: seeded perturbations tried before a different choice counts as an error
PERTURBATION_TRIALS = 32


def rounding_ties(
    reference, args: list, got: torch.Tensor, perturb: int | None, near_tie=None, unbatched: tuple[int, ...] = ()
) -> int | None:
    """How many images' ``got`` differ from ``reference(*args)`` but are its choice once input
    ``perturb`` is perturbed at float32 rounding level, or that ``near_tie(*args of the image, got)``
    accepts (an op's own proof, ``OpSpec.near_tie``); None if an image is not explained that way
    (a real error). ``perturb=None``: no arithmetic is involved, so any difference is an error.
    ``unbatched``: positions of tensor arguments without a batch dimension (ATSSample's steps), passed whole.
    """
    want = reference(*args)
    gen = torch.Generator().manual_seed(0)
    ties = 0
    for i in range(got.shape[0]):
        if torch.equal(got[i], want[i]):
            continue
        if perturb is None:
            return None
        rows = [a[i : i + 1] if isinstance(a, torch.Tensor) and k not in unbatched else a for k, a in enumerate(args)]
        if near_tie is not None and near_tie(*rows, got[i : i + 1]):
            ties += 1
            continue
        for _ in range(PERTURBATION_TRIALS):
            x = rows[perturb]
            trial = [*rows[:perturb], x * (1 + ROUNDING_PERTURBATION * torch.randn(x.shape, generator=gen)), *rows[perturb + 1 :]]
            if torch.equal(reference(*trial)[0], got[i]):
                break
        else:
            return None
        ties += 1
    return ties


def ties_when_perturbed(perturb: int | None, near_tie=None, unbatched: tuple[int, ...] = ()):
    """A ``SelftestPlan.ties`` rule: ``rounding_ties`` on input ``perturb`` (None: the choice must be exact)."""

    def rule(reference, args: list, got: torch.Tensor) -> int | None:
        return rounding_ties(reference, args, got, perturb, near_tie, unbatched)

    return rule
