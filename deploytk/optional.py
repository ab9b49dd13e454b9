"""Probes for the optional dependencies (TensorRT, Triton, OpenVINO), so that callers import them lazily.

TensorRT cannot be installed where deploytk is built and needs a GPU; Triton ships with
Linux CUDA builds of torch but not with every torch. Code that needs either asks here first
and gets a DeploytkError that says how to install it.
"""

from __future__ import annotations

from deploytk.errors import DeploytkError

#: the first TensorRT with ahead-of-time Python plugins (``tensorrt.plugin.aot_impl``), which deploytk's plugins are
MIN_TENSORRT = (10, 9)
TENSORRT_INSTALL_HINT = (
    "Install TensorRT >= 10.9 for your CUDA version (e.g. `pip install tensorrt-cu12` or NVIDIA's "
    "packages) on a machine with an NVIDIA GPU, then check with `deploytk doctor`."
)


def tensorrt_version() -> str | None:
    """TensorRT's version if its Python bindings and libnvinfer load, else None."""
    try:
        import tensorrt  # optional: only present on GPU machines with TensorRT
    except Exception:
        return None
    return getattr(tensorrt, "__version__", "unknown")


def version_tuple(version: str) -> tuple[int, int] | None:
    """'10.9.0.34' -> (10, 9); None for a version string that does not start with two numbers."""
    try:
        major, minor = version.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def require_tensorrt(what: str) -> None:
    if tensorrt_version() is None:
        raise DeploytkError(f"{what} needs TensorRT, which is not installed or cannot load here.", hint=TENSORRT_INSTALL_HINT)


def triton_version() -> str | None:
    """Triton's version if it imports, else None."""
    try:
        import triton  # optional: Linux CUDA builds of torch bring it
    except ImportError:
        return None
    return triton.__version__


def require_triton(what: str) -> None:
    if triton_version() is None:
        raise DeploytkError(f"{what} needs Triton (`pip install triton`).")


OPENVINO_INSTALL_HINT = "Install it with `pip install 'deploytk[openvino]'` (or `pip install openvino`), then check with `deploytk doctor`."


def openvino_version() -> str | None:
    """OpenVINO's version if its Python package imports, else None."""
    try:
        import openvino  # optional: the `openvino` extra
    except ImportError:
        return None
    return openvino.get_version() if hasattr(openvino, "get_version") else getattr(openvino, "__version__", "unknown")


def require_openvino(what: str) -> None:
    if openvino_version() is None:
        raise DeploytkError(f"{what} needs OpenVINO, which is not installed.", hint=OPENVINO_INSTALL_HINT)


def nncf_version() -> str | None:
    """NNCF's version if it imports, else None (`deploytk quantize` with `backend=openvino`)."""
    try:
        from importlib import metadata

        return metadata.version("nncf")
    except Exception:
        return None


def require_nncf(what: str) -> None:
    require_openvino(what)
    if nncf_version() is None:
        raise DeploytkError(
            f"{what} needs NNCF (OpenVINO's quantizer), which is not installed.",
            hint="Install it with `pip install 'deploytk[int8]'` (or `pip install nncf`).",
        )
