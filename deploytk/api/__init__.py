"""deploytk's Python API: one verb per job, the same verbs as the CLI (which is a thin layer over them)."""

from deploytk.api.artifact import Artifact, Runner
from deploytk.api.functions import calibrate, evaluate, export, families, inspect, load, methods, patch, tune, visualize
from deploytk.api.reports import (
    BuildReport,
    CalibrationReport,
    EvaluationReport,
    FamiliesReport,
    InspectReport,
    MethodsReport,
    PackageReport,
    ProfileReport,
    Report,
    TuneReport,
    ValidationReport,
    VisualizationReport,
)

__all__ = [
    "Artifact",
    "BuildReport",
    "CalibrationReport",
    "EvaluationReport",
    "FamiliesReport",
    "InspectReport",
    "MethodsReport",
    "PackageReport",
    "ProfileReport",
    "Report",
    "Runner",
    "TuneReport",
    "ValidationReport",
    "VisualizationReport",
    "calibrate",
    "evaluate",
    "export",
    "families",
    "inspect",
    "load",
    "methods",
    "patch",
    "tune",
    "visualize",
]
