"""TensorRT plugins of the deploytk ops, as quickly-deployable Python plugins with AOT Triton kernels.

Written against ``tensorrt.plugin`` (TensorRT >= 10.9 for ``aot_impl``; 11.x):
``trtp.register`` (output shapes/types), ``trtp.autotune`` (type/format combinations) and
``trtp.aot_impl`` (returns kernel name, PTX, ``trtp.KernelLaunchParams`` and the extra int
arguments as ``trtp.SymIntExprs``). The engine embeds the PTX, so it runs in any TensorRT
runtime without Python. Plugin ids are ``deploytk::<ONNX op type>``, version "1", matching the
ONNX nodes' ``plugin_namespace``/``plugin_version``; the ONNX attributes arrive as plugin
fields of the same names (INT -> int32, FLOAT -> float32).

API facts this module relies on (read from ``tensorrt/plugin`` in TensorRT 10.9 and 11.x):
the register function runs with every node attribute the plugin declares, as keywords, and
``aot_impl`` gets the same attributes positionally in that order, then ``outputs, tactic``;
defaults are not allowed; an INT attribute arrives as a one-element int32 array (so it is
annotated ``NDArray[np.int32]``: ``int()`` of a 1-element array fails on NumPy >= 2.4);
``plugin_namespace``/``plugin_version`` are not passed as fields; annotations are evaluated
(hence no ``from __future__ import annotations`` here); extra kernel arguments must be
``trtp.SymInt32``; the kernel is launched with inputs, extra ints, outputs and nothing else
(``plugins.aot`` strips Triton's trailing scratch parameters to match).

NOT RUN: TensorRT cannot be installed where deploytk is built. Everything below that does not
touch ``tensorrt`` (shape rules, type combinations, launch parameters) is a plain function
tested in ``tests/plugins``; the registration itself is import-guarded.

Every deploytk op has a plugin: TokenAggregate and ProportionalAttention, and the matching
ops ToMeMatch, MctfMatch, SizeSplitMatch, TopKSelect and CrucialMatch (one kernel each, one
program per image; their float inputs share one dtype, dest is INT64).
"""

from deploytk.errors import DeploytkError

PLUGIN_NAMESPACE = "deploytk"
PLUGIN_VERSION = "1"
PLUGIN_OPS = ("ToMeMatch", "TokenAggregate", "ProportionalAttention", "MctfMatch", "SizeSplitMatch", "TopKSelect", "CrucialMatch")
#: matching ops -> their float inputs (the order of the ONNX node); each has one output, dest [B, N] INT64
MATCH_INPUTS = {
    "ToMeMatch": ("metric",),
    "MctfMatch": ("metric", "received", "size"),
    "SizeSplitMatch": ("metric", "size"),
    "TopKSelect": ("scores",),
    "CrucialMatch": ("metric", "scores"),
}
_TRT_DTYPE = {"fp32": "FP32", "fp16": "FP16", "bf16": "BF16"}


# ---- plain rules, tested without TensorRT -------------------------------------------------


def token_aggregate_shape(x_shape: list, tokens_out: int) -> list:
    """x [B, N, C] -> [B, tokens_out, C]."""
    if len(x_shape) != 3:
        raise DeploytkError(f"TokenAggregate: x must be rank 3 [B, N, C], got rank {len(x_shape)}.")
    return [x_shape[0], tokens_out, x_shape[2]]


def match_shape(op: str, first_shape: list) -> list:
    """A matching op's dest [B, N] (INT64) from its first input: metric [B, N, D], or scores [B, N] for TopKSelect."""
    rank, dims = (2, "[B, N]") if op == "TopKSelect" else (3, "[B, N, D]")
    if len(first_shape) != rank:
        raise DeploytkError(f"{op}: {MATCH_INPUTS[op][0]} must be rank {rank} {dims}, got rank {len(first_shape)}.")
    return list(first_shape[:2])


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
        if op in MATCH_INPUTS:  # float inputs (one dtype) -> dest
            combos.append(", ".join([t] * len(MATCH_INPUTS[op]) + ["INT64"]))
        elif op == "TokenAggregate":  # x, weight, dest -> out
            combos.append(f"{t}, FP32, INT64, {t}")
        elif op == "ProportionalAttention":  # q, k, v, size -> out
            combos.append(f"{t}, {t}, {t}, FP32, {t}")
        else:
            raise DeploytkError(f"no TensorRT plugin for op {op!r}; plugins exist for {', '.join(PLUGIN_OPS)}.")
    return combos


