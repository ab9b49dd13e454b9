"""What one `deploytk quantize` runtime (`backend=NAME`) is: its tool, its settings, and how it writes the int8 model and the
int8 dense baseline into the new artifact's folder. A new runtime's int8 is one ``Quantizer`` in its own file."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np

from deploytk.exporter.artifacts import Artifact


class Quantizer(ABC):
    #: what `backend=` takes
    name: str = ""
    #: the backend (`backend=`) that validates, profiles and evaluates what it writes
    backend: str = ""
    #: the rules it quantizes by, as the manifest records them
    settings: dict = {}

    def require(self) -> None:  # noqa: B027 (most need nothing beyond deploytk's own dependencies)
        """Refuse, before any work, when the tool is not installed."""

    def check(self, source: Artifact) -> None:  # noqa: B027 (most take every export)
        """Refuse, before any work, an export this tool cannot quantize."""

    @abstractmethod
    def tool(self) -> str:
        """The tool and its version, for the manifest."""

    @abstractmethod
    def quantize(self, source: Artifact, dense: Path, folder: Path, batches: list[np.ndarray], keep_choices_fp32: bool = True) -> dict:
        """Write the int8 model of ``source`` and of its dense baseline ONNX ``dense`` into ``folder`` (with its .baseline/);
        return what was quantized (``quantized_ops``) and, under ``manifest``, entries for the manifest."""
