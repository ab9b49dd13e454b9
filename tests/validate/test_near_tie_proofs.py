"""Near-tie proofs in validate (issue 53): a matching op's choice that is its algorithm's own up to float32-rounding ties
of its scores is accepted even where no random perturbation reproduces it, and a wrong choice is still refused.

ToMeMatch without protected tokens (VideoMAE: no class token) keeps its unmerged tokens in descending-score order, so in
flat image regions many of them tie, and a runtime summing in another order keeps a valid order that 32 seeded
perturbations never reproduce whole. The metrics here are made to tie: groups of near-duplicate tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from deploytk.ops import OPS
from deploytk.ops.reference_common import protected_split
from deploytk.ops.tome_match.reference import tome_dest, tome_slots
from deploytk.validate.branches import _reproduces

TOME = OPS["ToMeMatch"]


def tied_metric(groups: int = 24, per_group: int = 6, nb: int = 40, dim: int = 16, spread: float = 1e-7, seed: int = 0) -> torch.Tensor:
    """[1, N, dim]: A tokens (even positions) in ``groups`` of near-duplicates (relative ``spread`` apart, so their best
    scores agree to rounding), B tokens (odd positions) random; N = 2 * groups * per_group."""
    gen = torch.Generator().manual_seed(seed)
    na = groups * per_group
    base = torch.randn(groups, dim, generator=gen, dtype=torch.float64).repeat_interleave(per_group, 0)
    a = base * (1 + spread * torch.randn(na, dim, generator=gen, dtype=torch.float64))
    b = torch.randn(na, dim, generator=gen, dtype=torch.float64)
    b[nb:] = b[:nb][torch.arange(na - nb) % nb] * 0.5 + torch.randn(na - nb, dim, generator=gen, dtype=torch.float64)
    metric = torch.empty(1, 2 * na, dim, dtype=torch.float64)
    metric[0, ::2], metric[0, 1::2] = a, b
    return metric.float()


def scores(metric: torch.Tensor, protected: int = 0) -> torch.Tensor:
    """ToMe's scores [Na, Nb] in float64, protected rows and columns -inf."""
    m = metric[0].double() / metric[0].double().norm(dim=-1, keepdim=True)
    s = m[::2] @ m[1::2].T
    pa, pb = protected_split(protected)
    s[:pa], s[:, :pb] = -float("inf"), -float("inf")
    return s


