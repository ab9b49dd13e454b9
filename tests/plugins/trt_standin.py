"""A stand-in for TensorRT's compiled module (``tensorrt.so``), just enough for the real ``tensorrt.plugin`` sources.

``tensorrt.plugin`` is pure Python on top of a handful of names from the compiled bindings:
enums (``DataType``, ``TensorFormat``, ``PluginFieldType``, ``DimensionOperation``, ...), plain
structs (``PluginField``, ``PluginTensorDesc``, ``DynamicPluginTensorDesc``, ``Dims``, ``DimsExprs``),
the interface base classes its plugin templates derive from (``IPluginV3``, ``IPluginV3Quick*``,
``IPluginCreatorV3Quick``, ``ISymExpr``), the plugin registry and the symbolic shape expressions
(``IDimensionExpr`` built by an ``IExprBuilder``). This module provides exactly those, with the
behaviour the sources rely on and nothing TensorRT decides itself:

- shape expressions fold constants (``is_constant``/``get_constant_value``) and keep the batch
  symbolic; ``evaluate(batch=...)`` gives their value for a concrete batch, which is how the tests
  read output shapes and launch grids;
- ``with_aot=False`` leaves out ``QuickPluginCreationRequest`` (TensorRT < 10.9), which is what
  ``tensorrt.plugin`` checks to enable ``KernelLaunchParams`` and AOT plugins.

What it cannot show: anything libnvinfer does (the ONNX parser's and builder's own checks, tactic
timing, the driver's PTX JIT, the kernel launch). The call sequence of the parser and builder is
replayed by ``tests/plugins/test_tensorrt_plugin_layer.py``.
"""

from __future__ import annotations

import enum
import types

import numpy as np


