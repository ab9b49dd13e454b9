"""Third-party warnings off stderr on a CLI run unless ``--verbose``, each silenced where it is raised.

A successful run should print deploytk's own lines only (issue 41). What reached stderr before: ONNX Runtime's
quantizer's "Please consider pre-processing" (``logging.warning`` on the root logger), torch's "No CUDA runtime is
found" (logger ``torch.utils.cpp_extension``, on a machine with a CUDA toolkit and no GPU), Polygraphy's ``[W]`` /
``[E]`` lines (its comparator's, on a validation that passes by explained near-tie flips: deploytk's report says
what they said; `validate` itself now hides them from every caller, ``COMPARATOR_LOG``, and --verbose lets them
through). Only records and warnings below ERROR that these libraries raise are dropped: deploytk's own warnings and
every error stay, and nothing is filtered by its text. Library users keep the libraries' defaults: only the CLI calls
``third_party_quiet``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import warnings

#: ONNX Runtime's own default log severity (WARNING), put back after a run
ORT_DEFAULT_SEVERITY = 2

#: the packages whose warnings a run without --verbose does not print (their top-level module names)
THIRD_PARTY = (
    "torch",
    "torchvision",
    "timm",
    "transformers",
    "huggingface_hub",
    "onnx",
    "onnxscript",
    "onnx_ir",
    "onnxruntime",
    "openvino",
    "nncf",
    "polygraphy",
    "tensorrt",
    "triton",
    "fvcore",
    "iopath",
)


#: deploytk.validate.validator.COMPARATOR_LOG's name: where it is enabled for DEBUG, `validate` lets Polygraphy's comparator
#: lines (its own FAILED verdict, which deploytk's may overrule at a proven near-tie) through; only --verbose enables it
COMPARATOR_LOG = "deploytk.validate.comparator"


def _package_folders() -> tuple[str, ...]:
    """Where the third-party packages live, to recognise a root-logger record by the file that logged it."""
    folders = []
    for name in THIRD_PARTY:
        try:
            spec = importlib.util.find_spec(name)  # a top-level name: finds the package without importing it
        except (ImportError, ValueError):
            continue
        for folder in (spec.submodule_search_locations or []) if spec else []:
            folders.append(os.path.join(os.path.realpath(folder), ""))
    return tuple(folders)


class ThirdPartyRecords(logging.Filter):
    """Drops a log record below ERROR that a third-party package wrote to the root logger (``logging.warning(...)``)."""

    def __init__(self):
        super().__init__()
        self.folders = _package_folders()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or not os.path.realpath(record.pathname).startswith(self.folders)


@contextlib.contextmanager
def third_party_quiet():
    """Silence third-party warnings at their sources while the command runs; everything is put back on exit (so an
    in-process run, a test's CliRunner, leaves the process as it found it)."""
    # imported here, not at the top: `deploytk --help` and `--version` load this module and must not start ONNX Runtime
    import onnxruntime
    from polygraphy.logger import G_LOGGER

    loggers = {name: logging.getLogger(name) for name in THIRD_PARTY}
    levels = {name: logger.level for name, logger in loggers.items()}
    root, records = logging.getLogger(), ThirdPartyRecords()
    severity = G_LOGGER.module_severity
    with warnings.catch_warnings():
        for name, logger in loggers.items():
            # Python warnings attributed to their modules (torch.onnx, onnxscript, timm's deprecations, ...)
            warnings.filterwarnings("ignore", module=rf"{name}(\.|$)")
            logger.setLevel(logging.ERROR)  # their named loggers (torch.utils.cpp_extension, nncf, ...): errors still print
        root.addFilter(records)  # onnxruntime.quantization logs on the root logger
        onnxruntime.set_default_logger_severity(3)  # ONNX Runtime's C++ log, for sessions that set no level: errors only
        G_LOGGER.module_severity = G_LOGGER.CRITICAL  # the comparator's [W]/[E]: `validate` reports the comparison itself
        try:
            yield
        finally:
            G_LOGGER.module_severity = severity
            onnxruntime.set_default_logger_severity(ORT_DEFAULT_SEVERITY)
            root.removeFilter(records)
            for name, logger in loggers.items():
                logger.setLevel(levels[name])


@contextlib.contextmanager
def third_party_verbose():
    """``deploytk --verbose``: the libraries' warnings keep their defaults, and `validate` shows Polygraphy's comparator
    lines too (the library hides them from every caller unless asked, ``COMPARATOR_LOG``); put back on exit."""
    logger = logging.getLogger(COMPARATOR_LOG)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.setLevel(level)
