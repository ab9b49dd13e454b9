"""Per-layer merge schedules: parse the config's r and cap it the way ToMe does."""

from __future__ import annotations

from dataclasses import dataclass


def parse_r(num_layers: int, r: int | list[int] | tuple[int, float]) -> list[int]:
    """Expand an r spec into one r per layer (ToMe's ``parse_r`` semantics).

    int -> constant; list -> per layer, padded with 0; (r, inflection) -> linear ramp from
    int(r * (1 - inflection)) to 2r minus that, so (r, -1) is the paper's decreasing schedule.
    """
    if isinstance(r, list):
        return list(r) + [0] * max(0, num_layers - len(r))
    inflection = 0.0
    if isinstance(r, tuple):
        r, inflection = r
    min_val = int(r * (1.0 - inflection))
    max_val = 2 * r - min_val
    step = (max_val - min_val) / (num_layers - 1) if num_layers > 1 else 0.0
    return [int(min_val + step * i) for i in range(num_layers)]


@dataclass(frozen=True)
class TokenSchedule:
    """The static schedule an export is built for.

    requested_r: r per layer as configured; effective_r: after ToMe's cap
    r = min(r, (tokens - protected) // 2); tokens: tokens entering each block.
    """

    requested_r: list[int]
    effective_r: list[int]
    tokens: list[int]
    protected: int

    @property
    def tokens_out(self) -> int:
        return self.tokens[-1] - self.effective_r[-1]

    def tokens_out_of(self, blocks: int) -> int:
        """Tokens leaving the first ``blocks`` blocks (>= 1), as the schedule books the reductions."""
        return self.tokens[blocks - 1] - self.effective_r[blocks - 1]

    @property
    def capped(self) -> bool:
        return self.requested_r != self.effective_r


def cap_schedule(requested: list[int], num_tokens: int, protected: int) -> TokenSchedule:
    """Apply ToMe's per-layer cap; r <= 0 means the layer does not merge."""
    tokens, effective = [], []
    t = num_tokens
    for r in requested:
        tokens.append(t)
        r_eff = max(0, min(r, (t - protected) // 2))
        effective.append(r_eff)
        t -= r_eff
    return TokenSchedule(list(requested), effective, tokens, protected)
