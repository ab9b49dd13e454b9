"""How library code reports progress: through a ``Progress`` it is handed, never by drawing itself.

The CLI passes one that draws on stderr: a counter ``done/total`` where the work's size is known (``start``), a spinner
where it is not (``step``); tests, scripts and benchmarks use the silent default. Count what the user would count
(images validated, runs timed), so the total printed is a number they recognise.
"""

from __future__ import annotations


class Progress:
    """Silent by default; the CLI overrides the three calls."""

    def step(self, message: str) -> None:
        """A new phase of unknown length (``exporting to ONNX``): a spinner, no count."""

    def start(self, total: int, message: str) -> None:
        """A phase of ``total`` equal units follows (``evaluating 450 images``)."""

    def advance(self, units: int = 1) -> None:
        """``units`` of the current phase are done (a batch of 8 images: 8)."""


SILENT = Progress()
