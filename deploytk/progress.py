"""How library code reports progress: through a ``Progress`` it is handed, never by drawing itself.

The CLI passes one that draws a spinner or a bar on stderr; tests, scripts and benchmarks
use the silent default.
"""

from __future__ import annotations


class Progress:
    """Silent by default; the CLI overrides the three calls."""

    def step(self, message: str) -> None:
        """A new phase of the work (``exporting to ONNX``)."""

    def start(self, total: int, message: str) -> None:
        """A phase of ``total`` equal units follows (``evaluating 450 images``)."""

    def advance(self) -> None:
        """One unit of the current phase is done."""


SILENT = Progress()
