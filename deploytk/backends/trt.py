"""TensorRT availability guard (the engine path itself is built on top of this)."""

from __future__ import annotations

from deploytk.errors import DeploytkError

INSTALL_HINT = (
    "Install TensorRT >= 10.9 for your CUDA version (e.g. `pip install tensorrt-cu12` or NVIDIA's "
    "packages) on a machine with an NVIDIA GPU, then check with `deploytk doctor`."
)


def tensorrt_version() -> str | None:
    """TensorRT's version if its Python bindings and libnvinfer load, else None."""
    try:
        import tensorrt  # noqa: F401
    except Exception:
        return None
    return getattr(tensorrt, "__version__", "unknown")


def require_tensorrt(what: str) -> None:
    if tensorrt_version() is None:
        raise DeploytkError(f"{what} needs TensorRT, which is not installed or cannot load here.", hint=INSTALL_HINT)
