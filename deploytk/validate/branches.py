"""Tell a near-tie branch flip apart from a wrong result.

Matching and selection ops (MctfMatch, TopKSelect, ...) make discrete choices. When two
candidates' scores agree to float32 rounding, a backend and PyTorch may legitimately choose
differently (ONNX Runtime's own fused and unfused graphs do), and from then on the logits differ
by far more than any rounding tolerance. For each image that fails the comparison this module
asks the backend for its choices (the ``dest`` output of every matching node) and the inputs
of those nodes, replays the reference with the backend's choices, and accepts the image as a
*branch flip* only if all of these hold:

1. every matching call where the backend chose otherwise than the op does on the replayed
   reference's inputs (the reference's own inputs up to the first such call; after it, what the
   reference computes along the backend's choices) was made on inputs that agree with those
   within the tolerance (so the candidates were tied to rounding);
2. at each such call the PyTorch op makes the backend's choice, either from the backend's own
   inputs there or from the reference's inputs perturbed at float32 rounding level (relative
   1e-6, a few seeded trials), or the op's own near-tie proof accepts it (``OpSpec.near_tie``,
   computed in float64 from the reference's inputs for that image: ATSSample's picks within a
   few ulps of the nearest CDF value; PiToMeMatch's energy order; ToMeMatch's matching, every
   merged token's partner within 1e-5 of its best score, the merged tokens' scores above the
   unmerged ones' and the unmerged order descending, each up to 1e-5). Random perturbations
   cannot show a tie that needs many coordinated swaps: VideoMAE's 1,568 tokens without a class
   token keep ~700 unmerged tokens in descending-score order, and flat image regions tie many
   of them, so a runtime's order is a valid ToMe order that no perturbation reproduces whole.
   A proof still refuses a wrong choice: a token merged into a partner scoring more than the
   tie tolerance below its best, a wrong output slot, a protected token merged;
3. the reference, replayed with every choice the backend made, matches the backend's logits
   within the tolerance (so everything else is computed the same way).

Each call's differing tokens are counted (``BranchFlip.choices_flipped``): the validator bounds
their share of all matching decisions (one per token per matching call per image), so a long
video and a 197-token image are held to the same rate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from deploytk.exporter.probes import Probe
from deploytk.ops import spec_for
from deploytk.ops.ties import PERTURBATION_TRIALS, ROUNDING_PERTURBATION


@dataclass
class BranchFlip:
    image: int
    op: str  # the first call where the backend chose otherwise
    call: int  # index of that matching op in execution order
    tokens_changed: int  # tokens whose destination differs at that op
    input_rel_diff: float  # max |backend - reference| of the op's inputs / max |reference|
    op_reproduces_backend: bool
    replay_max_abs_diff: float
    explained: bool
    #: matching decisions (one per token per call) that differ from the op's own choice on the reference replayed along
    #: the backend's choices, over every call: what ``max_flipped_choices`` bounds
    choices_flipped: int = 0
    #: the calls with such a difference, and the first of them that is not a proven near-tie (None: all proven)
    calls_flipped: int = 0
    first_unproven_call: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class _Choices:
    """A ``MergedViT.dest_hook`` that records the reference's choices, or replays given ones."""

    def __init__(self, replay: list[np.ndarray] | None = None):
        self.calls: list[tuple[str, tuple, torch.Tensor]] = []
        self.replay = replay

    def __call__(self, op_name, args, dest):
        k = len(self.calls)
        self.calls.append((op_name, args, dest))
        return dest if self.replay is None else torch.from_numpy(self.replay[k]).to(dest.dtype)


def _run_reference(reference, batch: np.ndarray, replay=None):
    hook = _Choices(replay)
    reference.dest_hook = hook
    try:
        with torch.no_grad():
            out = reference(torch.from_numpy(np.ascontiguousarray(batch)))
        logits = (out[0] if isinstance(out, tuple) else out).numpy()  # the first output: the one validate judges
    finally:
        reference.dest_hook = None
    return logits, hook.calls


def _rel_diff(ref: np.ndarray, out: np.ndarray) -> float:
    return float(np.abs(out.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))


def explain_flips(
    reference,
    probes: list[Probe],
    batches: list[np.ndarray],
    backend_outputs: list[dict],
    failing: list[int],
    atol: float,
    rtol: float,
    output: str = "logits",
) -> tuple[list[BranchFlip], dict[int, np.ndarray]]:
    """Diagnose the failing images (global indices over ``batches``).

    ``backend_outputs[b]`` holds the backend's outputs for batch b, probes included. Returns
    one ``BranchFlip`` per failing image (``explained``: a near-tie flip) and, for explained
    images, the reference logits replayed with the backend's choices.
    """
    starts = np.cumsum([0] + [len(b) for b in batches])
    flips, replayed = [], {}
    for b, (batch, values) in enumerate(zip(batches, backend_outputs, strict=True)):
        rows = [i - starts[b] for i in failing if starts[b] <= i < starts[b + 1]]
        if not rows:
            continue
        # the replay's calls: the op's own choice on the reference's inputs along the backend's choices (up to the first
        # different choice, the reference's own inputs), then the backend's choice put in its place
        replay_logits, replay_calls = _run_reference(reference, batch, [values[p.dest] for p in probes])
        if len(replay_calls) != len(probes):
            raise RuntimeError(f"the reference made {len(replay_calls)} matching calls, the ONNX graph has {len(probes)}")
        for j in rows:
            flips.append(_diagnose(int(starts[b] + j), j, probes, replay_calls, values[output], values, replay_logits[j], atol, rtol))
            if flips[-1].explained:
                replayed[flips[-1].image] = replay_logits[j]
    return flips, replayed


