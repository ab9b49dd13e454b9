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
