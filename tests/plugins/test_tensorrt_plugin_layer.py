"""deploytk's plugins through TensorRT's own plugin layer: the real ``tensorrt.plugin`` sources of TensorRT 10.9 and 11.4.

``register_plugins()`` runs against the pure-Python ``tensorrt.plugin`` package from NVIDIA's
bindings wheels (``trt_sources``), on a documented stand-in for the compiled module
(``trt_standin``). ``Build`` then replays, per plugin node, what TensorRT's ONNX parser and builder
ask a quickly-deployable plugin, in their order: the parser finds the creator and passes the node's
attributes as the creator's fields, creates the plugin (strict AOT, as ``deploytk build`` marks
every plugin node ``aot=1``), asks output types (with placeholder shapes) and output shape
expressions (batch symbolic); the builder asks the supported type/format combinations, configures
one, sets the tactic, asks launch parameters (this runs deploytk's ``aot_impl``, which compiles the
kernel to PTX with Triton) and the kernel. Everything TensorRT's sources do with deploytk's answers
runs for real; what libnvinfer does (its own validation, timing, the driver's PTX JIT, the launch)
is not here.
"""

import ast
import importlib
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import trt_sources
import trt_standin
from deploytk_plugins import aot
from deploytk_plugins import tensorrt_plugins as tp
from deploytk_plugins.definitions import PLUGINS

from deploytk.errors import DeploytkError
from deploytk.ops import OPS
from deploytk.ops.spec import FP32, INT64

ROOT = Path(__file__).resolve().parents[2]
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
PROFILE = (1, 8, 64)  # the optimization profile's batch min / opt / max


def _drop_tensorrt_modules():
    for name in [m for m in sys.modules if m == "tensorrt" or m.startswith("tensorrt.")]:
        del sys.modules[name]


@pytest.fixture
def plugin_layer(monkeypatch):
    """``load(version, with_aot=True)`` -> (trt, trtp): a fresh TensorRT plugin layer, and deploytk not yet registered."""
    saved = {m: sys.modules[m] for m in list(sys.modules) if m == "tensorrt" or m.startswith("tensorrt.")}

    def load(version: str, with_aot: bool = True):
        try:
            folder = trt_sources.plugin_sources(version)
        except trt_sources.Unavailable as err:
            pytest.skip(f"the tensorrt.plugin sources of TensorRT {version} are not available here: {err}")
        _drop_tensorrt_modules()
        sys.modules["tensorrt"] = trt_standin.make_tensorrt(version, folder, with_aot)
        trtp = importlib.import_module("tensorrt.plugin")
        monkeypatch.setattr(tp, "_registered", False)
        return sys.modules["tensorrt"], trtp

    yield load
    _drop_tensorrt_modules()
    sys.modules.update(saved)


_compiled = {}


@pytest.fixture
def gpu(monkeypatch):
    """``gpu(major, minor)``: the compute capability the build runs on; compiled PTX is memoized per kernel and arch."""
    real_compile = aot.compile_variant

    def memoized(variant, arch):
        key = (variant.label, arch)
        if key not in _compiled:
            _compiled[key] = real_compile(variant, arch)
        return _compiled[key]

    monkeypatch.setattr(tp, "compile_variant", memoized)

    def set_capability(major: int, minor: int):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *device: (major, minor))

    set_capability(9, 0)
    return set_capability


