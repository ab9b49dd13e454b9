"""Eager reference of ``PiToMeMatch``: PiToMe's energy-ordered matching (Tran et al., NeurIPS 2024).

It follows the official ``pitome_vision`` (hchautran/PiToMe ``algo/pitome/merge.py``, read at 550b5de) and
generalises its class token to the first ``protected`` tokens (class, distillation, registers), which never merge
and keep the first slots. On the other (patch) tokens, cosine-normalised:

- energy_i = mean_j elu(cos(i, j) - margin, alpha): high for a token with many close neighbours (redundant);
- the tokens are ordered by descending energy; in that order A = positions 0, 2, 4, ..., B = 1, 3, 5, ...;
- ``protect = 0`` (the official ``pitome_bsm``, its first half of the blocks): A and B span every token and ToMe's
  bipartite matching merges the r A tokens best matched into a B token; the unmerged A tokens keep the order of
  their best score (descending), as the official code leaves them;
- ``protect = 1`` (the official ``pitome``): only the 2r highest-energy tokens are matched, every A token of them
  merging into its most similar B token; the others, the informative ones, are protected and keep energy order.

Output order (after the prefix): unmerged A tokens, protected tokens, B tokens -- the official ``merge``'s
``cat([cls, unm, dst])`` and ``cat([cls, protected, dst])``. Ties resolve to the lower index (stable sorts, the
first maximum), where the official code's unstable ``argsort`` leaves them unspecified.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from deploytk.ops.reference_common import inverse_rank, unit_rows


def energy_order(metric: torch.Tensor, protected: int, margin: float, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(cosines of the patch tokens [B, T, T], patch indices by descending energy [B, T])."""
    m = unit_rows(metric[:, protected:])
    sim = m @ m.transpose(1, 2)
    energy = F.elu(sim - margin, alpha).mean(dim=-1)
    return sim, energy.argsort(dim=-1, descending=True, stable=True)


def matched_span(tokens: int, r: int, protect: bool) -> int:
    """How many leading tokens of the energy order are matched: all of them, or the 2r of highest energy."""
    return 2 * r if protect else tokens


def pitome_dest(metric: torch.Tensor, r: int, protected: int, margin: float, alpha: float, protect: bool) -> torch.Tensor:
    """dest [B, N]: the output slot of every token (``token_aggregate(x, size, dest, N - r, True)`` is ``merge_wavg``)."""
    batch, n, _ = metric.shape
    t = n - protected
    sim, order = energy_order(metric, protected, margin, alpha)
    span = matched_span(t, r, protect)
    a_tok, b_tok = order[:, 0:span:2], order[:, 1:span:2]
    na, nb = a_tok.shape[1], b_tok.shape[1]
    scores = sim.gather(1, a_tok[..., None].expand(-1, -1, t)).gather(2, b_tok[:, None, :].expand(-1, na, -1))
    node_max, node_idx = scores.max(dim=-1)
    rank = inverse_rank(node_max.argsort(dim=-1, descending=True, stable=True))  # 0..r-1: the merged A tokens
    n_unm, rest = na - r, t - span
    dev = metric.device
    b_slot = protected + n_unm + rest + torch.arange(nb, device=dev)
    slot_of_position = torch.empty(batch, t, dtype=torch.long, device=dev)
    slot_of_position[:, 0:span:2] = torch.where(rank < r, b_slot[node_idx], protected + rank - r)
    slot_of_position[:, 1:span:2] = b_slot.expand(batch, -1)
    slot_of_position[:, span:] = protected + n_unm + torch.arange(rest, device=dev)
    patch_dest = torch.empty_like(slot_of_position).scatter_(1, order, slot_of_position)
    return torch.cat([torch.arange(protected, device=dev).expand(batch, -1), patch_dest], dim=1)


