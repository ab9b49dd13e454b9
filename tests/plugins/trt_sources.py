"""The real ``tensorrt.plugin`` sources, from NVIDIA's ``tensorrt-cu12-bindings`` wheels on the package registry.

Those wheels hold the compiled bindings (``tensorrt.so``, which needs libnvinfer and cannot load
here) next to ``tensorrt_bindings/plugin/*.py``, the pure-Python ``tensorrt.plugin`` layer that
turns deploytk's ``register``/``autotune``/``aot_impl`` functions into IPluginV3 plugins. The first
use downloads each wheel once (about 1.2 MB, ``pip download``) into ``$DEPLOYTK_TEST_CACHE`` (default
``~/.cache/deploytk``) and keeps two things per version: the plugin sources and the names the
compiled module exports (read off ``tensorrt.so``'s symbol strings), for the API-presence check.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

#: the TensorRT versions the plugins are written for: the first with AOT Python plugins, and a current 11.x
VERSIONS = ("10.9.0.34", "11.4.0.106")
PACKAGE = "tensorrt-cu12-bindings"


def cache_root() -> Path:
    return Path(os.environ.get("DEPLOYTK_TEST_CACHE", Path.home() / ".cache" / "deploytk")) / "tensorrt-bindings"


class Unavailable(Exception):
    """The wheel could not be had (no registry, no pip): the tests skip and say why."""


def plugin_sources(version: str) -> Path:
    """A folder holding ``plugin/`` (the ``tensorrt.plugin`` package of that version) and ``api_names.txt``."""
    folder = cache_root() / version
    if (folder / "plugin" / "__init__.py").is_file() and (folder / "api_names.txt").is_file():
        return folder
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet", "-d", tmp, f"{PACKAGE}=={version}"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise Unavailable(f"`pip download {PACKAGE}=={version}` failed: {err}") from err
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise Unavailable(f"`pip download {PACKAGE}=={version}` failed: {done.stderr.strip()[-300:]}")
        cache_root().mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=cache_root(), prefix=".partial-"))
        with zipfile.ZipFile(wheels[0]) as wheel:
            members = [m for m in wheel.namelist() if re.fullmatch(r"tensorrt_bindings/plugin/[^/]+\.py", m)]
            binary = next(m for m in wheel.namelist() if re.fullmatch(r"tensorrt_bindings/tensorrt[^/]*\.so", m))
            (staging / "plugin").mkdir()
            for member in members:
                (staging / "plugin" / Path(member).name).write_bytes(wheel.read(member))
            names = sorted({m.decode() for m in re.findall(rb"[A-Za-z_][A-Za-z0-9_]{2,}", wheel.read(binary))})
        (staging / "api_names.txt").write_text("\n".join(names) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)  # all or nothing: a half-extracted folder is never left behind
    return folder


def api_names(version: str) -> set[str]:
    """Every identifier-like string in that version's compiled bindings (pybind11 keeps the Python names)."""
    return set((plugin_sources(version) / "api_names.txt").read_text().split())


def exports(names: set[str], name: str) -> bool:
    """Whether the bindings hold ``name``: as a string of its own, or as the tail of a longer one (the linker merges
    a string into the end of another that ends with it, e.g. the enum value ``INPUT`` into ``ATTENTION_INPUT``)."""
    return name in names or any(other.endswith(name) for other in names)