class Build:
    """One plugin node through TensorRT's parser and builder calls (see the module docstring)."""

    def __init__(self, trt, op: str, attrs: dict, request="STRICT_AOT"):
        self.trt, self.op, self.spec = trt, op, OPS[op]
        creator = trt.get_plugin_registry().get_creator(op, tp.PLUGIN_VERSION, tp.PLUGIN_NAMESPACE)
        assert creator is not None, f"no creator registered for {tp.PLUGIN_NAMESPACE}::{op}"
        declared = {f.name: f.type for f in creator.field_names}
        assert set(declared) == set(attrs), f"{op}: the creator's fields {sorted(declared)} are not the node's attributes {sorted(attrs)}"
        numpy_type = {trt.PluginFieldType.INT32: np.int32, trt.PluginFieldType.FLOAT32: np.float32}
        # onnx-tensorrt's loadFields: one field per creator field, the node attribute converted to the declared type
        fields = [trt.PluginField(name, np.array([attrs[name]], dtype=numpy_type[kind]), kind) for name, kind in declared.items()]
        request = None if request is None else getattr(trt.QuickPluginCreationRequest, request)
        self.plugin = creator.create_plugin(op, tp.PLUGIN_NAMESPACE, trt.PluginFieldCollection(fields), trt.TensorRTPhase.BUILD, request)

    def type_of(self, kind: str, dtype: str):
        trt = self.trt
        return {FP32: trt.float32, INT64: trt.int64}.get(kind, {"fp32": trt.float32, "fp16": trt.float16, "bf16": trt.bfloat16}[dtype])

    def run(self, shapes: list, dtype: str) -> dict:
        """shapes: the node's input shapes with the batch first (its value is ignored: the batch is dynamic)."""
        trt, plugin = self.trt, self.plugin
        kinds = [t.kind for t in self.spec.inputs]
        in_types = [self.type_of(k, dtype) for k in kinds]
        assert plugin.get_num_outputs() == 1
        (out_type,) = plugin.get_output_data_types(in_types, [len(s) for s in shapes])

        builder = trt_standin.IExprBuilder()
        batch = trt_standin.batch_expr()
        batched = [t.batched for t in self.spec.inputs]
        in_exprs = []
        for dims, b in zip(shapes, batched, strict=True):
            exprs = trt.DimsExprs(len(dims))
            exprs[:] = [batch] + [builder.constant(d) for d in dims[1:]] if b else [builder.constant(d) for d in dims]
            in_exprs.append(exprs)
        (out_exprs,) = plugin.get_output_shapes(in_exprs, [], builder)

        plugin = plugin.clone()  # the builder works on clones of the network's plugin
        lo, opt, hi = PROFILE
        out_static = [d.evaluate(opt) for d in out_exprs]

        def dynamic(dims, dtype_, b=True):
            if not b:  # an input without a batch dimension (ATSSample's steps) is static
                return trt.DynamicPluginTensorDesc(trt.PluginTensorDesc(list(dims), dtype_, trt.TensorFormat.LINEAR), dims, dims, dims)
            desc = trt.PluginTensorDesc([-1, *dims[1:]], dtype_, trt.TensorFormat.LINEAR)
            return trt.DynamicPluginTensorDesc(desc, [lo, *dims[1:]], [opt, *dims[1:]], [hi, *dims[1:]])

        in_out = [dynamic(s, t, b) for s, t, b in zip(shapes, in_types, batched, strict=True)] + [dynamic(out_static, out_type)]
        offered = plugin.get_supported_format_combinations(in_out, len(shapes))
        width = len(in_out)
        combinations = [tuple(d.type for d in offered[i : i + width]) for i in range(0, len(offered), width)]
        assert all(d.format == trt.TensorFormat.LINEAR for d in offered)
        plugin.configure_plugin(in_out[:-1], in_out[-1:])
        tactics = plugin.get_valid_tactics()
        plugin.set_tactic(0)
        params, extra = trt_standin.KernelLaunchParamsStruct(), trt_standin.SymExpressions()
        plugin.get_launch_params(in_exprs, in_out, len(shapes), params, extra, builder)
        name, ptx = plugin.get_kernel([d.desc for d in in_out[:-1]], [in_out[-1].desc])
        return {
            "out_type": out_type,
            "out_exprs": out_exprs,
            "combinations": combinations,
            "tactics": tactics,
            "params": params,
            "extra": list(extra),
            "kernel_name": name,
            "ptx": ptx.decode(),
            "in_types": in_types,
        }


def at_batch(shapes: list, spec, batch: int) -> list:
    """The node's input shapes at a concrete batch (inputs without a batch dimension as they are)."""
    return [[batch, *s[1:]] if t.batched else list(s) for s, t in zip(shapes, spec.inputs, strict=True)]


def _value(sym, batch: int) -> int:
    """An ISymExpr (launch parameter or extra argument) at a concrete batch."""
    return sym.expr.evaluate(batch)


def _reference_output(op: str, shapes: list, attrs: dict, batch: int, dtype: str) -> torch.Tensor:
    """The torch op's own output (its fake, on meta tensors) at a concrete batch: an independent output shape and type."""
    spec = OPS[op]
    torch_dtype = {FP32: torch.float32, INT64: torch.int64}
    tensors = [
        torch.empty(s, dtype=torch_dtype.get(t.kind, DTYPES[dtype]), device="meta")
        for s, t in zip(at_batch(shapes, spec, batch), spec.inputs, strict=True)
    ]
    arguments = spec.overload._schema.arguments[len(tensors) :]
    cast = {"int": int, "float": float, "bool": bool}
    return spec.torch_op(*tensors, *[cast[str(a.type)](attrs[a.name]) for a in arguments])


def _entry_params(ptx: str, kernel_name: str) -> list[str]:
    start = ptx.index(f".entry {kernel_name}(")
    return [p.split()[1] for p in ptx[start : ptx.index(")", start)].split("(", 1)[1].split(",")]


