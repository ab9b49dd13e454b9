"""TensorRT plugin pieces that need no libnvinfer: AOT PTX, shape/type rules, launch parameters."""

import json
import os
import re
import subprocess
import sys

import pytest

from deploytk.errors import DeploytkError
from plugins import tensorrt_plugins as tp
from plugins.aot import (
    SHARED_MEM_LIMIT,
    compile_variant,
    crucial_match_variant,
    mctf_match_variant,
    size_split_match_variant,
    strip_hidden_params,
    token_aggregate_variant,
    tome_match_variant,
    topk_select_variant,
)


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-c", "from deploytk.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TRITON_INTERPRET": "0"},
    )


def test_plugins_compile_writes_sm90_ptx_for_every_plugin_kernel(tmp_path):
    out = tmp_path / "ptx"
    result = run_cli("plugins", "compile", "--arch", "sm_90", "--output", str(out), "--json")
    assert result.returncode == 0, result.stderr
    index = json.loads(result.stdout)
    assert index == json.loads((out / "kernels.json").read_text())
    kernels = index["kernels"]
    assert {k["op"] for k in kernels} == set(tp.PLUGIN_OPS)
    assert {(k["op"], k["dtype"]) for k in kernels} == {(op, d) for op in tp.PLUGIN_OPS for d in ("fp32", "fp16", "bf16")}
    for k in kernels:
        ptx = (out / k["file"]).read_text()
        assert re.search(r"^\.target sm_90a?$", ptx, re.M), k["file"]
        assert f".entry {k['kernel_name']}(" in ptx
        assert k["block_x"] == 32 * k["num_warps"]
        # TensorRT is not documented to opt an AOT kernel into more than 48 KiB of dynamic shared memory
        assert k["shared_mem"] <= SHARED_MEM_LIMIT == 48 * 1024, k


def test_a_kernel_that_cannot_fit_the_shared_memory_limit_is_refused(monkeypatch):
    import plugins.aot as aot

    monkeypatch.setattr(aot, "SHARED_MEM_LIMIT", 1024)  # fp32 attention needs 45 KB at 3 stages, more than 1 KB at 1
    with pytest.raises(DeploytkError, match=r"ProportionalAttention_fp32.*more than 1024 B of shared memory for sm_90 .*at 1 stage"):
        compile_variant(aot.proportional_attention_variant("fp32", 64, 0.125), "sm_90")


def test_plugins_compile_refuses_unknown_arch_and_writes_nothing(tmp_path):
    result = run_cli("plugins", "compile", "--arch", "sm_70", "--output", str(tmp_path / "x"))
    assert result.returncode == 2 and "sm_80, sm_86, sm_89, sm_90" in result.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "variant, kinds",
    [
        (token_aggregate_variant("fp16", 384, True), ["u64", "u64", "u64", "u32", "u32", "u32", "u64"]),  # x, w, dest; N, C, T; out
        (tome_match_variant("fp32", 577, 64, False), ["u64", "u32", "u32", "u32", "u32", "u64"]),  # metric; N, D, R, P; dest
        (mctf_match_variant("fp16", 197, 384, 1.0, 20.0, 40.0, True), ["u64"] * 3 + ["u32"] * 4 + ["u64"]),  # metric, received, size
        (size_split_match_variant("bf16", 197, 64), ["u64"] * 2 + ["u32"] * 4 + ["u64"]),  # metric, size; N, D, R, P; dest
        (topk_select_variant("fp32", 577), ["u64", "u32", "u32", "u32", "u64"]),  # scores; N, KEEP, P; dest
        (crucial_match_variant("fp16", 1025, 64), ["u64"] * 2 + ["u32"] * 4 + ["u64"]),  # metric, scores; N, D, KEEP, P; dest
    ],
    ids=lambda v: v.op if hasattr(v, "op") else "",
)
def test_compiled_kernel_takes_exactly_inputs_then_ints_then_outputs(variant, kinds):
    """TensorRT's AOT convention, and nothing more: Triton's trailing scratch pointers are stripped."""
    k = compile_variant(variant, "sm_80")
    params = re.search(rf"\.entry {k.kernel_name}\((.*?)\)", k.ptx, re.S).group(1)
    assert re.findall(r"\.param \.(u64|u32|b32|s32)", params) == kinds


def test_strip_hidden_params_refuses_a_kernel_that_uses_them():
    ptx = ".entry k(\n\t.param .u64 k_param_0,\n\t.param .u64 k_param_1\n)\n{\n\tld.param.u64 %rd1, [k_param_1];\n}"
    with pytest.raises(DeploytkError, match="uses Triton's hidden parameters"):
        strip_hidden_params(ptx, "k", 1)
    assert "k_param_1" not in strip_hidden_params(ptx.replace("[k_param_1]", "[k_param_0]"), "k", 1)