def token_aggregate_launch(batch, tokens_in: int, channels: int, tokens_out: int, cfg: dict) -> dict:
    """Grid (the torch launcher's, from the kernel module) and int arguments in kernel order (N, C, T)."""
    from deploytk.kernels.token_aggregate import grid

    return {"grid": grid(batch, tokens_out, channels, cfg), "int_args": [tokens_in, channels, tokens_out]}


def match_launch(batch, int_args: list) -> dict:
    """Every matching kernel: one program per image, int arguments in kernel order
    (ToMe/MCTF/SizeSplit: N, D, R, PROTECTED; TopKSelect: N, KEEP, PROTECTED; CrucialMatch: N, D, KEEP, PROTECTED)."""
    from deploytk.kernels.tome_match import grid

    return {"grid": grid(batch), "int_args": list(int_args)}


def scalar(attribute) -> int | float:
    """A plugin field as a Python number: TensorRT hands INT/FLOAT attributes over as 1-element arrays."""
    import numpy as np

    values = np.asarray(attribute).reshape(-1)
    if values.size != 1:
        raise DeploytkError(f"expected a scalar plugin attribute, got {values.size} values.")
    return values[0].item()


def proportional_attention_launch(batch, heads: int, tokens: int, cfg: dict) -> dict:
    from deploytk.kernels.proportional_attention import grid

    return {"grid": grid(batch, heads, tokens, cfg), "int_args": [tokens, heads]}


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
    import numpy.typing as npt
    import tensorrt as trt
    import tensorrt.plugin as trtp

    from plugins.aot import (
        compile_variant,
        crucial_match_variant,
        mctf_match_variant,
        proportional_attention_variant,
        size_split_match_variant,
        token_aggregate_variant,
        tome_match_variant,
        topk_select_variant,
    )

    names = {trt.float32: "fp32", trt.float16: "fp16", trt.bfloat16: "bf16"}
    Ints, Floats = npt.NDArray[np.int32], npt.NDArray[np.float32]
    AOTResult = tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]

    def arch() -> str:
        import torch

        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"

    def const(expr) -> int:
        """A static dimension (``ShapeExpr.constant_value()``); only the batch is dynamic in exported graphs."""
        if not expr.is_constant:
            raise DeploytkError("a deploytk plugin input has a dynamic dimension other than the batch; re-export the model.")
        return int(expr.constant_value())

    def launch_params(compiled, grid, int_args):
        params = trtp.KernelLaunchParams()
        params.grid_x, params.grid_y, params.grid_z = grid
        params.block_x = compiled.num_warps * 32
        params.shared_mem = compiled.shared_mem
        extra = trtp.SymIntExprs(len(int_args))
        for i, value in enumerate(int_args):
            extra[i] = trtp.SymInt32(value)
        return params, extra

    def combos(op):
        return [trtp.AutoTuneCombination(c, "LINEAR") for c in type_combinations(op)]

    def dest_like(op: str, first: trtp.TensorDesc) -> trtp.TensorDesc:
        """A matching op's INT64 dest [B, N], by the rule ``match_shape`` (tested without TensorRT)."""
        return trtp.from_shape_expr(tuple(match_shape(op, [first.shape_expr[i] for i in range(first.ndim)])), dtype=trt.int64)

    def matching_result(variant, batch, int_args) -> AOTResult:
        compiled = compile_variant(variant, arch())
        params, extra = launch_params(compiled, match_launch(batch, int_args)["grid"], int_args)
        return compiled.kernel_name, compiled.ptx, params, extra

    # ToMeMatch: metric [B, N, D] -> dest [B, N] int64
    @trtp.register(f"{PLUGIN_NAMESPACE}::ToMeMatch")
    def _(metric: trtp.TensorDesc, r: Ints, protected: Ints, sort_unmerged: Ints, tokens: Ints) -> trtp.TensorDesc:
        return dest_like("ToMeMatch", metric)

    @trtp.autotune(f"{PLUGIN_NAMESPACE}::ToMeMatch")
    def _(metric: trtp.TensorDesc, outputs: tuple[trtp.TensorDesc]) -> list[trtp.AutoTuneCombination]:
        return combos("ToMeMatch")

    @trtp.aot_impl(f"{PLUGIN_NAMESPACE}::ToMeMatch")
    def _(
        metric: trtp.TensorDesc, r: Ints, protected: Ints, sort_unmerged: Ints, tokens: Ints, outputs: tuple[trtp.TensorDesc], tactic: int
    ) -> AOTResult:
        n, d = scalar(tokens), const(metric.shape_expr[2])
        variant = tome_match_variant(names[metric.dtype], n, d, bool(scalar(sort_unmerged)))
        return matching_result(variant, metric.shape_expr[0], [n, d, scalar(r), scalar(protected)])

    # TokenAggregate: x [B, N, C], weight [B, N, 1] fp32, dest [B, N] int64 -> [B, tokens_out, C]
    @trtp.register(f"{PLUGIN_NAMESPACE}::TokenAggregate")
    def _(x: trtp.TensorDesc, weight: trtp.TensorDesc, dest: trtp.TensorDesc, tokens_out: Ints, normalize: Ints) -> trtp.TensorDesc:
        out = x.like()
        out.shape_expr[1] = scalar(tokens_out)
        return out

    @trtp.autotune(f"{PLUGIN_NAMESPACE}::TokenAggregate")
    def _(
        x: trtp.TensorDesc, weight: trtp.TensorDesc, dest: trtp.TensorDesc, outputs: tuple[trtp.TensorDesc]
    ) -> list[trtp.AutoTuneCombination]:
        return combos("TokenAggregate")

    @trtp.aot_impl(f"{PLUGIN_NAMESPACE}::TokenAggregate")
    def _(
        x: trtp.TensorDesc,
        weight: trtp.TensorDesc,
        dest: trtp.TensorDesc,
        tokens_out: Ints,
        normalize: Ints,
        outputs: tuple[trtp.TensorDesc],
        tactic: int,
    ) -> AOTResult:
        tokens, channels = const(x.shape_expr[1]), const(x.shape_expr[2])
        variant = token_aggregate_variant(names[x.dtype], channels, bool(scalar(normalize)))
        compiled = compile_variant(variant, arch())
        spec = token_aggregate_launch(x.shape_expr[0], tokens, channels, scalar(tokens_out), variant.constexprs)
        params, extra = launch_params(compiled, spec["grid"], spec["int_args"])
        return compiled.kernel_name, compiled.ptx, params, extra

    # ProportionalAttention: q, k, v [B, H, N, D], size [B, N, 1] fp32 -> [B, H, N, D]
    @trtp.register(f"{PLUGIN_NAMESPACE}::ProportionalAttention")
    def _(q: trtp.TensorDesc, k: trtp.TensorDesc, v: trtp.TensorDesc, size: trtp.TensorDesc, scale: Floats) -> trtp.TensorDesc:
        return q.like()

    @trtp.autotune(f"{PLUGIN_NAMESPACE}::ProportionalAttention")
    def _(
        q: trtp.TensorDesc, k: trtp.TensorDesc, v: trtp.TensorDesc, size: trtp.TensorDesc, outputs: tuple[trtp.TensorDesc]
    ) -> list[trtp.AutoTuneCombination]:
        return combos("ProportionalAttention")

    @trtp.aot_impl(f"{PLUGIN_NAMESPACE}::ProportionalAttention")
    def _(
        q: trtp.TensorDesc,
        k: trtp.TensorDesc,
        v: trtp.TensorDesc,
        size: trtp.TensorDesc,
        scale: Floats,
        outputs: tuple[trtp.TensorDesc],
        tactic: int,
    ) -> AOTResult:
        heads, tokens, head_dim = (const(q.shape_expr[i]) for i in (1, 2, 3))
        variant = proportional_attention_variant(names[q.dtype], head_dim, float(np.float32(scalar(scale))))
        compiled = compile_variant(variant, arch())
        spec = proportional_attention_launch(q.shape_expr[0], heads, tokens, variant.constexprs)
        params, extra = launch_params(compiled, spec["grid"], spec["int_args"])
        return compiled.kernel_name, compiled.ptx, params, extra

    # MctfMatch: metric [B, N, D], received [B, N], size [B, N, 1] -> dest [B, N] int64
    @trtp.register(f"{PLUGIN_NAMESPACE}::MctfMatch")
    def _(
        metric: trtp.TensorDesc,
        received: trtp.TensorDesc,
        size: trtp.TensorDesc,
        r: Ints,
        protected: Ints,
        tau_sim: Floats,
        tau_info: Floats,
        tau_size: Floats,
        bidirection: Ints,
        tokens: Ints,
    ) -> trtp.TensorDesc:
        return dest_like("MctfMatch", metric)

    @trtp.autotune(f"{PLUGIN_NAMESPACE}::MctfMatch")
    def _(
        metric: trtp.TensorDesc, received: trtp.TensorDesc, size: trtp.TensorDesc, outputs: tuple[trtp.TensorDesc]
    ) -> list[trtp.AutoTuneCombination]:
        return combos("MctfMatch")

    @trtp.aot_impl(f"{PLUGIN_NAMESPACE}::MctfMatch")
    def _(
        metric: trtp.TensorDesc,
        received: trtp.TensorDesc,
        size: trtp.TensorDesc,
        r: Ints,
        protected: Ints,
        tau_sim: Floats,
        tau_info: Floats,
        tau_size: Floats,
        bidirection: Ints,
        tokens: Ints,
        outputs: tuple[trtp.TensorDesc],
        tactic: int,
    ) -> AOTResult:
        n, d = scalar(tokens), const(metric.shape_expr[2])
        taus = (float(np.float32(scalar(t))) for t in (tau_sim, tau_info, tau_size))
        variant = mctf_match_variant(names[metric.dtype], n, d, *taus, bool(scalar(bidirection)))
        return matching_result(variant, metric.shape_expr[0], [n, d, scalar(r), scalar(protected)])

    # SizeSplitMatch: metric [B, N, D], size [B, N, 1] -> dest [B, N] int64
    @trtp.register(f"{PLUGIN_NAMESPACE}::SizeSplitMatch")
    def _(metric: trtp.TensorDesc, size: trtp.TensorDesc, r: Ints, protected: Ints, tokens: Ints) -> trtp.TensorDesc:
        return dest_like("SizeSplitMatch", metric)

    @trtp.autotune(f"{PLUGIN_NAMESPACE}::SizeSplitMatch")
    def _(metric: trtp.TensorDesc, size: trtp.TensorDesc, outputs: tuple[trtp.TensorDesc]) -> list[trtp.AutoTuneCombination]:
        return combos("SizeSplitMatch")

    @trtp.aot_impl(f"{PLUGIN_NAMESPACE}::SizeSplitMatch")
    def _(
        metric: trtp.TensorDesc, size: trtp.TensorDesc, r: Ints, protected: Ints, tokens: Ints, outputs: tuple[trtp.TensorDesc], tactic: int
    ) -> AOTResult:
        n, d = scalar(tokens), const(metric.shape_expr[2])
        variant = size_split_match_variant(names[metric.dtype], n, d)
        return matching_result(variant, metric.shape_expr[0], [n, d, scalar(r), scalar(protected)])

    # TopKSelect: scores [B, N] -> dest [B, N] int64
    @trtp.register(f"{PLUGIN_NAMESPACE}::TopKSelect")
    def _(scores: trtp.TensorDesc, keep: Ints, protected: Ints, tokens: Ints) -> trtp.TensorDesc:
        return dest_like("TopKSelect", scores)

    @trtp.autotune(f"{PLUGIN_NAMESPACE}::TopKSelect")
    def _(scores: trtp.TensorDesc, outputs: tuple[trtp.TensorDesc]) -> list[trtp.AutoTuneCombination]:
        return combos("TopKSelect")

    @trtp.aot_impl(f"{PLUGIN_NAMESPACE}::TopKSelect")
    def _(scores: trtp.TensorDesc, keep: Ints, protected: Ints, tokens: Ints, outputs: tuple[trtp.TensorDesc], tactic: int) -> AOTResult:
        n = scalar(tokens)
        return matching_result(topk_select_variant(names[scores.dtype], n), scores.shape_expr[0], [n, scalar(keep), scalar(protected)])

    # CrucialMatch: metric [B, N, D], scores [B, N] -> dest [B, N] int64
    @trtp.register(f"{PLUGIN_NAMESPACE}::CrucialMatch")
    def _(metric: trtp.TensorDesc, scores: trtp.TensorDesc, keep: Ints, protected: Ints, tokens: Ints) -> trtp.TensorDesc:
        return dest_like("CrucialMatch", metric)

    @trtp.autotune(f"{PLUGIN_NAMESPACE}::CrucialMatch")
    def _(metric: trtp.TensorDesc, scores: trtp.TensorDesc, outputs: tuple[trtp.TensorDesc]) -> list[trtp.AutoTuneCombination]:
        return combos("CrucialMatch")

    @trtp.aot_impl(f"{PLUGIN_NAMESPACE}::CrucialMatch")
    def _(
        metric: trtp.TensorDesc,
        scores: trtp.TensorDesc,
        keep: Ints,
        protected: Ints,
        tokens: Ints,
        outputs: tuple[trtp.TensorDesc],
        tactic: int,
    ) -> AOTResult:
        n, d = scalar(tokens), const(metric.shape_expr[2])
        variant = crucial_match_variant(names[metric.dtype], n, d)
        return matching_result(variant, metric.shape_expr[0], [n, d, scalar(keep), scalar(protected)])

    _registered = True


__all__ = [
    "PLUGIN_NAMESPACE",
    "PLUGIN_VERSION",
    "PLUGIN_OPS",
    "MATCH_INPUTS",
    "register_plugins",
    "type_combinations",
    "scalar",
    "match_shape",
    "token_aggregate_shape",
    "proportional_attention_shape",
    "match_launch",
    "token_aggregate_launch",
    "proportional_attention_launch",
]
