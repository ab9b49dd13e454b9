"""The runtimes an artifact runs on, one ``Backend`` each; ``backend=NAME`` picks one.

A new runtime is one module with a ``Backend`` subclass and one entry in ``BACKENDS``.
"""

from __future__ import annotations

from deploytk.backends.base import Backend, LoadedModel, ModelRunner
from deploytk.backends.openvino_backend import OpenVinoBackend
from deploytk.backends.ort import OrtBackend
from deploytk.backends.torch_backend import TorchBackend
from deploytk.backends.trt import TrtBackend
from deploytk.errors import DeploytkError

BACKENDS: dict[str, Backend] = {
    b.name: b for b in (OrtBackend("ort"), OrtBackend("ort-cuda"), OpenVinoBackend(), TorchBackend(), TrtBackend())
}
#: what validate, profile and eval run when not told otherwise
DEFAULT_BACKEND = "ort"


def get_backend(name: str, validating: bool = False) -> Backend:
    """The backend ``backend=name`` means; ``validating``: one whose outputs can be compared with the reference."""
    allowed = [n for n, b in BACKENDS.items() if b.validates or not validating]
    if name not in allowed:
        raise DeploytkError(f"unknown backend {name!r} (`backend=`); allowed: {', '.join(allowed)}.")
    return BACKENDS[name]


__all__ = ["BACKENDS", "DEFAULT_BACKEND", "Backend", "LoadedModel", "ModelRunner", "get_backend"]
