"""`tune`'s search: bisection over candidates ordered least -> most aggressive, with re-measurement at the boundary.

Latency falls as tokens are removed, so the boundary between candidates that miss the budget and those that meet it is
found by bisection: the most aggressive candidate first (its run also times the dense model, which answers "impossible"
and "no reduction needed"), then halving. The two candidates on either side of the boundary are measured again
(refine) and each candidate's latency is the median over its runs; if a re-measurement moves the boundary, the
bisection resumes. ``measure(i)`` adds one run to candidate i; the search never looks at how.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from deploytk.tuning.candidates import Candidate

#: a search stops after this many profile runs even if noise keeps moving the boundary
MAX_MEASUREMENTS = 14


@dataclass
class Search:
    """Bisection over candidates sorted least -> most aggressive; ``measure(i)`` adds a run to candidate i."""

    candidates: list[Candidate]
    budget: float
    measure: Callable[[int], None]
    max_measurements: int = MAX_MEASUREMENTS
    runs: int = 0
    outcome: str = ""
    boundary: tuple[int, int] = (-1, -1)

    def meets(self, i: int) -> bool:
        return self.candidates[i].latency <= self.budget

    def _run(self, i: int) -> bool:
        self.measure(i)
        self.runs += 1
        return self.meets(i)

    def _boundary(self) -> tuple[int, int | None]:
        """(lo, hi): hi the least aggressive measured candidate that meets the budget (None: none does any more), lo the
        nearest measured one before it (it misses; -1: the dense model). Medians over runs, so the refine runs correct a noisy one."""
        measured = [j for j, c in enumerate(self.candidates) if c.latencies]
        hi = min((j for j in measured if self.meets(j)), default=None)
        return max((j for j in measured if hi is None or j < hi), default=-1), hi

    def dense_latency(self) -> float:
        return statistics.median(v for c in self.candidates for v in c.dense_latencies)

    def run(self) -> str:
        """'ok', 'impossible' (the most aggressive misses) or 'dense' (the dense model already meets the budget)."""
        n = len(self.candidates)
        last_meets = self._run(n - 1)
        if self.dense_latency() <= self.budget:
            self.outcome = "dense"
            return self.outcome
        if not last_meets:
            self.outcome = "impossible"
            return self.outcome
        refined: set[int] = set()
        while True:
            lo, hi = self._boundary()
            if hi is None:  # re-measured, even the most aggressive misses
                self.outcome = "impossible"
                return self.outcome
            if hi - lo > 1 and self.runs < self.max_measurements:  # bisect the gap
                self._run((lo + hi) // 2)
                continue
            # refine: one more run of each side of the boundary; medians decide, and a moved boundary is bisected again
            todo = [i for i in (hi, lo) if i >= 0 and i not in refined]
            if not todo or self.runs >= self.max_measurements:
                break
            for i in todo:
                refined.add(i)
                self._run(i)
        self.boundary = (lo, hi)
        self.outcome = "ok"
        return self.outcome

    def measure_the_rest_within(self) -> None:
        """Measure every candidate more aggressive than the boundary that the bisection skipped (``data``: "the most
        accurate within budget" then compares every candidate that meets it, not the few the search happened to visit)."""
        for i in range(self.boundary[1] + 1, len(self.candidates)):
            if not self.candidates[i].latencies:
                self._run(i)