def test_plugin_attributes_arrive_as_one_element_arrays():
    import numpy as np

    assert tp.scalar(np.array([16], dtype=np.int32)) == 16 and isinstance(tp.scalar(np.array([16], dtype=np.int32)), int)
    assert tp.scalar(np.array([0.125], dtype=np.float32)) == 0.125
    with pytest.raises(DeploytkError, match="expected a scalar plugin attribute, got 2 values"):
        tp.scalar(np.array([1, 2], dtype=np.int32))


def test_output_shapes():
    assert tp.token_aggregate_shape([8, 197, 384], 181) == [8, 181, 384]
    assert tp.proportional_attention_shape([8, 6, 181, 64]) == [8, 6, 181, 64]
    for op in ("ToMeMatch", "MctfMatch", "SizeSplitMatch", "CrucialMatch"):
        assert tp.match_shape(op, [8, 197, 64]) == [8, 197]
    assert tp.match_shape("TopKSelect", [8, 197]) == [8, 197]
    with pytest.raises(DeploytkError, match=r"ToMeMatch: metric must be rank 3 \[B, N, D\], got rank 2"):
        tp.match_shape("ToMeMatch", [8, 197])
    with pytest.raises(DeploytkError, match=r"TopKSelect: scores must be rank 2 \[B, N\], got rank 3"):
        tp.match_shape("TopKSelect", [8, 197, 64])
    with pytest.raises(DeploytkError, match="rank 3"):
        tp.token_aggregate_shape([8, 197], 181)
    with pytest.raises(DeploytkError, match="rank 4"):
        tp.proportional_attention_shape([8, 181, 64])


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


def test_launch_parameters():
    agg = tp.token_aggregate_launch(64, 197, 768, 181, {"BLOCK_T": 32, "BLOCK_C": 64})
    assert agg == {"grid": (6, 12, 64), "int_args": [197, 768, 181]}
    attn = tp.proportional_attention_launch(64, 12, 181, {"BLOCK_M": 64})
    assert attn == {"grid": (3, 768, 1), "int_args": [181, 12]}
    assert tp.match_launch(64, [197, 64, 16, 1]) == {"grid": (64, 1, 1), "int_args": [197, 64, 16, 1]}  # one program per image


def test_launch_grids_keep_a_symbolic_batch_symbolic():
    """In the plugins the batch is a ShapeExpr: only the batch may be symbolic, the tiles are ints."""
    b = SymbolicBatch("B")
    agg = tp.token_aggregate_launch(b, 197, 768, 181, {"BLOCK_T": 32, "BLOCK_C": 64})["grid"]
    assert agg[:2] == (6, 12) and all(type(v) is int for v in agg[:2]) and agg[2] == b
    attn = tp.proportional_attention_launch(b, 12, 181, {"BLOCK_M": 64})["grid"]
    assert attn[0] == 3 and type(attn[0]) is int and attn[1] == SymbolicBatch("(B)*12") and attn[2] == 1
    assert tp.match_launch(b, [197, 64, 16, 1])["grid"] == (b, 1, 1)


def test_register_plugins_without_tensorrt_says_how_to_install():
    from deploytk.backends.trt import tensorrt_version

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


def _decorated_signatures() -> dict:
    """(decorator, op) -> parameter names of each function in register_plugins, read from the source (no TensorRT needed)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(tp))
    found = {}
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef):
            for dec in fn.decorator_list:
                if (
                    isinstance(dec, ast.Call)
                    and isinstance(dec.func, ast.Attribute)
                    and dec.func.attr in ("register", "autotune", "aot_impl")
                ):
                    op = ast.unparse(dec.args[0]).split("::")[-1].rstrip("\"'")
                    found[(dec.func.attr, op)] = [a.arg for a in fn.args.args]
    return found


def test_plugin_signatures_match_the_onnx_nodes():
    """TensorRT passes every declared attribute (register: by name; aot_impl: positionally, then outputs, tactic)."""
    from deploytk.ops import OPS

    sigs = _decorated_signatures()
    for op in tp.PLUGIN_OPS:
        fn = OPS[op].onnx_function.to_function_proto()
        inputs, attrs = list(fn.input), [a for a in fn.attribute if a not in ("plugin_namespace", "plugin_version")]
        attrs += [a.name for a in fn.attribute_proto if a.name not in ("plugin_namespace", "plugin_version")]
        assert sigs[("register", op)] == inputs + attrs, op
        assert sigs[("aot_impl", op)] == inputs + attrs + ["outputs", "tactic"], op
        assert sigs[("autotune", op)] == inputs + ["outputs"], op
