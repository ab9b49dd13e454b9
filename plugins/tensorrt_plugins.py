"""TensorRT plugins of the deploytk ops, as quickly-deployable Python plugins with AOT Triton kernels.

Written against ``tensorrt.plugin`` (TensorRT >= 10.9 for ``aot_impl``; 11.x):
``trtp.register`` (output shapes/types), ``trtp.autotune`` (type/format combinations) and
``trtp.aot_impl`` (returns kernel name, PTX, ``trtp.KernelLaunchParams`` and the extra int
arguments as ``trtp.SymIntExprs``). The engine embeds the PTX, so it runs in any TensorRT
runtime without Python. Plugin ids are ``deploytk::<ONNX op type>``, version "1", matching the
ONNX nodes' ``plugin_namespace``/``plugin_version``; the ONNX attributes arrive as plugin
fields of the same names (INT -> int32, FLOAT -> float32).

NOT RUN: TensorRT cannot be installed where deploytk is built. Everything below that does not
touch ``tensorrt`` (shape rules, type combinations, launch parameters) is a plain function
tested in ``tests/plugins``; the registration itself is import-guarded.

Ops with a plugin so far: TokenAggregate, ProportionalAttention. The matching ops and the
fused ToMe TokenMerge have no plugin yet: TensorRT then inlines their function bodies.
"""

from __future__ import annotations

from deploytk.errors import DeploytkError

PLUGIN_NAMESPACE = "deploytk"
PLUGIN_VERSION = "1"
PLUGIN_OPS = ("TokenAggregate", "ProportionalAttention")
_TRT_DTYPE = {"fp32": "FP32", "fp16": "FP16", "bf16": "BF16"}


# ---- plain rules, tested without TensorRT -------------------------------------------------


def token_aggregate_shape(x_shape: list, tokens_out: int) -> list:
    """x [B, N, C] -> [B, tokens_out, C]."""
    if len(x_shape) != 3:
        raise DeploytkError(f"TokenAggregate: x must be rank 3 [B, N, C], got rank {len(x_shape)}.")
    return [x_shape[0], tokens_out, x_shape[2]]


def proportional_attention_shape(q_shape: list) -> list:
    if len(q_shape) != 4:
        raise DeploytkError(f"ProportionalAttention: q must be rank 4 [B, H, N, D], got rank {len(q_shape)}.")
    return list(q_shape)


def type_combinations(op: str) -> list[str]:
    """One TensorRT type string per supported dtype: inputs then outputs, comma-separated.

    The tensors' dtype varies with the precision; size/weight stay FP32 and dest INT64.
    """
    combos = []
    for t in _TRT_DTYPE.values():
        if op == "TokenAggregate":  # x, weight, dest -> out
            combos.append(f"{t}, FP32, INT64, {t}")
        elif op == "ProportionalAttention":  # q, k, v, size -> out
            combos.append(f"{t}, {t}, {t}, FP32, {t}")
        else:
            raise DeploytkError(f"no TensorRT plugin for op {op!r}; plugins exist for {', '.join(PLUGIN_OPS)}.")
    return combos


def token_aggregate_launch(batch, tokens_in: int, channels: int, tokens_out: int, cfg: dict, cdiv) -> dict:
    """Grid (the torch launcher's, from the kernel module) and int arguments in kernel order (N, C, T)."""
    from deploytk.kernels.token_aggregate import grid

    return {"grid": grid(batch, tokens_out, channels, cfg, cdiv), "int_args": [tokens_in, channels, tokens_out]}


def proportional_attention_launch(batch, heads: int, tokens: int, cfg: dict, cdiv) -> dict:
    from deploytk.kernels.proportional_attention import grid

    return {"grid": grid(batch, heads, tokens, cfg, cdiv), "int_args": [tokens, heads]}


# ---- registration (needs tensorrt) --------------------------------------------------------

_registered = False


