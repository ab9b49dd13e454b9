"""The tie rule every implementation of a matching op follows, and when one may still choose differently from its
reference: near-ties at float32 rounding level.

The rule, the same in the references, the ONNX bodies and the Triton kernels (``tests/ops/test_generated_inputs.py``
holds the bodies to it on generated inputs):

- a zero-length metric row has cosine 0 to every token: it is divided by 1, not by its zero norm (NaN), and stays
  zero (AST's class and distillation tokens under transformers' own init have zero keys);
- protected rows and columns are masked by replacement with -inf (``Where``, ``masked_fill``, ``tl.where``), never by
  an added -inf bias, through which a NaN would reach a max, argmax or TopK;
- exact ties go to the lower index: ONNX ArgMax's first index, TopK's lower index first (ONNX's rule; OpenVINO's
  backend makes its TopK stable for it), the references' stable sorts and first maxima;
- the bodies and kernels decide in fp32 whatever their input type, on the inputs as given.

An exact tie that a runtime's arithmetic rounds apart is a near-tie like any other (ONNX Runtime's ReduceMean gives two
equal rows different means depending on where they lie in memory).

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
