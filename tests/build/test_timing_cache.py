"""The builder's timing-cache handling, on a fake of the few TensorRT builder objects ``_build`` touches.

The fake follows TensorRT's documented contract: ``IBuilderConfig.create_timing_cache`` returns None
for bytes that are not a timing cache; ``set_timing_cache(cache, ignore_mismatch=False)`` returns
False for a cache made on another device or TensorRT version; ``ITimingCache.serialize`` gives the
cache's bytes after the build.
"""

import types

import pytest
from onnx import helper

from deploytk.build.builder import _build
from deploytk.build.options import BuildOptions
from deploytk.errors import DeploytkError
from deploytk.inputs.image import ImageInput
from deploytk.progress import SILENT

MAGIC = b"TRTCACHE"
THIS_GPU, OTHER_GPU = b"H100", b"A100"


class Cache:
    def __init__(self, data: bytes):
        self.device = data[len(MAGIC) :][:4] or THIS_GPU
        self.entries = data[len(MAGIC) + 4 :]

    def serialize(self) -> bytes:
        return MAGIC + THIS_GPU + self.entries + b"+timed"


class Config:
    def __init__(self):
        self.cache = None

    def create_timing_cache(self, data: bytes):
        return Cache(data) if data == b"" or data.startswith(MAGIC) else None

    def set_timing_cache(self, cache, ignore_mismatch: bool) -> bool:
        if cache is None or (cache.device != THIS_GPU and not ignore_mismatch):
            return False
        self.cache = cache
        return True

    def get_timing_cache(self):
        return self.cache

    def add_optimization_profile(self, profile):
        pass


class Builder:
    built = 0

    def __init__(self, logger):
        pass

    def create_network(self, flags):
        return object()

    def create_builder_config(self):
        return Config()

    def create_optimization_profile(self):
        return types.SimpleNamespace(set_shape=lambda *a: None)

    def build_serialized_network(self, network, config):
        Builder.built += 1
        return b"engine"


class Parser:
    num_errors = 0

    def __init__(self, network, logger):
        pass

    def parse(self, data):
        return True


class IProgressMonitor:
    def __init__(self):
        pass


FAKE_TRT = types.SimpleNamespace(
    Builder=Builder,
    OnnxParser=Parser,
    IProgressMonitor=IProgressMonitor,
    NetworkDefinitionCreationFlag=types.SimpleNamespace(STRONGLY_TYPED=0),
)


def build_with_cache(cache_path):
    model = helper.make_model(helper.make_graph([], "g", [], []))
    options = BuildOptions(timing_cache=str(cache_path))
    return _build(FAKE_TRT, None, model, options, ImageInput.of_size((32, 32)), "model.onnx", SILENT, "merged model")


def test_a_new_cache_file_is_written_after_the_build(tmp_path):
    cache = tmp_path / "timing.cache"
    assert build_with_cache(cache)[0] == b"engine"
    assert cache.read_bytes() == MAGIC + THIS_GPU + b"+timed"


def test_an_existing_cache_of_this_gpu_is_used_and_updated(tmp_path):
    cache = tmp_path / "timing.cache"
    cache.write_bytes(MAGIC + THIS_GPU + b"old")
    build_with_cache(cache)
    assert cache.read_bytes() == MAGIC + THIS_GPU + b"old+timed"


def test_a_cache_from_another_gpu_is_refused_and_left_as_it_is(tmp_path):
    cache = tmp_path / "timing.cache"
    cache.write_bytes(MAGIC + OTHER_GPU + b"precious")
    built = Builder.built
    with pytest.raises(DeploytkError, match="made on another GPU or with another TensorRT version.*left as it is") as err:
        build_with_cache(cache)
    assert "one `timing_cache=` file per GPU" in err.value.hint
    assert cache.read_bytes() == MAGIC + OTHER_GPU + b"precious" and Builder.built == built  # refused before building


def test_a_file_that_is_not_a_timing_cache_is_refused_with_its_name(tmp_path):
    cache = tmp_path / "notes.txt"
    cache.write_bytes(b"not a cache")
    with pytest.raises(DeploytkError, match=r"notes\.txt is not a TensorRT timing cache"):
        build_with_cache(cache)
    assert cache.read_bytes() == b"not a cache"