CASES = [(op, example, dtype) for op, definition in PLUGINS.items() for example in definition.examples[:1] for dtype in DTYPES]


@pytest.mark.parametrize("version", trt_sources.VERSIONS)
def test_every_plugin_builds_through_tensorrts_plugin_layer(plugin_layer, gpu, version):
    trt, trtp = plugin_layer(version)
    tp.register_plugins()
    for op, example, dtype in CASES:
        build = Build(trt, op, example.attrs)
        assert isinstance(build.plugin, trt.IPluginV3QuickAOTBuild), f"{op}: strict AOT must give an AOT plugin"
        got = build.run(example.shapes, dtype)
        where = f"{op} {dtype} (TensorRT {version})"

        expected_out = build.type_of(OPS[op].output, dtype)
        assert got["out_type"] == expected_out, where
        assert tuple(got["in_types"]) + (expected_out,) in got["combinations"], where
        assert got["tactics"] == [], where  # no custom tactics: TensorRT runs tactic 0
        for batch in PROFILE:
            reference = _reference_output(op, example.shapes, example.attrs, batch, dtype)
            assert [d.evaluate(batch) for d in got["out_exprs"]] == list(reference.shape), where

        params = got["params"]
        block = _value(params.block_x, 1)
        assert (_value(params.block_y, 1), _value(params.block_z, 1)) == (1, 1), where
        threads = re.search(r"^\.(?:reqntid|maxntid) (\d+)", got["ptx"], re.M)
        assert threads and int(threads.group(1)) == block, f"{where}: block_x {block} is not the kernel's thread count"
        assert _value(params.shared_mem, 1) <= aot.SHARED_MEM_LIMIT, where
        for batch in PROFILE:
            concrete = at_batch(example.shapes, OPS[op], batch)
            plan = OPS[op].kernel_module().plan(concrete, example.attrs, dtype)  # the torch launcher's plan at this batch
            grid = tuple(_value(getattr(params, f"grid_{axis}"), batch) for axis in "xyz")
            assert grid == tuple(int(g) for g in plan.grid), where
            assert [_value(e, batch) for e in got["extra"]] == plan.ints, where
        assert all(e.dtype == trt.PluginArgDataType.INT32 for e in got["extra"]), where
        # TensorRT launches the kernel with the inputs, the extra ints and the output, nothing else
        assert len(_entry_params(got["ptx"], got["kernel_name"])) == len(example.shapes) + len(got["extra"]) + 1, where
        assert re.search(r"^\.target sm_90a?$", got["ptx"], re.M), where


@pytest.mark.parametrize("version", trt_sources.VERSIONS)
def test_the_registered_functions_have_the_onnx_nodes_signature(plugin_layer, version):
    """What TensorRT stored per plugin: inputs and attributes in the ONNX node's order, int32/float32 arrays, AOT only."""
    trt, trtp = plugin_layer(version)
    tp.register_plugins()
    registry = sys.modules["tensorrt.plugin._lib"].QDP_REGISTRY
    for op in tp.PLUGIN_OPS:
        definition = registry[f"deploytk::{op}"]
        inputs, attrs = tp.plugin_signature(op)
        assert definition.input_tensor_names == inputs and list(definition.input_attrs) == list(attrs), op
        arrays = {"INT": np.typing.NDArray[np.int32], "FLOAT": np.typing.NDArray[np.float32]}
        assert list(definition.input_attrs.values()) == [arrays[kind] for kind in attrs.values()], op
        assert definition.aot_impl_attr_names == list(attrs) and definition.impl_func is None, op
        assert definition.num_outputs == 1, op


@pytest.mark.parametrize("version", trt_sources.VERSIONS)
def test_without_an_explicit_request_the_only_implementation_aot_is_used(plugin_layer, gpu, version):
    trt, _ = plugin_layer(version)
    tp.register_plugins()
    example = PLUGINS["ToMeMatch"].examples[0]
    assert isinstance(Build(trt, "ToMeMatch", example.attrs, request="PREFER_JIT").plugin, trt.IPluginV3QuickAOTBuild)
    with pytest.raises(ValueError, match="JIT implementation requested, but not defined"):
        Build(trt, "ToMeMatch", example.attrs, request="STRICT_JIT")  # why `deploytk build` marks every plugin node aot=1