def unmerged_in_order(dest: torch.Tensor, metric: torch.Tensor, r: int, protected: int) -> list[int]:
    """The unmerged A tokens (indices into A) in their output order."""
    n = metric.shape[1]
    unm_slot, _ = tome_slots((n + 1) // 2, n // 2, r, protected)
    k_of_slot = {s: k for k, s in enumerate(unm_slot)}
    da = dest[0, ::2].tolist()
    return sorted((a for a in range(len(da)) if da[a] in k_of_slot), key=lambda a: k_of_slot[da[a]])


def swapped(dest: torch.Tensor, pairs: list[tuple[int, int]]) -> torch.Tensor:
    """``dest`` with the slots of each pair of A tokens exchanged."""
    got = dest.clone()
    for x, y in pairs:
        got[0, 2 * x], got[0, 2 * y] = dest[0, 2 * y], dest[0, 2 * x]
    return got


def accepted(metric, r, protected, sort_unmerged, got) -> bool:
    """What validate decides for this choice at a ToMeMatch call whose inputs equal the reference's."""
    args = [metric, r, protected, sort_unmerged]
    return _reproduces(TOME, args, [metric], [metric.numpy()], got[0].numpy())


def tied_order(metric: torch.Tensor, r: int) -> tuple[torch.Tensor, list[tuple[int, int]], torch.Tensor]:
    """The reference's dest, and that dest with every other adjacent pair of tied unmerged tokens swapped."""
    want = tome_dest(metric, r, 0, False)
    best = scores(metric).max(-1).values
    order = unmerged_in_order(want, metric, r, 0)
    pairs = [(x, y) for x, y in zip(order[::2], order[1::2], strict=False) if abs(best[x] - best[y]) < 1e-6]
    return want, pairs, swapped(want, pairs)


def test_tome_has_a_near_tie_proof_like_every_op_whose_selftest_proves_ties():
    """ToMe's selftest judges its kernel by a proof (tome_near_ties), ATS's and PiToMe's by theirs: validate uses each."""
    for name in ("ToMeMatch", "ATSSample", "PiToMeMatch"):
        assert OPS[name].near_tie is not None, name


def test_a_valid_tome_order_no_perturbation_reproduces_is_accepted_as_a_near_tie():
    metric = tied_metric()
    r = 40
    want, pairs, got = tied_order(metric, r)
    assert len(pairs) >= 20 and not torch.equal(got, want)  # 20+ independent ties: 32 random trials reproduce none whole
    assert not torch.equal(TOME.torch_op(metric, r, 0, False), got)
    assert accepted(metric, r, 0, False, got)


def test_an_unmerged_order_off_by_more_than_the_tie_tolerance_is_refused():
    """Two unmerged tokens from different groups (scores 1e-3 or more apart) swapped: a wrong slot."""
    metric = tied_metric()
    r = 40
    want = tome_dest(metric, r, 0, False)
    best = scores(metric).max(-1).values
    order = unmerged_in_order(want, metric, r, 0)
    x, y = next((x, y) for x, y in zip(order, order[1:], strict=False) if best[x] - best[y] > 1e-3)
    _, pairs, tied = tied_order(metric, r)
    assert not accepted(metric, r, 0, False, swapped(want, [(x, y)]))
    assert not accepted(metric, r, 0, False, swapped(tied, [(x, y)]))  # ties elsewhere do not excuse it


def test_a_token_merged_into_a_partner_below_its_best_is_refused():
    metric = tied_metric()
    r = 40
    want = tome_dest(metric, r, 0, False)
    s = scores(metric)
    n = metric.shape[1]
    _, b_slot = tome_slots((n + 1) // 2, n // 2, r, 0)
    src = [a for a in range(s.shape[0]) if int(want[0, 2 * a]) in b_slot]
    a = src[0]
    worse = int(torch.argmin(s[a]))  # its worst partner, far below its best
    assert s[a].max() - s[a, worse] > 1e-2
    got = want.clone()
    got[0, 2 * a] = b_slot[worse]
    assert not accepted(metric, r, 0, False, got)


def test_a_merged_token_kept_and_an_unmerged_one_merged_across_a_clear_gap_is_refused():
    """The r best-matched tokens merge: exchanging a merged one with an unmerged one scoring 1e-3 lower is an error."""
    metric = tied_metric()
    r = 40
    want = tome_dest(metric, r, 0, False)
    best = scores(metric).max(-1).values
    order = unmerged_in_order(want, metric, r, 0)
    n = metric.shape[1]
    _, b_slot = tome_slots((n + 1) // 2, n // 2, r, 0)
    src = [a for a in range(len(best)) if int(want[0, 2 * a]) in b_slot]
    a = min(src, key=lambda i: best[i])
    u = next(u for u in order if best[a] - best[u] > 1e-3)
    got = want.clone()
    got[0, 2 * u] = b_slot[int(scores(metric)[u].argmax())]  # u merged into its own best partner
    got[0, 2 * a] = want[0, 2 * u]  # a takes u's unmerged slot
    assert not accepted(metric, r, 0, False, got)


@pytest.mark.parametrize("protected", [1, 2])
def test_a_protected_token_merged_or_merged_into_is_refused(protected):
    """With a class token (ToMe then keeps the unmerged tokens in index order): the class token (A0) may not merge, a
    protected B token (protected=2: B0) may not take a merge, however tied the scores are."""
    metric = tied_metric()
    metric[0, 0] = metric[0, 2]  # the class token is a copy of a tied token: its score would tie if it were not protected
    r = 40
    want = tome_dest(metric, r, protected, True)
    n = metric.shape[1]
    unm_slot, b_slot = tome_slots((n + 1) // 2, n // 2, r, protected)
    src = [a for a in range(n // 2) if int(want[0, 2 * a]) in b_slot[protected // 2 :]]
    if protected == 1:
        got = swapped(want, [(0, src[0])])  # the class token merged, a source kept in the class token's slot
    else:
        got = want.clone()
        got[0, 2 * src[0]] = b_slot[0]  # a source merged into the protected B0
    assert not torch.equal(got, want)
    assert not accepted(metric, r, protected, True, got)


def test_the_proof_answers_where_every_unprotected_token_merges():
    """r = Na - protected A tokens: no unprotected token stays unmerged (ToMe's cap). A tied partner swap is accepted and
    no exception escapes (the proof took the max of an empty list there)."""
    gen = torch.Generator().manual_seed(1)
    b = torch.randn(4, 8, generator=gen)
    b[3] = b[2]  # two identical B tokens: a source matched to either ties exactly
    a = torch.randn(5, 8, generator=gen)
    a[4] = b[2] * 2 + 1e-3 * torch.randn(8, generator=gen)
    metric = torch.empty(1, 9, 8)
    metric[0, ::2], metric[0, 1::2] = a, b
    want = tome_dest(metric, 4, 1, True)
    _, b_slot = tome_slots(5, 4, 4, 1)
    got = want.clone()
    got[0, 8] = b_slot[3] if int(want[0, 8]) == b_slot[2] else b_slot[2]
    assert not torch.equal(got, want)
    assert TOME.near_tie(metric, 4, 1, True, got) is True


def test_an_order_that_drifts_by_more_than_the_tolerance_across_ties_is_refused():
    """Each neighbour within the tolerance is not enough: three unmerged tokens whose best scores are 0.75e-5 apart,
    kept in ascending order, put the first 1.5e-5 (more than the tolerance) below the last."""
    cosines = [0.9, 0.9 + 0.75e-5, 0.9 + 1.5e-5]
    a = torch.tensor([[c, (1 - c * c) ** 0.5, 0.0] for c in cosines], dtype=torch.float64)
    b = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    metric = torch.empty(1, 6, 3, dtype=torch.float64)
    metric[0, ::2], metric[0, 1::2] = a, b
    metric = metric.float()
    want = tome_dest(metric, 0, 0, False)  # r=0: only the order counts
    assert unmerged_in_order(want, metric, 0, 0) == [2, 1, 0]
    ascending = swapped(want, [(0, 2)])
    assert unmerged_in_order(ascending, metric, 0, 0) == [0, 1, 2]
    assert not TOME.near_tie(metric, 0, 0, False, ascending)
    assert TOME.near_tie(metric, 0, 0, False, swapped(want, [(0, 1)]))  # one neighbour swapped: within the tolerance


def test_a_wrong_choice_after_a_proven_flip_is_refused(exported, tmp_path):
    """The fp16 MCTF digits ViT on noise images flips near-ties naturally (about a third of them, each proven); its last
    MctfMatch is tampered to match for real (tau_sim 0.02). An image that flipped at a tie before that call was called
    explained when only the first different call was proven: the replay took the wrong choice along."""
    import json
    import shutil

    import onnx

    from deploytk.data import synthetic_batches
    from deploytk.exporter.artifacts import write_manifest
    from deploytk.exporter.manifest import sha256_file
    from deploytk.validate.validator import FLIPS_CHECK, Tolerances, validate

    from helpers import DIGITS_INPUT

    bad = Path(shutil.copytree(exported("digits_vit_mctf_r4", precision="fp16"), tmp_path / "bad"))
    model = onnx.load(str(bad / "model.onnx"))
    last = [n for n in model.graph.node if n.op_type == "MctfMatch"][-1]
    next(a for a in last.attribute if a.name == "tau_sim").f = 0.02
    onnx.save(model, str(bad / "model.onnx"))
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["onnx"]["sha256"] = sha256_file(bad / "model.onnx")
    write_manifest(bad, manifest)  # sealed again: the edit is what is tested

    report = validate(bad, "ort", synthetic_batches(16, 8, DIGITS_INPUT), Tolerances.for_precision("fp16"))
    flips = report.branch_flips
    assert flips and not report.passed and not report.checks[FLIPS_CHECK]
    assert not any(f["explained"] for f in flips)
    # an image that flipped at a proven tie before the tampered call is refused there, at the call that is wrong
    assert any(f["call"] < f["first_unproven_call"] for f in flips)


def test_rounding_perturbation_proves_a_choice_at_an_exact_tie_and_nothing_else():
    """An op with no near-tie proof of its own (a stand-in: argmax, lower index on ties): the backend's other choice at
    an exact tie is reproduced by perturbing the reference's inputs by rounding; a choice a real margin away is not."""
    from types import SimpleNamespace

    import numpy as np

    spec = SimpleNamespace(torch_op=lambda scores: (torch.argmax(scores, dim=-1),), near_tie=None)
    args = [torch.zeros(1, 2)]  # the tensor arguments are replaced in order by the inputs tried
    tie, apart = torch.tensor([[1.0, 1.0]]), torch.tensor([[1.0, 1.1]])
    assert _reproduces(spec, args, [tie], [tie.numpy()], np.array([1]))  # the op's own rule takes 0; perturbed, 1 too
    assert not _reproduces(spec, args, [apart], [apart.numpy()], np.array([0]))


def test_batches_without_a_failing_image_are_not_replayed():
    """Only a batch with a failing image replays the reference: with none, nothing is run (the reference is None)."""
    import numpy as np

    from deploytk.validate.branches import explain_flips

    batches = [np.zeros((2, 3, 8, 8), np.float32), np.zeros((2, 3, 8, 8), np.float32)]
    assert explain_flips(None, [], batches, [{}, {}], [], 1e-4, 1e-4) == ([], {})
