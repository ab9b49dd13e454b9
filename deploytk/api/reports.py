"""The Python API's results: typed objects over the data the CLI prints as JSON.

``to_dict()`` is exactly that JSON object (a test holds each command's JSON output to it); ``repr`` is one line of what
matters; a notebook shows the top-level values as a table (``_repr_html_``); ``passed`` where a verdict applies.
"""

from __future__ import annotations

import copy
import html
import json
from collections.abc import Iterator
from typing import Any


class Report:
    """One command's result. ``report["key"]`` reads a value of ``to_dict()``."""

    #: the top-level keys ``repr`` shows, in order (those present)
    summary_keys: tuple[str, ...] = ()

    def __init__(self, data: dict[str, Any]):
        self._data = data

    def to_dict(self) -> dict[str, Any]:
        """What ``deploytk COMMAND`` prints as JSON for the same inputs (a copy: changing it changes nothing here)."""
        return copy.deepcopy(self._data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def keys(self) -> list[str]:
        return list(self._data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Report) and type(other) is type(self) and other._data == self._data

    __hash__ = None  # type: ignore[assignment]

    def _summary(self) -> dict[str, Any]:
        return {k: self._data[k] for k in self.summary_keys if k in self._data}

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={_short(v)}" for k, v in self._summary().items())
        return f"{type(self).__name__}({parts})"

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><th style='text-align:left'>{html.escape(str(k))}</th><td style='text-align:left'>{html.escape(_short(v, 120))}</td></tr>"
            for k, v in self._data.items()
        )
        return f"<table><caption>{type(self).__name__}</caption>{rows}</table>"


def _short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = repr(value) if isinstance(value, str) else text
    return text if len(text) <= width else text[: width - 3] + "..."


class ValidationReport(Report):
    """``validate``: one report per backend (``reports``), the reference run once; ``passed`` when every backend passed."""

    summary_keys = ("passed", "backends")

    @property
    def passed(self) -> bool:
        return bool(self._data["passed"])

    @property
    def reports(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self._data["reports"])

    def _failed_checks(self) -> dict[str, list[str]]:
        """Backend -> the names of the checks its report failed (empty where it passed)."""
        return {r["backend"]: [k for k, ok in r["checks"].items() if not ok] for r in self._data["reports"]}

    def __repr__(self) -> str:
        failed = self._failed_checks()

        def verdict(r: dict[str, Any]) -> str:
            return "passed" if r["passed"] else f"FAILED [{'; '.join(failed[r['backend']])}]"

        each = ", ".join(
            f"{r['backend']}: {verdict(r)} (max |diff| {r['max_abs_diff']:.3g}, cosine {r['cosine_similarity_min']:.6f}"
            + (f", top-1 {r['top1_agreement']:.3f}" if r.get("top1_agreement") is not None else "")
            + (f", flipped choices {r['flipped_choices']}/{r['matching_decisions']}" if r.get("flipped_choices") else "")
            + ")"
            for r in self._data["reports"]
        )
        return f"ValidationReport(passed={self.passed}; {each})"


class ProfileReport(Report):
    """``profile``: the reduced and the dense model timed in one run, per batch size."""

    def speedups(self) -> dict[int, float]:
        """Batch size -> the dense model's median latency over the reduced model's, measured in the same run."""
        return {int(row["batch_size"]): float(row["speedup_vs_dense"]) for row in self._data["results"]}

    def latencies_ms(self) -> dict[int, float]:
        """Batch size -> the reduced model's median latency in milliseconds."""
        return {int(row["batch_size"]): float(row["latency_ms"]["p50"]) for row in self._data["results"]}

    def __repr__(self) -> str:
        speed = ", ".join(f"batch {b}: {self.latencies_ms()[b]:.1f} ms, {s:.2f}x dense" for b, s in self.speedups().items())
        return f"ProfileReport({self._data['method']} on {self._data['device']['backend']}; {speed})"


class InspectReport(Report):
    """``inspect``: the token schedule and GFLOPs per layer and in total."""

    summary_keys = ("model", "method", "r", "gflops", "dense_gflops", "flop_reduction")


class TuneReport(Report):
    """``tune``: the least aggressive schedule within the latency budget; ``passed``: one was found."""

    summary_keys = ("outcome", "budget_ms", "chosen", "output")

    @property
    def passed(self) -> bool:
        return self._data.get("outcome") != "impossible"


class CalibrationReport(Report):
    """``calibrate``: ATM's per-layer schedule from calibration data, written as a config."""

    summary_keys = ("output", "r")


class EvaluationReport(Report):
    """``evaluate``: top-1/top-5 of the dense model, the reference and the exported model on a runtime."""

    summary_keys = ("num_images", "backend")


class VisualizationReport(Report):
    """``visualize``: the PNG written and the tokens left after each drawn block."""

    summary_keys = ("output", "layers", "backend")


class PackageReport(Report):
    """``package``: the Triton model repository entry written."""

    summary_keys = ("model", "runtime", "path")


class BuildReport(Report):
    """``build``: the TensorRT engines and engine.json."""

    summary_keys = ("engine", "baseline_engine")


class MethodsReport(Report):
    """``methods``: every token-reduction method and its options; iterating gives one dict per method."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(copy.deepcopy(self._data["methods"]))

    def names(self) -> list[str]:
        return [m["name"] for m in self._data["methods"]]

    def __repr__(self) -> str:
        return f"MethodsReport({', '.join(self.names())})"


class FamiliesReport(Report):
    """``families``: the model families deploytk runs; iterating gives one dict per family."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(copy.deepcopy(self._data["families"]))

    def names(self) -> list[str]:
        return [f["name"] for f in self._data["families"]]

    def __repr__(self) -> str:
        return f"FamiliesReport({', '.join(self.names())})"


class ConfigsReport(Report):
    """``configs``: the ready-made export configs, by name (what ``export`` takes instead of a YAML path); iterating gives
    one dict per config."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(copy.deepcopy(self._data["configs"]))

    def names(self) -> list[str]:
        return [c["name"] for c in self._data["configs"]]

    def __repr__(self) -> str:
        shown = self.names()
        more = f", ... ({len(shown)} in all)" if len(shown) > 8 else ""
        return f"ConfigsReport({', '.join(shown[:8])}{more})"


class DoctorReport(Report):
    """``doctor``: versions, ONNX Runtime's providers, the GPU, TensorRT, OpenVINO and the pip extras installed."""

    summary_keys = ("python", "gpu", "tensorrt", "openvino")


class CleanReport(Report):
    """``clean``: what killed runs left under ``path``; ``removed``: whether the stale entries were deleted (not a dry run)."""

    summary_keys = ("path", "removed")

    @property
    def entries(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self._data["entries"])

    def __repr__(self) -> str:
        return f"CleanReport(path={self._data['path']!r}, removed={self._data['removed']}, entries={len(self._data['entries'])})"


class SelftestReport(Report):
    """``selftest``: every Triton kernel against its PyTorch reference; ``passed`` when every case passed."""

    @property
    def passed(self) -> bool:
        return bool(self._data["passed"])

    def __repr__(self) -> str:
        failed = sum(not c["passed"] for c in self._data["cases"])
        mode = self._data["environment"].get("mode")
        return f"SelftestReport(passed={self.passed}, cases={len(self._data['cases'])}, failed={failed}, mode={mode!r})"
