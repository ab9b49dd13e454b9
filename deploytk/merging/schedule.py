"""Per-layer merge schedules: parse the config's r and cap it the way ToMe does."""

from __future__ import annotations

from dataclasses import dataclass

from deploytk.errors import DeploytkError


def parse_r(num_layers: int, r: int | list[int] | tuple[int, float], model: str = "the model") -> list[int]:
    """Expand an r spec into one r per layer (ToMe's ``parse_r`` semantics).

    int -> constant; list -> one r per layer, exactly ``num_layers`` of them; (r, inflection) -> linear ramp from
    int(r * (1 - inflection)) to 2r minus that, so (r, -1) is the paper's decreasing schedule.

    A list of another length is refused (ToMe pads a short one with 0 and ignores extra entries): an export would
    silently drop the extra entries while its manifest and ``inspect`` counted them, and a short list is as likely a
    schedule written for another model. This is the one place the r list meets the model's depth, for every command.
    """
    if isinstance(r, list):
        if len(r) != num_layers:
            raise DeploytkError(
                f"`merge.r` lists {len(r)} values, one per block, but {model} has {num_layers} blocks; "
                f"a per-block r list must have exactly {num_layers}.",
                hint=f"Write {num_layers} values (0 for a block that does not reduce), or one int for every block.",
            )
        return list(r)
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