#: how far apart two energies or two matching scores may be and still be ordered either way by a correct implementation
#: (float32 rounding of inputs that already differ by ~1e-6 relative, through a mean over the tokens)
NEAR_TIE = 1e-5


def pitome_near_tie(
    metric: torch.Tensor, r: int, protected: int, margin: float, alpha: float, protect: bool, dest: torch.Tensor, tol: float = NEAR_TIE
) -> bool:
    """Whether ``dest`` [1, N] is PiToMe's choice on ``metric`` [1, N, D] once near-tied energies and scores (within
    ``tol``, in float64) may go either way.

    Random perturbations rarely reproduce such a choice: tokens of near-equal energy are many where the keys are nearly
    orthogonal (random weights), and one swap in the energy order moves a token between A and B and changes every
    match after it. So the proof rebuilds an order from ``dest`` and checks it: each output slot of B holds exactly one
    token at that B position (the member whose energy fits it best), the protected tokens' slots give their positions,
    and the A tokens fill the even positions by energy; that order must be descending up to ``tol``, and given it every
    merged A token must go to a B token within ``tol`` of its best, the r merged ones must be best matched up to
    ``tol``, and the unmerged ones must keep ToMe's order (descending best score) up to ``tol``.
    """
    got = dest[0].tolist()
    n = len(got)
    if got[:protected] != list(range(protected)):
        return False
    m = unit_rows(metric[0, protected:].double())
    sim = m @ m.T
    energy = F.elu(sim - margin, alpha).mean(dim=-1)
    t = n - protected
    span = matched_span(t, r, protect)
    na, nb = (span + 1) // 2, span // 2
    n_unm, rest = na - r, t - span
    b_base = n_unm + rest
    slot = [d - protected for d in got[protected:]]
    if any(not 0 <= s < n - r - protected for s in slot):
        return False
    by_energy = sorted(range(t), key=lambda i: -float(energy[i]))
    position: dict[int, int] = {}
    for i, s in enumerate(slot):  # the protected rest: slot -> position
        if n_unm <= s < b_base:
            position[i] = span + s - n_unm
    groups: dict[int, list[int]] = {}
    for i, s in enumerate(slot):
        if s >= b_base:
            groups.setdefault(s - b_base, []).append(i)
    if sorted(groups) != list(range(nb)):
        return False
    for v, members in groups.items():  # the B token of each slot: the member whose energy fits position 2v + 1 best
        expected = float(energy[by_energy[2 * v + 1]])
        position[min(members, key=lambda i: abs(float(energy[i]) - expected))] = 2 * v + 1
    a_tokens = [i for i in by_energy if i not in position]
    if len(a_tokens) != na or sorted(position.values()) != sorted(set(range(t)) - set(range(0, span, 2))):
        return False
    position.update(zip(a_tokens, range(0, span, 2), strict=True))
    order = sorted(range(t), key=position.get)
    e = energy[order]
    later_max = torch.cummax(e.flip(0), 0).values.flip(0)  # the highest energy at or after each position
    if t > 1 and float((later_max[1:] - e[:-1]).max()) > tol:
        return False  # a later token's energy exceeds an earlier one's by more than tol
    b_tok = [order[p] for p in range(1, span, 2)]
    scores = sim[a_tokens][:, b_tok]
    best = scores.max(dim=-1).values
    merged, unmerged = [], {}
    for k, a in enumerate(a_tokens):
        s = slot[a]
        if s >= b_base:
            if scores[k, s - b_base] < best[k] - tol:
                return False
            merged.append(k)
        elif s in unmerged:
            return False
        else:
            unmerged[s] = k
    if len(merged) != r or sorted(unmerged) != list(range(n_unm)):
        return False
    kept = [unmerged[s] for s in range(n_unm)]
    if kept and merged and max(float(best[k]) for k in kept) > min(float(best[k]) for k in merged) + tol:
        return False
    return all(best[x] >= best[y] - tol for x, y in zip(kept, kept[1:], strict=False))
