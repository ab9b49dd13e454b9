"""deploytk: deploy token-reducing Vision Transformers to ONNX Runtime, OpenVINO, TensorRT and Triton.

The Python API (``deploytk.export``, ``deploytk.load``, ``deploytk.patch``, ...) lives in ``deploytk.api`` and is
loaded on first use: ``import deploytk`` stays light (no torch), so the CLI's help answers at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:  # what type checkers see; at run time ``__getattr__`` loads them
    from deploytk.api import (
        Artifact,
        BuildReport,
        CalibrationReport,
        CleanReport,
        ConfigsReport,
        DeployConfig,
        DeploytkError,
        DeploytkNotice,
        DoctorReport,
        EvaluationReport,
        ExportNotice,
        FamiliesReport,
        InputKind,
        InspectReport,
        MergedViT,
        MethodsReport,
        ModelLike,
        NotRebuildableWarning,
        PackageReport,
        ProfileReport,
        Progress,
        Report,
        Runner,
        SelftestReport,
        TuneReport,
        ValidationReport,
        VisualizationReport,
        calibrate,
        clean,
        configs,
        doctor,
        evaluate,
        export,
        families,
        inspect,
        load,
        methods,
        patch,
        selftest,
        tune,
        visualize,
    )

__all__ = [
    "__version__",
    "Artifact",
    "BuildReport",
    "CalibrationReport",
    "CleanReport",
    "ConfigsReport",
    "DeployConfig",
    "DeploytkError",
    "DeploytkNotice",
    "DoctorReport",
    "EvaluationReport",
    "ExportNotice",
    "FamiliesReport",
    "InputKind",
    "InspectReport",
    "MergedViT",
    "MethodsReport",
    "ModelLike",
    "NotRebuildableWarning",
    "PackageReport",
    "ProfileReport",
    "Progress",
    "Report",
    "Runner",
    "SelftestReport",
    "TuneReport",
    "ValidationReport",
    "VisualizationReport",
    "calibrate",
    "clean",
    "configs",
    "doctor",
    "evaluate",
    "export",
    "families",
    "inspect",
    "load",
    "methods",
    "patch",
    "selftest",
    "tune",
    "visualize",
]
#: the API's names, loaded from deploytk.api when first used
API = frozenset(__all__) - {"__version__"}


def __getattr__(name: str) -> Any:
    if name in API:
        return getattr(importlib.import_module("deploytk.api"), name)
    raise AttributeError(f"module 'deploytk' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
