"""TensorRT plugins of the deploytk ops, as quickly-deployable Python plugins with AOT Triton kernels.

Written against ``tensorrt.plugin`` (TensorRT >= 10.9 for ``aot_impl``; 11.x):
``trtp.register`` (output shapes/types), ``trtp.autotune`` (type/format combinations) and
``trtp.aot_impl`` (returns kernel name, PTX, ``trtp.KernelLaunchParams`` and the extra int
arguments as ``trtp.SymIntExprs``). The engine embeds the PTX, so it runs in any TensorRT
runtime without Python. Plugin ids are ``deploytk::<ONNX op type>``, version "1", matching the
ONNX nodes' ``plugin_namespace``/``plugin_version``; the ONNX attributes arrive as plugin
fields of the same names (INT -> int32, FLOAT -> float32).

One plugin per op in ``definitions.PLUGINS``, all made by ``_define`` from the op's spec: the
three functions' signatures are the ONNX function's inputs and attributes (so they cannot drift
from the nodes the parser hands over), the output rule is the spec's ``output_shape``, the type
combinations follow the inputs' kinds, and ``aot_impl`` compiles the op's own kernel plan.

API facts this module relies on (read from ``tensorrt/plugin`` in TensorRT 10.9 and 11.x):
the functions' signatures are read with ``inspect.signature`` (so a ``__signature__`` is what
TensorRT sees) and their annotations must be objects, not strings; the register function runs
with every node attribute the plugin declares, as keywords, and ``aot_impl`` gets the same
attributes positionally in that order, then ``outputs, tactic``; defaults are not allowed; an
INT attribute arrives as a one-element int32 array (so it is annotated ``NDArray[np.int32]``:
``int()`` of a 1-element array fails on NumPy >= 2.4); ``plugin_namespace``/``plugin_version``
are not passed as fields; extra kernel arguments must be ``trtp.SymInt32``; ``trtp.cdiv``
refuses two ints (grids divide plain ints, only the batch is symbolic); the kernel is launched
with inputs, extra ints, outputs and nothing else (``aot`` strips Triton's trailing scratch
parameters to match).

NOT RUN on TensorRT itself: its libraries cannot be installed where deploytk is built. CI
registers these plugins through the real ``tensorrt.plugin`` sources of TensorRT 10.9 and 11.4
on a stand-in for the compiled module and replays the ONNX parser's and builder's calls for
every op and dtype (``tests/plugins/test_tensorrt_plugin_layer.py``).
"""

import inspect

import numpy as np
import numpy.typing as npt
import torch
from deploytk_plugins.aot import arch_of_capability, check_arch, compile_variant, kernel_variant
from deploytk_plugins.definitions import PLUGINS

from deploytk.errors import DeploytkError
from deploytk.ops import OPS
from deploytk.ops.spec import FP32, INT64, OpSpec
from deploytk.optional import MIN_TENSORRT, TENSORRT_INSTALL_HINT, require_tensorrt, version_tuple

PLUGIN_NAMESPACE = "deploytk"
PLUGIN_VERSION = "1"
#: every op with a TensorRT plugin
PLUGIN_OPS = tuple(PLUGINS)
_TRT_DTYPE = {"fp32": "FP32", "fp16": "FP16", "bf16": "BF16"}


# ---- plain rules, tested without TensorRT -------------------------------------------------


def _spec(op: str) -> OpSpec:
    if op not in PLUGINS:
        raise DeploytkError(f"no TensorRT plugin for op {op!r}; plugins exist for {', '.join(PLUGIN_OPS)}.")
    return OPS[op]


def plugin_signature(op: str) -> tuple[list[str], dict[str, str]]:
    """(input names, attribute name -> ONNX type) of the plugin: the ONNX node's, in order."""
    spec = _spec(op)
    return spec.input_names, spec.attributes


def output_shape(op: str, shapes: list, attrs: dict) -> list:
    """The output dims from the input dims (any may be symbolic) and attributes, after checking the inputs' ranks."""
    spec = _spec(op)
    for name, tensor, dims in zip(spec.input_names, spec.inputs, shapes, strict=True):
        if len(dims) != tensor.rank:
            layout = ", ".join(tensor.layout.split())
            raise DeploytkError(f"{op}: {name} must be rank {tensor.rank} [{layout}], got rank {len(dims)}.")
    return spec.output_shape(shapes, attrs)