def register_plugins() -> None:
    """Register every deploytk plugin with TensorRT (idempotent). Raises a DeploytkError without TensorRT."""
    global _registered
    if _registered:
        return
    from deploytk.backends.trt import require_tensorrt

    require_tensorrt("registering the deploytk TensorRT plugins")
    import numpy as np
    import tensorrt as trt
    import tensorrt.plugin as trtp

    from plugins.aot import compile_variant, proportional_attention_variant, token_aggregate_variant

    names = {trt.float32: "fp32", trt.float16: "fp16", trt.bfloat16: "bf16"}

    def arch() -> str:
        import torch

        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"

    def const(expr) -> int:
        """A build-time dimension (ShapeExpr.constant_value); N, C, H, D are static in exported graphs."""
        return int(expr.constant_value) if getattr(expr, "is_constant", False) else int(expr)

    def launch_params(compiled, grid, int_args):
        params = trtp.KernelLaunchParams()
        params.grid_x, params.grid_y, params.grid_z = grid
        params.block_x = compiled.num_warps * 32
        params.shared_mem = compiled.shared_mem
        extra = trtp.SymIntExprs(len(int_args))
        for i, value in enumerate(int_args):
            extra[i] = trtp.SymInt32(value)
        return params, extra

    @trtp.register(f"{PLUGIN_NAMESPACE}::TokenAggregate")
    def _(x: trtp.TensorDesc, weight: trtp.TensorDesc, dest: trtp.TensorDesc, tokens_out: int, normalize: int, tokens: int) -> trtp.TensorDesc:
        out = x.like()
        out.shape_expr[1] = out.shape_expr[1] + (tokens_out - tokens)  # N is static (= tokens) in the exported graph
        return out

    @trtp.autotune(f"{PLUGIN_NAMESPACE}::TokenAggregate")
    def _(x, weight, dest, tokens_out: int, normalize: int, tokens: int, outputs):
        return [trtp.AutoTuneCombination(c, "LINEAR") for c in type_combinations("TokenAggregate")]

    @trtp.aot_impl(f"{PLUGIN_NAMESPACE}::TokenAggregate")
    def _(x, weight, dest, tokens_out: int, normalize: int, tokens: int, outputs, tactic: int):
        channels = const(x.shape_expr[2])
        variant = token_aggregate_variant(names[x.dtype], channels, bool(normalize))
        compiled = compile_variant(variant, arch())
        spec = token_aggregate_launch(x.shape_expr[0], tokens, channels, int(tokens_out), variant.constexprs, trtp.cdiv)
        params, extra = launch_params(compiled, spec["grid"], spec["int_args"])
        return compiled.kernel_name, compiled.ptx, params, extra

    @trtp.register(f"{PLUGIN_NAMESPACE}::ProportionalAttention")
    def _(q: trtp.TensorDesc, k: trtp.TensorDesc, v: trtp.TensorDesc, size: trtp.TensorDesc, scale: float) -> trtp.TensorDesc:
        return q.like()

    @trtp.autotune(f"{PLUGIN_NAMESPACE}::ProportionalAttention")
    def _(q, k, v, size, scale: float, outputs):
        return [trtp.AutoTuneCombination(c, "LINEAR") for c in type_combinations("ProportionalAttention")]

    @trtp.aot_impl(f"{PLUGIN_NAMESPACE}::ProportionalAttention")
    def _(q, k, v, size, scale: float, outputs, tactic: int):
        heads, tokens, head_dim = (const(q.shape_expr[i]) for i in (1, 2, 3))
        variant = proportional_attention_variant(names[q.dtype], head_dim, float(np.float32(scale)))
        compiled = compile_variant(variant, arch())
        spec = proportional_attention_launch(q.shape_expr[0], heads, tokens, variant.constexprs, trtp.cdiv)
        params, extra = launch_params(compiled, spec["grid"], spec["int_args"])
        return compiled.kernel_name, compiled.ptx, params, extra

    _registered = True


__all__ = ["PLUGIN_NAMESPACE", "PLUGIN_VERSION", "PLUGIN_OPS", "register_plugins", "type_combinations",
           "token_aggregate_shape", "proportional_attention_shape", "token_aggregate_launch", "proportional_attention_launch"]
