"""What the CLI's help texts and the Python API's default arguments say about the library, without importing it.

Typer builds every help text when ``deploytk.cli`` is imported, and ``deploytk.load`` needs no model code; the tables
these come from live in modules that import torch, ONNX and OpenVINO (issue 42: the CLI's help took 5 s and 1 GB
for that; issue 55: ``deploytk.load`` took 8 s). Each value here is a copy of one library table, named beside it;
``tests/test_cli_startup.py`` holds every copy equal to its source, so a change there fails the suite until it is made
here too. Nothing here decides anything: the commands still ask the library.
"""

from __future__ import annotations

#: deploytk.backends.BACKENDS' names, in order, and those whose outputs can be validated (Backend.validates)
BACKEND_NAMES = ("ort", "ort-cuda", "openvino", "torch", "trt")
VALIDATING_BACKEND_NAMES = ("ort", "ort-cuda", "openvino", "trt")
#: deploytk.backends.DEFAULT_BACKEND
DEFAULT_BACKEND = "ort"
#: deploytk.validate.validator.PRECISION_TOLERANCES, as {precision: {field: value}}
PRECISION_TOLERANCES = {
    "fp32": {
        "atol": 1e-4,
        "rtol": 1e-4,
        "min_cosine": 0.99999,
        "min_top1_agreement": 1.0,
        "max_flipped_choices": 1e-2,
        "max_branch_flips": None,
    },
    "fp16": {
        "atol": 5e-2,
        "rtol": 5e-2,
        "min_cosine": 0.999,
        "min_top1_agreement": 0.99,
        "max_flipped_choices": 5e-2,
        "max_branch_flips": None,
    },
    "bf16": {
        "atol": 2e-1,
        "rtol": 2e-1,
        "min_cosine": 0.995,
        "min_top1_agreement": 0.98,
        "max_flipped_choices": 5e-2,
        "max_branch_flips": None,
    },
    "int8": {"atol": 0.1, "rtol": 0.0, "min_cosine": 0.95, "min_top1_agreement": 0.9, "max_flipped_choices": 1.0, "max_branch_flips": None},
}
#: deploytk.quantize.DEFAULT_CALIBRATION_IMAGES
DEFAULT_CALIBRATION_IMAGES = 300
#: deploytk.tuning.PERCENTILES
PERCENTILES = ("p50", "p90", "p99")
#: deploytk_plugins.aot.ARCHES' names
ARCHES = ("sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_100", "sm_103", "sm_110", "sm_120", "sm_121")
#: deploytk.visualization.REFERENCE and deploytk.visualization.backend_names()
VISUALIZE_REFERENCE = "reference"
VISUALIZE_BACKENDS = ("reference", "ort", "ort-cuda", "openvino")
#: deploytk.package.DEFAULT_ONNX_MAX_BATCH
DEFAULT_ONNX_MAX_BATCH = 8
#: deploytk.adapters.hf_common.HF_PREFIX: how a config names a transformers model
HF_PREFIX = "hf:"
#: deploytk.api.inputs.CONFIG_SUFFIXES: what a YAML config's file name ends with
CONFIG_SUFFIXES = (".yaml", ".yml")