def type_combinations(op: str) -> list[str]:
    """One TensorRT type string per supported dtype: inputs then outputs, comma-separated.

    The float tensors' type follows the precision; sizes/weights stay FP32 and dest INT64.
    """
    spec = _spec(op)
    kinds = [t.kind for t in spec.inputs] + [spec.output]
    return [", ".join({FP32: "FP32", INT64: "INT64"}.get(k, t) for k in kinds) for t in _TRT_DTYPE.values()]


def scalar(attribute) -> int | float:
    """A plugin field as a Python number: TensorRT hands INT/FLOAT attributes over as 1-element arrays."""
    values = np.asarray(attribute).reshape(-1)
    if values.size != 1:
        raise DeploytkError(f"expected a scalar plugin attribute, got {values.size} values.")
    return values[0].item()


def launch_plan(op: str, shapes: list, attrs: dict, dtype: str):
    """The AOT kernel variant (with its launch plan: grid, int arguments, warps) for these inputs and attributes."""
    return kernel_variant(_spec(op).name, shapes, attrs, dtype)


def _signature(params: list, returns) -> inspect.Signature:
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Signature([inspect.Parameter(name, kind, annotation=ann) for name, ann in params], return_annotation=returns)


def _function(name: str, signature: inspect.Signature, body):
    """A function TensorRT reads as having ``signature``; ``body`` gets the bound arguments as keywords."""

    def plugin_function(*args, **kwargs):
        return body(**signature.bind(*args, **kwargs).arguments)

    plugin_function.__name__ = plugin_function.__qualname__ = name
    plugin_function.__signature__ = signature
    return plugin_function


# ---- registration (needs tensorrt) --------------------------------------------------------

_registered = False


def build_arch() -> str:
    """The arch ``aot_impl`` compiles for: the GPU the engine is being built on (TensorRT builds for that GPU)."""
    major, minor = torch.cuda.get_device_capability()
    arch = arch_of_capability(f"{major}.{minor}")
    check_arch(arch)
    return arch


def register_plugins() -> None:
    """Register every deploytk plugin with TensorRT (idempotent). Raises a DeploytkError without TensorRT >= 10.9.

    Every op's three functions are made before any is registered, so a problem on deploytk's side
    registers nothing. TensorRT's plugin layer cannot unregister, so if TensorRT itself refuses one
    op, the ops before it stay registered: a second call skips the ``register`` step of those
    (their definitions are deploytk's own) and redoes the rest, so it fails the same way or completes.
    """
    global _registered
    if _registered:
        return
    require_tensorrt("registering the deploytk TensorRT plugins")
    import tensorrt as trt  # optional: guarded above
    import tensorrt.plugin as trtp

    check_plugin_layer(trt.__version__, trtp)
    definitions = [_define(OPS[op], trt, trtp) for op in PLUGIN_OPS]
    for plugin_id, functions in definitions:
        _register(trtp, plugin_id, functions, trt.__version__)
    _registered = True


def check_plugin_layer(version: str, trtp) -> None:
    """Refuse a TensorRT whose ``tensorrt.plugin`` has no ahead-of-time plugins (before 10.9, or AOT disabled)."""
    parsed = version_tuple(version)
    missing = [name for name in ("aot_impl", "KernelLaunchParams", "SymIntExprs") if not hasattr(trtp, name)]
    if (parsed is not None and parsed < MIN_TENSORRT) or missing:
        need = ".".join(map(str, MIN_TENSORRT))
        lacking = f" (its tensorrt.plugin lacks {', '.join(missing)})" if missing else ""
        raise DeploytkError(
            f"the deploytk TensorRT plugins need TensorRT >= {need}, the first with ahead-of-time Python plugins; "
            f"this is TensorRT {version}{lacking}.",
            hint=TENSORRT_INSTALL_HINT,
        )


