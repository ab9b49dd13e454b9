"""TensorRT plugin pieces that need no libnvinfer: AOT PTX, shape/type rules, launch parameters."""

import json
import os
import re
import subprocess
import sys

import pytest

from deploytk.errors import DeploytkError
from plugins import tensorrt_plugins as tp
from plugins.aot import compile_variant, token_aggregate_variant


def run_cli(*args):
    return subprocess.run([sys.executable, "-c", "from deploytk.cli import main; main()", *args], capture_output=True, text=True,
                          env={**os.environ, "TRITON_INTERPRET": "0"})


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
        assert k["block_x"] == 32 * k["num_warps"] and k["shared_mem"] <= 227 * 1024


def test_plugins_compile_refuses_unknown_arch_and_writes_nothing(tmp_path):
    result = run_cli("plugins", "compile", "--arch", "sm_70", "--output", str(tmp_path / "x"))
    assert result.returncode == 2 and "sm_80, sm_86, sm_89, sm_90" in result.stderr
    assert not (tmp_path / "x").exists()


def test_compiled_kernel_takes_inputs_then_ints_then_outputs():
    """TensorRT's AOT convention: input pointers, extra int args, output pointers (3 + 3 + 1 params here)."""
    k = compile_variant(token_aggregate_variant("fp16", 384, True), "sm_80")
    params = re.search(rf"\.entry {k.kernel_name}\((.*?)\)", k.ptx, re.S).group(1)
    kinds = re.findall(r"\.param \.(u64|u32|b32|s32)", params)
    assert kinds[:7] == ["u64", "u64", "u64", "u32", "u32", "u32", "u64"]


def test_output_shapes():
    assert tp.token_aggregate_shape([8, 197, 384], 181) == [8, 181, 384]
    assert tp.proportional_attention_shape([8, 6, 181, 64]) == [8, 6, 181, 64]
    with pytest.raises(DeploytkError, match="rank 3"):
        tp.token_aggregate_shape([8, 197], 181)
    with pytest.raises(DeploytkError, match="rank 4"):
        tp.proportional_attention_shape([8, 181, 64])


def test_type_combinations_keep_size_fp32_and_dest_int64():
    agg = tp.type_combinations("TokenAggregate")
    assert agg == ["FP32, FP32, INT64, FP32", "FP16, FP32, INT64, FP16", "BF16, FP32, INT64, BF16"]
    attn = tp.type_combinations("ProportionalAttention")
    assert all(c.split(", ")[3] == "FP32" and len(c.split(", ")) == 5 for c in attn)
    with pytest.raises(DeploytkError, match="no TensorRT plugin for op 'MctfMatch'"):
        tp.type_combinations("MctfMatch")


def test_launch_parameters():
    import triton

    agg = tp.token_aggregate_launch(64, 197, 768, 181, {"BLOCK_T": 32, "BLOCK_C": 64}, triton.cdiv)
    assert agg == {"grid": (6, 12, 64), "int_args": [197, 768, 181]}
    attn = tp.proportional_attention_launch(64, 12, 181, {"BLOCK_M": 64}, triton.cdiv)
    assert attn == {"grid": (3, 768, 1), "int_args": [181, 12]}


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