@pytest.mark.slow
def test_exported_graph_nodes_build_as_plugins(plugin_layer, gpu, digits_plugin_nodes):
    """The plugin nodes of real exports (every op, as deploytk build hands them to the parser) build through the layer."""
    trt, _ = plugin_layer(trt_sources.VERSIONS[-1])
    tp.register_plugins()
    assert {op for op, _, _ in digits_plugin_nodes} == set(tp.PLUGIN_OPS)
    for op, shapes, attrs in digits_plugin_nodes:
        got = Build(trt, op, attrs).run(shapes, "fp32")
        assert [d.evaluate(3) for d in got["out_exprs"]] == list(_reference_output(op, shapes, attrs, 3, "fp32").shape), op


#: digits exports that together hold every deploytk op
DIGITS_METHODS = (
    "digits_vit_mctf_r4",
    "digits_vit_atm",
    "digits_vit_topk_k70",
    "digits_vit_crucial_k70",
    "digits_vit_kmedoids_k70",
    "digits_vit_dpcknn_k70",
    "digits_vit_ats_k70",
    "digits_vit_dynamicvit_k70",
    "digits_vit_pitome_k90",
)
#: a method without a digits config (VisionZip gives a VLM tower's token set), run on the digits model
VISIONZIP_ON_DIGITS = {
    "merge": {"method": "visionzip", "prop_attn": False, "options": {"dominant": 33, "contextual": 8}},
    "export": {"img_size": 32, "output": "tokens", "feature_layer": -2, "keep_prefix_tokens": True},
}


@pytest.fixture(scope="module")
def digits_plugin_nodes(tmp_path_factory):
    """(op, input shapes, attributes) of every plugin node `deploytk build` hands the parser, from real digits exports."""
    import onnx

    from deploytk.build.builder import _force_aot
    from deploytk.build.graph import prepare_for_build
    from deploytk.build.options import BuildOptions
    from deploytk.config import config_from_dict
    from deploytk.exporter.pipeline import run_export
    from deploytk.ops import PLUGIN_ATTRIBUTES

    from helpers import digits_config

    dense = digits_config("digits_vit_dense").model_dump(exclude_unset=True)
    configs = {stem: digits_config(stem) for stem in DIGITS_METHODS} | {"visionzip": config_from_dict(dense | VISIONZIP_ON_DIGITS)}
    nodes = []
    for stem, cfg in configs.items():
        out = tmp_path_factory.mktemp("export") / stem
        run_export(cfg, out)
        model, plugin_ops = prepare_for_build(onnx.load(str(out / "model.onnx")), BuildOptions(), tp.PLUGIN_OPS)
        _force_aot(model, plugin_ops)
        inferred = onnx.shape_inference.infer_shapes(model).graph
        shapes = {v.name: [d.dim_value or 1 for d in v.type.tensor_type.shape.dim] for v in [*inferred.value_info, *inferred.input]}
        for node in model.graph.node:
            if node.op_type not in plugin_ops:
                continue
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            assert attrs.pop("aot") == 1 and all(attrs.pop(k).decode() == v for k, v in PLUGIN_ATTRIBUTES.items()), node.name
            nodes.append((node.op_type, [shapes[name] for name in node.input], attrs))
    return nodes


# ---- the defects this harness found (each test fails on the code before the fix) ---------


def test_tensorrt_without_aot_plugins_is_refused_clearly(plugin_layer):
    """TensorRT 10.6-10.8: tensorrt.plugin imports, but KernelLaunchParams exists only with AOT (10.9+)."""
    trt, trtp = plugin_layer("10.9.0.34", with_aot=False)
    trt.__version__ = "10.8.0.43"
    assert not hasattr(trtp, "KernelLaunchParams")
    with pytest.raises(
        DeploytkError, match=r"need TensorRT >= 10\.9.*this is TensorRT 10\.8\.0\.43 \(its tensorrt.plugin lacks KernelLaunchParams"
    ):
        tp.register_plugins()
    assert not sys.modules["tensorrt.plugin._lib"].QDP_REGISTRY  # nothing half-registered


def test_a_registration_tensorrt_refused_fails_the_same_way_again_then_completes(plugin_layer, monkeypatch):
    """TensorRT cannot unregister: after it refuses one op, a retry must not trip over the ops registered before it."""
    trt, trtp = plugin_layer(trt_sources.VERSIONS[-1])
    real_aot_impl = trtp.aot_impl

    def refusing(plugin_id):
        if plugin_id == "deploytk::MctfMatch":
            raise ValueError("simulated refusal of the aot_impl signature")
        return real_aot_impl(plugin_id)

    monkeypatch.setattr(trtp, "aot_impl", refusing)
    for _ in range(2):
        with pytest.raises(DeploytkError, match="refused the plugin deploytk::MctfMatch: simulated refusal"):
            tp.register_plugins()
    monkeypatch.setattr(trtp, "aot_impl", real_aot_impl)
    tp.register_plugins()
    registry = sys.modules["tensorrt.plugin._lib"].QDP_REGISTRY
    assert sorted(registry) == sorted(f"deploytk::{op}" for op in tp.PLUGIN_OPS)
    assert all(d.aot_impl_func is not None and d.autotune_func is not None for d in registry.values())
    assert all(trt.get_plugin_registry().get_creator(op, "1", "deploytk") for op in tp.PLUGIN_OPS)