def _register(trtp, plugin_id: str, functions: dict, version: str) -> None:
    namespace, name = plugin_id.split("::")
    existing = getattr(getattr(getattr(trtp, "op", None), namespace, None), name, None)
    try:
        if existing is None:
            trtp.register(plugin_id)(functions["register"])
        elif getattr(existing.register_func, "deploytk_op", None) != name:
            raise DeploytkError(f"another TensorRT plugin named {plugin_id} is already registered in this process.")
        trtp.autotune(plugin_id)(functions["autotune"])
        trtp.aot_impl(plugin_id)(functions["aot_impl"])
    except DeploytkError:
        raise
    except Exception as err:
        raise DeploytkError(
            f"TensorRT {version} refused the plugin {plugin_id}: {err}",
            hint="deploytk's plugins are written for TensorRT 10.9 to 11.x; report this with `deploytk doctor`'s output.",
        ) from err


def _define(spec: OpSpec, trt, trtp) -> tuple[str, dict]:
    """(plugin id, {"register", "autotune", "aot_impl"}) of one op, signatures from its ONNX function."""
    names = {trt.float32: "fp32", trt.float16: "fp16", trt.bfloat16: "bf16"}
    attr_types = {"INT": npt.NDArray[np.int32], "FLOAT": npt.NDArray[np.float32]}
    tensors = [(name, trtp.TensorDesc) for name in spec.input_names]
    attrs = [(name, attr_types[kind]) for name, kind in spec.attributes.items()]
    outputs = [("outputs", tuple[trtp.TensorDesc])]
    plugin_id = f"{PLUGIN_NAMESPACE}::{spec.name}"

    def dims(desc) -> list:
        return [desc.shape_expr[i] for i in range(desc.ndim)]

    def static(desc, tensor) -> list:
        """The batch (``tensor.batched``) stays symbolic; every other dimension of an exported graph is static."""
        values = dims(desc)
        fixed = values[1:] if tensor.batched else values
        if not all(expr.is_constant for expr in fixed):
            raise DeploytkError("a deploytk plugin input has a dynamic dimension other than the batch; re-export the model.")
        return values[:1] * tensor.batched + [int(expr.constant_value()) for expr in fixed]

    def register(**args):
        inputs = [args[name] for name in spec.input_names]
        fields = {name: scalar(args[name]) for name in spec.attributes}
        shape = output_shape(spec.name, [dims(d) for d in inputs], fields)
        return trtp.from_shape_expr(tuple(shape), dtype=trt.int64 if spec.output == INT64 else inputs[0].dtype)

    def autotune(**args):
        return [trtp.AutoTuneCombination(c, "LINEAR") for c in type_combinations(spec.name)]

    def aot_impl(**args):
        inputs = [args[name] for name in spec.input_names]
        fields = {name: scalar(args[name]) for name in spec.attributes}
        variant = launch_plan(spec.name, [static(d, t) for d, t in zip(inputs, spec.inputs, strict=True)], fields, names[inputs[0].dtype])
        compiled = compile_variant(variant, build_arch())
        params = trtp.KernelLaunchParams()
        params.grid_x, params.grid_y, params.grid_z = variant.plan.grid
        params.block_x = compiled.num_warps * 32
        params.shared_mem = compiled.shared_mem
        extra = trtp.SymIntExprs(len(variant.plan.ints))
        for i, value in enumerate(variant.plan.ints):
            extra[i] = trtp.SymInt32(value)
        return compiled.kernel_name, compiled.ptx, params, extra

    aot_result = tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]
    tactic = [("tactic", int)]
    functions = {
        "register": _function(f"{spec.name}_register", _signature(tensors + attrs, trtp.TensorDesc), register),
        "autotune": _function(f"{spec.name}_autotune", _signature(tensors + outputs, list[trtp.AutoTuneCombination]), autotune),
        "aot_impl": _function(f"{spec.name}_aot_impl", _signature(tensors + attrs + outputs + tactic, aot_result), aot_impl),
    }
    functions["register"].deploytk_op = spec.name  # how a retry recognises its own earlier registration
    return plugin_id, functions


__all__ = [
    "PLUGIN_NAMESPACE",
    "PLUGIN_VERSION",
    "PLUGIN_OPS",
    "register_plugins",
    "check_plugin_layer",
    "build_arch",
    "plugin_signature",
    "output_shape",
    "type_combinations",
    "scalar",
    "launch_plan",
]
