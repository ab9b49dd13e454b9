"""deploytk's Python API: one verb per job, the same verbs as the CLI (which is a thin layer over them), and every type
their signatures name."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from deploytk.api.artifact import Artifact, Runner
from deploytk.api.functions import (
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
from deploytk.api.reports import (
    BuildReport,
    CalibrationReport,
    CleanReport,
    ConfigsReport,
    DoctorReport,
    EvaluationReport,
    FamiliesReport,
    InspectReport,
    MethodsReport,
    PackageReport,
    ProfileReport,
    Report,
    SelftestReport,
    TuneReport,
    ValidationReport,
    VisualizationReport,
)
from deploytk.errors import DeploytkError, DeploytkNotice, ExportNotice, NotRebuildableWarning
from deploytk.inputs import InputKind
from deploytk.progress import Progress

if TYPE_CHECKING:
    from deploytk.api.inputs import ModelLike
    from deploytk.config import DeployConfig
    from deploytk.merging.merged_vit import MergedViT

#: types the signatures name whose modules import torch: loaded when first used, so ``deploytk.load`` stays light
HEAVY_TYPES = {"MergedViT": "deploytk.merging.merged_vit", "DeployConfig": "deploytk.config", "ModelLike": "deploytk.api.inputs"}

__all__ = [
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


def __getattr__(name: str) -> Any:
    if name in HEAVY_TYPES:
        return getattr(importlib.import_module(HEAVY_TYPES[name]), name)
    raise AttributeError(f"module 'deploytk.api' has no attribute {name!r}")