class DataType(enum.Enum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    FP8 = 6
    BF16 = 7
    INT64 = 8
    INT4 = 9


_NUMPY = {DataType.FLOAT: np.float32, DataType.HALF: np.float16, DataType.INT32: np.int32, DataType.INT64: np.int64}


def nptype(dtype: DataType):
    return _NUMPY[dtype]


TensorFormat = enum.Enum("TensorFormat", "LINEAR CHW2 HWC8 CHW4 CHW16 CHW32 DHWC8 CDHW32 HWC DLA_LINEAR DLA_HWC4 HWC16 DHWC")
PluginFieldType = enum.Enum("PluginFieldType", "FLOAT16 FLOAT32 FLOAT64 INT8 INT16 INT32 CHAR DIMS UNKNOWN BF16 INT64 FP8 INT4")
DimensionOperation = enum.Enum("DimensionOperation", "SUM PROD MAX MIN SUB EQUAL LESS FLOOR_DIV CEIL_DIV")
TensorRTPhase = enum.Enum("TensorRTPhase", "BUILD RUNTIME")
PluginArgType = enum.Enum("PluginArgType", "INT")
PluginArgDataType = enum.Enum("PluginArgDataType", "INT8 INT16 INT32")
QuickPluginCreationRequest = enum.Enum("QuickPluginCreationRequest", "UNKNOWN PREFER_JIT PREFER_AOT STRICT_JIT STRICT_AOT")

_OPERATIONS = {
    DimensionOperation.SUM: lambda a, b: a + b,
    DimensionOperation.PROD: lambda a, b: a * b,
    DimensionOperation.MAX: max,
    DimensionOperation.MIN: min,
    DimensionOperation.SUB: lambda a, b: a - b,
    DimensionOperation.EQUAL: lambda a, b: int(a == b),
    DimensionOperation.LESS: lambda a, b: int(a < b),
    DimensionOperation.FLOOR_DIV: lambda a, b: a // b,
    DimensionOperation.CEIL_DIV: lambda a, b: -(-a // b),
}


class IDimensionExpr:
    """A dimension: a constant, the symbolic batch, or an operation on two expressions (constants fold)."""

    def __init__(self, constant: int | None = None, op=None, operands=()):
        self._constant, self._op, self._operands = constant, op, operands

    def is_constant(self) -> bool:
        return self._constant is not None

    def get_constant_value(self) -> int:
        if self._constant is None:
            raise RuntimeError("not a build-time constant")
        return self._constant

    def evaluate(self, batch: int) -> int:
        if self._constant is not None:
            return self._constant
        if self._op is None:
            return batch
        a, b = (e.evaluate(batch) for e in self._operands)
        return _OPERATIONS[self._op](a, b)

    def __repr__(self):
        return f"IDimensionExpr({self._constant if self._constant is not None else 'batch'})"


class IExprBuilder:
    def constant(self, value: int) -> IDimensionExpr:
        return IDimensionExpr(int(value))

    def operation(self, op, first: IDimensionExpr, second: IDimensionExpr) -> IDimensionExpr:
        if first.is_constant() and second.is_constant():
            return IDimensionExpr(_OPERATIONS[op](first.get_constant_value(), second.get_constant_value()))
        return IDimensionExpr(op=op, operands=(first, second))

    def declare_size_tensor(self, index, opt, upper):
        raise NotImplementedError("deploytk plugins have no data-dependent outputs")


def batch_expr() -> IDimensionExpr:
    """The dynamic batch dimension of an optimization profile."""
    return IDimensionExpr()


class Dims(tuple):
    MAX_DIMS = 8

    def __new__(cls, values=()):
        return super().__new__(cls, [0] * values if isinstance(values, int) else values)


class DimsExprs(list):
    def __init__(self, length):
        super().__init__([None] * length)


class PluginField:
    def __init__(self, name: str, data=None, type=PluginFieldType.UNKNOWN):
        self.name, self.type = name, type
        self.data = data if isinstance(data, np.ndarray) else np.frombuffer(bytes(data or b""), dtype=np.uint8)


class PluginFieldCollection(list):
    pass


class PluginTensorDesc:
    def __init__(self, dims=(), type=DataType.FLOAT, format=TensorFormat.LINEAR, scale=1.0):
        self.dims, self.type, self.format, self.scale = Dims(dims), type, format, scale


class DynamicPluginTensorDesc:
    def __init__(self, desc: PluginTensorDesc, min=(), opt=(), max=()):
        self.desc, self.min, self.opt, self.max = desc, Dims(min), Dims(opt), Dims(max)


class _Interface:
    def __init__(self, *args, **kwargs):
        pass


IPluginV3 = type("IPluginV3", (_Interface,), {})
IPluginV3QuickCore = type("IPluginV3QuickCore", (_Interface,), {})
IPluginV3QuickBuild = type("IPluginV3QuickBuild", (_Interface,), {})
IPluginV3QuickRuntime = type("IPluginV3QuickRuntime", (_Interface,), {})
IPluginV3QuickAOTBuild = type("IPluginV3QuickAOTBuild", (_Interface,), {})
IPluginCreatorV3Quick = type("IPluginCreatorV3Quick", (_Interface,), {})
ISymExpr = type("ISymExpr", (_Interface,), {})
ITensor = type("ITensor", (_Interface,), {})


class PluginRegistry:
    """The process-wide creator registry: (name, version, namespace) -> creator."""

    def __init__(self):
        self.creators = {}

    def register_creator(self, creator, namespace: str) -> bool:
        key = (creator.name, creator.plugin_version, namespace)
        if key in self.creators:
            return False
        self.creators[key] = creator
        return True

    def deregister_creator(self, creator) -> bool:
        return self.creators.pop((creator.name, creator.plugin_version, creator.plugin_namespace), None) is not None

    def get_creator(self, name: str, version: str, namespace: str = ""):
        return self.creators.get((name, version, namespace))


class Logger:
    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)

    def __init__(self, min_severity=WARNING):
        self.messages = []

    def log(self, severity, message):
        self.messages.append((severity, message))


class KernelLaunchParamsStruct:
    """What TensorRT hands ``get_launch_params`` to fill: grid/block dims and shared memory as ``ISymExpr``."""

    grid_x = grid_y = grid_z = block_x = block_y = block_z = shared_mem = None


class SymExpressions(list):
    """TensorRT's ``ISymExprs`` setter for the kernel's extra scalar arguments."""

    def __init__(self):
        super().__init__()
        self._count = 0

    @property
    def nbSymExprs(self):
        return self._count

    @nbSymExprs.setter
    def nbSymExprs(self, count):
        self._count = count
        self[:] = [None] * count


def make_tensorrt(version: str, plugin_sources, with_aot: bool = True) -> types.ModuleType:
    """A fresh ``tensorrt`` module whose ``plugin`` subpackage is loaded from ``plugin_sources`` (a folder)."""
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.__path__ = [str(plugin_sources)]  # `import tensorrt.plugin` finds <plugin_sources>/plugin/
    for name, value in dict(globals()).items():
        if isinstance(value, type) or name == "nptype":
            setattr(trt, name, value)
    if not with_aot:
        del trt.QuickPluginCreationRequest
    trt.float32, trt.float16, trt.bfloat16 = DataType.FLOAT, DataType.HALF, DataType.BF16
    trt.int8, trt.int32, trt.int64, trt.bool = DataType.INT8, DataType.INT32, DataType.INT64, DataType.BOOL
    registry = PluginRegistry()
    trt.get_plugin_registry = lambda: registry
    return trt
