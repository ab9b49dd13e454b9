"""TensorRT plugin pieces that need no libnvinfer: AOT PTX, signatures, shape/type rules, launch plans, registration wiring."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from deploytk_plugins import aot
from deploytk_plugins import tensorrt_plugins as tp
from deploytk_plugins.aot import SHARED_MEM_LIMIT, compile_variant, kernel_variant, strip_hidden_params
from deploytk_plugins.definitions import PLUGINS

from deploytk.errors import DeploytkError
from deploytk.ops import OPS


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-c", "from deploytk.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TRITON_INTERPRET": "0"},
    )


def match_shapes(*dims, b=8, n=197):
    """Input shapes of a matching op: [B, N, d] for each d, [B, N] for None."""
    return [[b, n, d] if d else [b, n] for d in dims]


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_plugins_compile_writes_sm90_ptx_for_every_plugin_kernel(tmp_path):
    out = tmp_path / "ptx"
    result = run_cli("plugins", "compile", "--arch", "sm_90", "--output", str(out), "--json")
    assert result.returncode == 0, result.stderr
    index = json.loads(result.stdout)
    assert index == json.loads((out / "kernels.json").read_text())
    kernels = index["kernels"]
    assert {k["op"] for k in kernels} == set(tp.PLUGIN_OPS) == set(OPS)
    assert {(k["op"], k["dtype"]) for k in kernels} == {(op, d) for op in tp.PLUGIN_OPS for d in ("fp32", "fp16", "bf16")}
    assert len(kernels) == 48
    for k in kernels:
        ptx = (out / k["file"]).read_text()
        assert re.search(r"^\.target sm_90a?$", ptx, re.M), k["file"]
        assert f".entry {k['kernel_name']}(" in ptx
        assert k["block_x"] == 32 * k["num_warps"]
        assert re.search(rf"^\.version {re.escape(k['ptx_isa'])}$", ptx, re.M)  # the driver must support this PTX ISA
        # TensorRT is not documented to opt an AOT kernel into more than 48 KiB of dynamic shared memory
        assert k["shared_mem"] <= SHARED_MEM_LIMIT == 48 * 1024, k


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_100", "sm_120"])
def test_plugins_compile_writes_blackwell_ptx_for_every_plugin_kernel(tmp_path, arch):
    out = tmp_path / "ptx"
    result = run_cli("plugins", "compile", "--arch", arch, "--output", str(out), "--json")
    assert result.returncode == 0, result.stderr
    kernels = json.loads(result.stdout)["kernels"]
    assert len(kernels) == 48 and {k["op"] for k in kernels} == set(OPS)
    for k in kernels:
        ptx = (out / k["file"]).read_text()
        assert re.search(rf"^\.target {arch}a$", ptx, re.M) and f".entry {k['kernel_name']}(" in ptx, k["file"]
        assert re.search(rf"^\.version {re.escape(k['ptx_isa'])}$", ptx, re.M), k["file"]


def test_gpu_capabilities_map_to_the_arches_deploytk_compiles_for():
    assert [aot.arch_of_capability(c) for c in ("8.0", "8.7", "9.0", "10.0", "10.3", "12.0", "12.1")] == [
        "sm_80",
        "sm_87",
        "sm_90",
        "sm_100",
        "sm_103",
        "sm_120",
        "sm_121",
    ]
    with pytest.raises(DeploytkError, match=r"compute capability 7\.0, sm_70\) is not one deploytk compiles") as err:
        aot.arch_of_capability("7.0")
    assert "`merge_impl=native` and `attention_impl=native`" in err.value.hint


def test_an_arch_the_installed_triton_cannot_compile_is_refused_with_the_remedy(monkeypatch, tmp_path):
    monkeypatch.setattr(aot, "_triton_cannot_compile", lambda arch: "ptxas fatal: Value 'sm_120a' is not defined for option 'gpu-name'")
    with pytest.raises(DeploytkError, match=r"Triton \S+ cannot compile for sm_120: ptxas fatal") as err:
        aot.compile_all("sm_120", tmp_path / "ptx")
    assert "pip install -U triton" in err.value.hint and not (tmp_path / "ptx").exists()


def test_every_listed_arch_compiles_with_the_installed_triton():
    assert {arch: aot._triton_cannot_compile(arch) for arch in aot.ARCHES} == dict.fromkeys(aot.ARCHES, "")


def test_a_kernel_that_cannot_fit_the_shared_memory_limit_is_refused(monkeypatch):
    monkeypatch.setattr(aot, "SHARED_MEM_LIMIT", 1024)  # fp32 attention needs 45 KB at 3 stages, more than 1 KB at 1
    variant = kernel_variant("ProportionalAttention", [[8, 6, 197, 64]] * 3 + [[8, 197, 1]], {"scale": 0.125}, "fp32")
    with pytest.raises(DeploytkError, match=r"ProportionalAttention_fp32.*more than 1024 B of shared memory for sm_90 .*at 1 stage"):
        compile_variant(variant, "sm_90")


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_plugins_compile_refuses_unknown_arch_and_writes_nothing(tmp_path):
    result = run_cli("plugins", "compile", "--arch", "sm_70", "--output", str(tmp_path / "x"))
    assert result.returncode == 2 and "sm_80, sm_86, sm_87, sm_89, sm_90, sm_100, sm_103, sm_110, sm_120, sm_121" in result.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "op, shapes, attrs, dtype, kinds",
    [
        (
            "TokenAggregate",
            [[8, 197, 384], [8, 197, 1], [8, 197]],
            {"tokens_out": 181, "normalize": 1},
            "fp16",
            ["u64"] * 3 + ["u32"] * 3 + ["u64"],
        ),
        (
            "ToMeMatch",
            match_shapes(64, n=577),
            {"r": 16, "protected": 1, "sort_unmerged": 0},
            "fp32",
            ["u64", "u32", "u32", "u32", "u32", "u64"],
        ),
        (
            "MctfMatch",
            match_shapes(384, None, 1),
            {"r": 16, "protected": 1, "tau_sim": 1.0, "tau_info": 20.0, "tau_size": 40.0, "bidirection": 1},
            "fp16",
            ["u64"] * 3 + ["u32"] * 4 + ["u64"],
        ),
        ("SizeSplitMatch", match_shapes(64, 1), {"r": 16, "protected": 1}, "bf16", ["u64"] * 2 + ["u32"] * 4 + ["u64"]),
        ("TopKSelect", match_shapes(None, n=577), {"keep": 100, "protected": 1}, "fp32", ["u64", "u32", "u32", "u32", "u64"]),
        ("CrucialMatch", match_shapes(64, None, n=1025), {"keep": 100, "protected": 1}, "fp16", ["u64"] * 2 + ["u32"] * 4 + ["u64"]),
    ],
    ids=lambda v: v if isinstance(v, str) and v in OPS else "",
)
def test_compiled_kernel_takes_exactly_inputs_then_ints_then_outputs(op, shapes, attrs, dtype, kinds):
    """TensorRT's AOT convention, and nothing more: Triton's trailing scratch pointers are stripped."""
    k = compile_variant(kernel_variant(op, shapes, attrs, dtype), "sm_80")
    params = re.search(rf"\.entry {k.kernel_name}\((.*?)\)", k.ptx, re.S).group(1)
    assert re.findall(r"\.param \.(u64|u32|b32|s32)", params) == kinds


def test_variant_signature_types_each_pointer_by_its_input_kind():
    v = kernel_variant("TokenAggregate", [[8, 197, 384], [8, 197, 1], [8, 197]], {"tokens_out": 181, "normalize": 1}, "bf16")
    assert v.signature == {"x_ptr": "*bf16", "w_ptr": "*fp32", "dest_ptr": "*i64", "N": "i32", "C": "i32", "T": "i32", "out_ptr": "*bf16"}
    v = kernel_variant("ProportionalAttention", [[8, 6, 197, 64]] * 3 + [[8, 197, 1]], {"scale": 0.125}, "fp16")
    assert list(v.signature.values()) == ["*fp16"] * 3 + ["*fp32", "i32", "i32", "*fp16"]
    assert v.label == "ProportionalAttention_fp16_scale0p125_head_d64_block_m64_block_n64_block_d64"


def test_strip_hidden_params_refuses_a_kernel_that_uses_them():
    ptx = ".entry k(\n\t.param .u64 k_param_0,\n\t.param .u64 k_param_1\n)\n{\n\tld.param.u64 %rd1, [k_param_1];\n}"
    with pytest.raises(DeploytkError, match="uses Triton's hidden parameters"):
        strip_hidden_params(ptx, "k", 1)
    assert "k_param_1" not in strip_hidden_params(ptx.replace("[k_param_1]", "[k_param_0]"), "k", 1)


def test_plugin_attributes_arrive_as_one_element_arrays():
    assert tp.scalar(np.array([16], dtype=np.int32)) == 16 and isinstance(tp.scalar(np.array([16], dtype=np.int32)), int)
    assert tp.scalar(np.array([0.125], dtype=np.float32)) == 0.125
    with pytest.raises(DeploytkError, match="expected a scalar plugin attribute, got 2 values"):
        tp.scalar(np.array([1, 2], dtype=np.int32))


def test_output_shapes():
    assert tp.output_shape("TokenAggregate", [[8, 197, 384], [8, 197, 1], [8, 197]], {"tokens_out": 181}) == [8, 181, 384]
    assert tp.output_shape("ProportionalAttention", [[8, 6, 181, 64]] * 3 + [[8, 181, 1]], {}) == [8, 6, 181, 64]
    assert tp.output_shape("ToMeMatch", match_shapes(64), {}) == [8, 197]
    assert tp.output_shape("MctfMatch", match_shapes(384, None, 1), {}) == [8, 197]
    assert tp.output_shape("SizeSplitMatch", match_shapes(64, 1), {}) == [8, 197]
    assert tp.output_shape("CrucialMatch", match_shapes(64, None), {}) == [8, 197]
    assert tp.output_shape("TopKSelect", match_shapes(None), {}) == [8, 197]
    with pytest.raises(DeploytkError, match=r"ToMeMatch: metric must be rank 3 \[B, N, D\], got rank 2"):
        tp.output_shape("ToMeMatch", match_shapes(None), {})
    with pytest.raises(DeploytkError, match=r"TopKSelect: scores must be rank 2 \[B, N\], got rank 3"):
        tp.output_shape("TopKSelect", match_shapes(64), {})
    with pytest.raises(DeploytkError, match=r"TokenAggregate: x must be rank 3 \[B, N, C\], got rank 2"):
        tp.output_shape("TokenAggregate", [[8, 197], [8, 197, 1], [8, 197]], {"tokens_out": 181})
    with pytest.raises(DeploytkError, match=r"ProportionalAttention: q must be rank 4 \[B, H, N, D\], got rank 3"):
        tp.output_shape("ProportionalAttention", [[8, 181, 64]] * 3 + [[8, 181, 1]], {})


def test_type_combinations_keep_size_fp32_and_dest_int64():
    agg = tp.type_combinations("TokenAggregate")
    assert agg == ["FP32, FP32, INT64, FP32", "FP16, FP32, INT64, FP16", "BF16, FP32, INT64, BF16"]
    assert tp.type_combinations("ToMeMatch") == ["FP32, INT64", "FP16, INT64", "BF16, INT64"]
    assert tp.type_combinations("MctfMatch")[1] == "FP16, FP16, FP16, INT64"  # metric, received, size -> dest
    assert tp.type_combinations("TopKSelect") == ["FP32, INT64", "FP16, INT64", "BF16, INT64"]
    assert (
        tp.type_combinations("CrucialMatch")[2] == "BF16, BF16, INT64" and tp.type_combinations("SizeSplitMatch")[0] == "FP32, FP32, INT64"
    )
    attn = tp.type_combinations("ProportionalAttention")
    assert all(c.split(", ")[3] == "FP32" and len(c.split(", ")) == 5 for c in attn)
    with pytest.raises(DeploytkError, match="no TensorRT plugin for op 'Softmax'"):
        tp.type_combinations("Softmax")


class SymbolicBatch:
    """Stands in for TensorRT's ``ShapeExpr`` batch: it can be multiplied, never divided
    (``trtp.cdiv`` raises on two ints, so the grid must divide plain ints and keep the batch symbolic)."""

    def __init__(self, expr: str):
        self.expr = expr

    def __mul__(self, other):
        return SymbolicBatch(f"({self.expr})*{other}")

    __rmul__ = __mul__

    def __eq__(self, other):
        return isinstance(other, SymbolicBatch) and other.expr == self.expr

    __hash__ = None


AGGREGATE = ([[64, 197, 768], [64, 197, 1], [64, 197]], {"tokens_out": 181, "normalize": 1})
ATTENTION = ([[64, 12, 181, 64]] * 3 + [[64, 181, 1]], {"scale": 0.125})


def test_launch_plans():
    plan = tp.launch_plan("TokenAggregate", *AGGREGATE, "fp16").plan
    assert plan.grid == (6, 12, 64) and plan.ints == [197, 768, 181]  # 32-token x 64-channel tiles, batch last
    plan = tp.launch_plan("ProportionalAttention", *ATTENTION, "fp16").plan
    assert plan.grid == (3, 768, 1) and plan.ints == [181, 12]  # 64-query tiles, batch * heads
    plan = tp.launch_plan("ToMeMatch", match_shapes(64, b=64), {"r": 16, "protected": 1, "sort_unmerged": 1}, "fp32").plan
    assert plan.grid == (64, 1, 1) and plan.ints == [197, 64, 16, 1]  # one program per image


def test_launch_grids_keep_a_symbolic_batch_symbolic():
    """In the plugins the batch is a ShapeExpr: only the batch may be symbolic, the tiles are ints."""
    b = SymbolicBatch("B")

    def batched(shapes):
        return [[b, *s[1:]] for s in shapes]

    grid = tp.launch_plan("TokenAggregate", batched(AGGREGATE[0]), AGGREGATE[1], "fp16").plan.grid
    assert grid[:2] == (6, 12) and all(type(v) is int for v in grid[:2]) and grid[2] == b
    grid = tp.launch_plan("ProportionalAttention", batched(ATTENTION[0]), ATTENTION[1], "fp16").plan.grid
    assert grid[0] == 3 and type(grid[0]) is int and grid[1] == SymbolicBatch("(B)*12") and grid[2] == 1
    grid = tp.launch_plan("TopKSelect", batched(match_shapes(None)), {"keep": 100, "protected": 1}, "fp32").plan.grid
    assert grid == (b, 1, 1)


def test_every_op_has_a_plugin_definition_whose_examples_plan():
    assert set(PLUGINS) == set(OPS) == set(tp.PLUGIN_OPS)
    for op, definition in PLUGINS.items():
        for example in definition.examples:
            assert tp.output_shape(op, example.shapes, example.attrs)  # the examples fit the op's signature
            assert kernel_variant(op, example.shapes, example.attrs, "fp16").plan.ints


def test_plugin_signatures_are_the_onnx_nodes():
    """TensorRT passes every declared attribute; the plugin's signature is read off the ONNX function
    (an independent reading here: the FunctionProto), and the torch op takes the same inputs and
    attributes in the same order (less ``tokens``, which the translation derives)."""
    for op in tp.PLUGIN_OPS:
        fn = OPS[op].onnx_function.to_function_proto()
        attrs = [a for a in fn.attribute] + [a.name for a in fn.attribute_proto]
        attrs = [a for a in attrs if a not in ("plugin_namespace", "plugin_version")]
        inputs, signature_attrs = tp.plugin_signature(op)
        assert inputs == list(fn.input) and list(signature_attrs) == attrs, op
        torch_args = [a.name for a in OPS[op].torch_op._opoverload._schema.arguments]
        assert torch_args == inputs + [a for a in attrs if a != "tokens"], op


def test_register_plugins_without_tensorrt_says_how_to_install():
    from deploytk.optional import tensorrt_version

    if tensorrt_version() is not None:
        pytest.skip("TensorRT is installed here")
    with pytest.raises(DeploytkError, match="needs TensorRT") as err:
        tp.register_plugins()
    assert "pip install tensorrt" in str(err.value) or "tensorrt" in str(err.value).lower()


@pytest.mark.trt
def test_plugins_register_with_tensorrt():
    import tensorrt as trt

    tp.register_plugins()
    registry = trt.get_plugin_registry()
    for op in tp.PLUGIN_OPS:
        assert registry.get_creator(op, tp.PLUGIN_VERSION, tp.PLUGIN_NAMESPACE) is not None, op
