"""Session set-up: one CPU per pytest-xdist worker, GPU/TensorRT skips with the reason, the shared exports.

The helpers test modules import are in ``tests/helpers``; fixtures of one folder live in that folder's conftest.py.
"""

from __future__ import annotations

import os

import pytest


def _one_cpu_per_worker() -> None:
    """Under pytest-xdist with as many workers as CPUs, pin each worker to its own CPU before torch, ONNX Runtime or
    OpenVINO start their thread pools: each then runs one thread (OpenVINO reads the affinity, torch and ONNX Runtime
    are told) and the workers do not oversubscribe the cores. What a test starts (the CLI, tritonserver) inherits it."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if worker is None or count < 2 or count > len(cpus):
        os.environ.setdefault("OMP_NUM_THREADS", "2")
        return
    os.sched_setaffinity(0, {cpus[int(worker.removeprefix("gw")) % len(cpus)]})
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"


_one_cpu_per_worker()

import torch  # noqa: E402  (after the thread settings above)

from helpers import ExportCache  # noqa: E402

if os.environ.get("OMP_NUM_THREADS") == "1":
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    from deploytk.optional import tensorrt_version

    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is visible to torch on this machine")
    skip_trt = pytest.mark.skip(reason="needs TensorRT (libnvinfer), which is not installed here")
    gpu = torch.cuda.is_available()
    for item in items:
        if "gpu" in item.keywords and not gpu:
            item.add_marker(skip_gpu)
        if "trt" in item.keywords and tensorrt_version() is None:
            item.add_marker(skip_trt)


def _shared_temp(tmp_path_factory):
    """This run's folder both xdist workers see (pytest's base temp of the worker's parent), else the base temp."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def deploytk_cache(tmp_path_factory):
    """deploytk's cache folder (dense baselines) for this run, shared by the workers and by the CLI runs tests start:
    never the user's ~/.cache, and empty at the start of every run."""
    folder = _shared_temp(tmp_path_factory) / "deploytk-cache"
    os.environ["DEPLOYTK_CACHE"] = str(folder)
    return folder


@pytest.fixture(scope="session")
def exported(tmp_path_factory) -> ExportCache:
    """The shared exports: ``exported("digits_vit_tome_r4", precision="bf16")`` -> the export's folder, made once per run
    (both xdist workers share the cache); ``exported.copy(stem, dest)`` for a test that changes files."""
    cache = ExportCache(_shared_temp(tmp_path_factory) / "shared-exports")
    yield cache
    changed = cache.changed()
    assert not changed, f"tests wrote into the shared exports {changed}: a test that changes files takes exported.copy(...)"


@pytest.fixture(scope="module")
def digits_tree(tmp_path_factory):
    """The bundled digits written as an ImageFolder tree (each module writes its own, ~1 s): `deploytk eval`'s data."""
    from deploytk.evaluation.digits import write_digits_imagefolder

    root = tmp_path_factory.mktemp("digits") / "digits"
    counts = write_digits_imagefolder(root, img_size=32)
    return root, counts
