"""`deploytk doctor` (``deploytk.doctor()``): what this environment can run. Not named doctor.py: importing a submodule
sets it on its package, and ``deploytk.doctor`` would become this module instead of the API's verb."""

from __future__ import annotations

import platform
from importlib import metadata

import onnxruntime as ort
import torch
from deploytk_plugins.aot import ARCHES

from deploytk.exporter.manifest import package_versions
from deploytk.optional import (
    MIN_TENSORRT,
    OPENVINO_INSTALL_HINT,
    TENSORRT_INSTALL_HINT,
    openvino_version,
    tensorrt_version,
    triton_version,
    version_tuple,
)


def environment_report() -> dict:
    report = {"python": platform.python_version(), "platform": platform.platform(), "packages": package_versions()}
    report["onnxruntime_providers"] = ort.get_available_providers()
    report["torch_cuda_build"] = torch.version.cuda
    report["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    report["compute_capability"] = None
    report["plugin_kernels_for_this_gpu"] = None
    if report["gpu"]:
        major, minor = torch.cuda.get_device_capability(0)
        report["compute_capability"] = f"{major}.{minor}"
        report["plugin_kernels_for_this_gpu"] = f"sm_{major}{minor}" in ARCHES
    trt = tensorrt_version()
    report["tensorrt"] = trt
    report["tensorrt_hint"] = None if trt else TENSORRT_INSTALL_HINT
    parsed = version_tuple(trt) if trt else None
    if parsed is not None and parsed < MIN_TENSORRT:
        report["tensorrt_hint"] = f"deploytk's plugins need TensorRT >= {'.'.join(map(str, MIN_TENSORRT))} (ahead-of-time plugins)."
    report["triton"] = triton_version()
    report.update(openvino_report())
    report.update(extras_report())
    return report


def openvino_report() -> dict:
    """OpenVINO's version and what its CPU plugin can compute in (bf16/fp16 arithmetic decides how low-precision graphs run)."""
    version = openvino_version()
    if version is None:
        return {"openvino": None, "openvino_hint": OPENVINO_INSTALL_HINT, "openvino_cpu_capabilities": None}
    import openvino  # optional: present, checked above

    capabilities = list(openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    return {"openvino": version, "openvino_hint": None, "openvino_cpu_capabilities": capabilities}


#: pyproject.toml's [project.optional-dependencies], by distribution name (a test holds the two equal), and what each enables
EXTRAS = {
    "openvino": (("openvino",), "the openvino backend (CPU)"),
    "int8": (("openvino", "nncf"), "deploytk quantize for the openvino runtime (NNCF); for ort / trt it needs nothing more"),
    "hf": (
        ("transformers",),
        "`model: hf:<folder or hub id>`: Hugging Face transformers ViT, DeiT, DINOv2, CLIP, SigLIP, VideoMAE, ViViT and AST",
    ),
    "media": (("av", "soundfile", "scipy"), "real video and audio files (PyAV, soundfile) for the video and audio families"),
    "gpu": (("onnxruntime-gpu", "triton"), "the ort-cuda backend, the Triton kernels (torch backend on a GPU, selftest, plugins compile)"),
    "tensorrt": (("tensorrt", "polygraphy"), "deploytk build, the trt backend"),
    "serve": (("tritonclient",), "a client for the Triton server repositories `deploytk package` writes"),
    "docs": (("mkdocs", "mkdocs-material", "mkdocstrings-python", "ruff"), "make docs: the documentation site (mkdocs-material)"),
    "test": (
        (
            "pytest",
            "pytest-xdist",
            "pytest-cov",
            "filelock",
            "ruff",
            "import-linter",
            "mypy",
            "openvino",
            "nncf",
            "tritonclient",
            "matplotlib",
            "transformers",
            "mkdocs",
            "mkdocs-material",
            "mkdocstrings-python",
            "av",
            "soundfile",
            "scipy",
        ),
        "make test",
    ),
    "bench": (("matplotlib",), "the plots of benchmarks/, visualize and tune"),
}
#: distributions that stand in for a requirement: TensorRT's wheels are also installed per CUDA version without the metapackage
_ALSO_SATISFIED_BY = {"tensorrt": ("tensorrt-cu13", "tensorrt-cu12", "tensorrt-cu11")}
ORT_BOTH_HINT = (
    "onnxruntime and onnxruntime-gpu are both installed and write the same `onnxruntime` module, so whichever was installed last "
    "is the one that runs (see the providers above); for the ort-cuda backend: `pip uninstall -y onnxruntime onnxruntime-gpu && "
    "pip install onnxruntime-gpu`."
)


def distribution_version(name: str) -> str | None:
    for candidate in (name, *_ALSO_SATISFIED_BY.get(name, ())):
        try:
            version = metadata.version(candidate)
        except metadata.PackageNotFoundError:
            continue
        return version if candidate == name else f"{version} ({candidate})"
    return None


def extras_report() -> dict:
    """Per extra of `pip install 'deploytk[EXTRA]'`: installed (every package present) or not, with each package's version."""
    extras = {}
    for extra, (packages, purpose) in EXTRAS.items():
        versions = {name: distribution_version(name) for name in packages}
        extras[extra] = {
            "installed": all(versions.values()),
            "packages": versions,
            "for": purpose,
            "install": f"pip install 'deploytk[{extra}]'",
        }
    both = distribution_version("onnxruntime") and distribution_version("onnxruntime-gpu")
    return {"extras": extras, "extras_hint": ORT_BOTH_HINT if both else None}