def test_a_foreign_plugin_with_a_deploytk_name_is_not_overwritten(plugin_layer):
    trt, trtp = plugin_layer(trt_sources.VERSIONS[-1])

    @trtp.register("deploytk::TopKSelect")
    def foreign(x: trtp.TensorDesc) -> trtp.TensorDesc:
        return x.like()

    with pytest.raises(DeploytkError, match="another TensorRT plugin named deploytk::TopKSelect"):
        tp.register_plugins()


@pytest.mark.parametrize("capability, target", [((10, 0), "sm_100a"), ((12, 0), "sm_120a")])
def test_blackwell_builds_compile_native_ptx(plugin_layer, gpu, capability, target):
    """On a Blackwell GPU aot_impl compiles for it (it used to raise "--arch 'sm_120' is not supported" mid-build)."""
    trt, _ = plugin_layer(trt_sources.VERSIONS[-1])
    tp.register_plugins()
    gpu(*capability)
    for op, example, dtype in CASES[1::3]:  # every op, in fp16
        got = Build(trt, op, example.attrs).run(example.shapes, dtype)
        assert re.search(rf"^\.target {target}$", got["ptx"], re.M), op


def test_a_gpu_deploytk_does_not_compile_for_is_named_with_the_supported_list(plugin_layer, gpu):
    trt, _ = plugin_layer(trt_sources.VERSIONS[-1])
    tp.register_plugins()
    gpu(7, 5)
    example = PLUGINS["TopKSelect"].examples[0]
    with pytest.raises(DeploytkError, match=r"compute capability 7\.5, sm_75.*supported: sm_80, sm_86, sm_87, sm_89, sm_90, sm_100"):
        Build(trt, "TopKSelect", example.attrs).run(example.shapes, "fp32")


def tensorrt_names_used() -> set[str]:
    """The TensorRT attributes the builder and the trt backend touch: on ``trt``, and on the TensorRT objects they hold."""
    trt_objects = {"builder", "config", "network", "parser", "profile"}
    used = set()
    for path in (ROOT / "deploytk" / "build" / "builder.py", ROOT / "deploytk" / "backends" / "trt.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            chain, base = [], node
            while isinstance(base, ast.Attribute):
                chain.insert(0, base.attr)
                base = base.value
            if not isinstance(base, ast.Name):
                continue
            if base.id == "trt":
                used.update(chain)
            elif base.id in trt_objects:
                used.add(chain[0])
            elif base.id == "self" and chain[0] in {"engine", "context", "runtime"} and len(chain) > 1:
                used.add(chain[1])
    return {name for name in used if not name.startswith("__")}


@pytest.mark.parametrize("version", trt_sources.VERSIONS)
def test_the_tensorrt_api_deploytk_calls_exists_in_the_compiled_bindings(version):
    """Every TensorRT name the builder and the trt backend use is exported by that version's tensorrt.so (11.x removed
    the implicitly-typed network and several builder flags; nothing deploytk calls may be among them)."""
    try:
        exported = trt_sources.api_names(version)
    except trt_sources.Unavailable as err:
        pytest.skip(f"the TensorRT {version} bindings are not available here: {err}")
    used = tensorrt_names_used()
    assert {"STRONGLY_TYPED", "build_serialized_network", "set_timing_cache", "execute_async_v3", "num_io_tensors"} <= used
    missing = sorted(name for name in used if not trt_sources.exports(exported, name))
    assert not missing, f"not in TensorRT {version}'s bindings: {missing}"


def test_the_api_check_can_see_a_removed_name():
    removed = {"EXPLICIT_BATCH", "REJECT_EMPTY_ALGORITHMS"}  # gone in 11.x, present in 10.9
    try:
        old, new = trt_sources.api_names("10.9.0.34"), trt_sources.api_names("11.4.0.106")
        assert all(trt_sources.exports(old, name) and not trt_sources.exports(new, name) for name in removed)
    except trt_sources.Unavailable as err:
        pytest.skip(f"the TensorRT bindings are not available here: {err}")