def _diagnose(image, j, probes, replay_calls, backend_output, values, replay_row, atol, rtol) -> BranchFlip:
    backend_logits = backend_output[j]
    replay_diff = float(np.abs(backend_logits.astype(np.float64) - replay_row).max())
    within = replay_diff <= atol or replay_diff <= rtol * float(np.abs(replay_row).max())
    first, flipped, calls, unproven = None, 0, 0, None
    for k, (probe, (op_name, args, own_dest)) in enumerate(zip(probes, replay_calls, strict=True)):
        backend_dest = values[probe.dest][j]
        differ = int((backend_dest != own_dest[j].numpy()).sum())
        if not differ:
            continue
        spec = spec_for(op_name)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        # one image of each batched input; an input without a batch dimension (ATSSample's steps) whole
        batched = [layout.batched for layout in spec.inputs]
        rows = [t[j : j + 1] if b else t for t, b in zip(tensors, batched, strict=True)]
        backend_inputs = [values[n][j : j + 1] if b else values[n] for n, b in zip(probe.inputs, batched, strict=True)]
        input_rel = max(_input_rel_diff(t.numpy(), x, layout) for t, x, layout in zip(rows, backend_inputs, spec.inputs, strict=True))
        reproduces = _reproduces(spec, args, rows, backend_inputs, backend_dest)
        if first is None:
            first = (probe.op, k, differ, input_rel, reproduces)
        flipped, calls = flipped + differ, calls + 1
        if unproven is None and not (reproduces and input_rel <= rtol):
            unproven = k
    if first is None:  # same choices everywhere: the difference is not a branch flip
        return BranchFlip(image, "", -1, 0, 0.0, True, replay_diff, explained=False)
    return BranchFlip(
        image,
        *first,
        replay_diff,
        explained=unproven is None and within,
        choices_flipped=flipped,
        calls_flipped=calls,
        first_unproven_call=unproven,
    )


def _input_rel_diff(ref: np.ndarray, out: np.ndarray, layout) -> float:
    """How far the backend's op input is from the reference's; a distance is compared squared (``Tensor.distance``)."""
    ref, out = ref.astype(np.float64), out.astype(np.float64)
    return _rel_diff(ref**2, out**2) if layout.distance else _rel_diff(ref, out)


def _reproduces(spec, args, rows, backend_inputs, backend_dest) -> bool:
    """Does the torch op make the backend's choice from its inputs, from rounding-perturbed reference inputs
    (``rows``: the reference's inputs for this image), or by the op's own near-tie proof?"""
    op = spec.torch_op

    def call(tensors):
        it = iter(tensors)
        return [next(it) if isinstance(a, torch.Tensor) else a for a in args]

    def choose(tensors) -> bool:
        return bool(np.array_equal(op(*call(tensors))[0].numpy(), backend_dest))

    if choose(torch.from_numpy(np.ascontiguousarray(x)) for x in backend_inputs):
        return True
    if spec.near_tie is not None and spec.near_tie(*call(rows), torch.from_numpy(backend_dest[None])):
        return True
    gen = torch.Generator().manual_seed(0)
    for _ in range(PERTURBATION_TRIALS):
        if choose(t * (1 + ROUNDING_PERTURBATION * torch.randn(t.shape, generator=gen)) if t.is_floating_point() else t for t in rows):
            return True
    return False


def choices_reproduced(reference, probes: list[Probe], batches: list[np.ndarray], backend_outputs: list[dict]) -> dict:
    """Is every choice the backend made the op's own choice on the inputs the backend fed it?

    An int8 graph moves the metric and the scores (they are computed from int8 projections), so its choices differ from
    the fp32 reference's on most images, and that is no error; a choice the PyTorch op does not make from the backend's
    own inputs (nor from them perturbed at float32 rounding, nor by the op's near-tie proof) means the choice itself was
    computed wrongly: a quantized similarity or score inside the op. Returns how many images chose differently from the
    reference and the choices not reproduced (image, op, call, tokens that differ).
    """
    changed, unreproduced, start = set(), [], 0
    for batch, values in zip(batches, backend_outputs, strict=True):
        _, ref_calls = _run_reference(reference, batch)
        if len(ref_calls) != len(probes):
            raise RuntimeError(f"the reference made {len(ref_calls)} matching calls, the ONNX graph has {len(probes)}")
        for k, (probe, (op_name, args, ref_dest)) in enumerate(zip(probes, ref_calls, strict=True)):
            spec = spec_for(op_name)
            backend_dest = values[probe.dest]
            tensors = [torch.from_numpy(np.ascontiguousarray(values[n])) for n in probe.inputs]
            it = iter(tensors)
            own = spec.torch_op(*[next(it) if isinstance(a, torch.Tensor) else a for a in args]).numpy()
            batched = [layout.batched for layout in spec.inputs]
            for j in range(len(batch)):
                if not np.array_equal(backend_dest[j], ref_dest[j].numpy()):
                    changed.add(start + j)
                if np.array_equal(own[j], backend_dest[j]):
                    continue
                rows = [values[n][j : j + 1] if b else values[n] for n, b in zip(probe.inputs, batched, strict=True)]
                row_args = [torch.from_numpy(np.ascontiguousarray(r)) for r in rows]
                if not _reproduces(spec, args, row_args, rows, backend_dest[j]):
                    unreproduced.append(
                        {"image": start + j, "op": probe.op, "call": k, "tokens_differing": int((own[j] != backend_dest[j]).sum())}
                    )
        start += len(batch)
    return {"images_with_other_choices": len(changed), "unreproduced": unreproduced}
