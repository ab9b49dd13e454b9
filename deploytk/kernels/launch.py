"""Torch-facing launchers of the Triton kernels: argument checks first, then one kernel launch.

These are the CUDA implementations of the deploytk torch ops (registered by
``register_cuda_kernels``) and what ``deploytk selftest`` runs; under ``TRITON_INTERPRET=1``
they run on CPU tensors in Triton's interpreter.
"""

from __future__ import annotations

import os

import torch

from deploytk.errors import DeploytkError

#: dtypes the kernels are built for (the same list the TensorRT plugins advertise)
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _check_device(*tensors) -> None:
    if not interpreting() and not all(t.is_cuda for t in tensors):
        raise DeploytkError("the Triton kernels need CUDA tensors (or TRITON_INTERPRET=1 to run them on CPU in Triton's interpreter).")


def _check_dtype(name: str, x: torch.Tensor) -> None:
    if x.dtype not in KERNEL_DTYPES:
        raise DeploytkError(f"{name}: dtype {x.dtype} is not supported by the kernel; use float32, float16 or bfloat16.")


def precision(dtype: torch.dtype) -> str:
    """fp32 inputs: exact fp32 products ('ieee'), not TF32, so fp32 results match the reference."""
    return "ieee" if dtype == torch.float32 else "tf32"


def token_aggregate(x: torch.Tensor, weight: torch.Tensor, dest: torch.Tensor, tokens_out: int, normalize: bool) -> torch.Tensor:
    from deploytk.kernels import token_aggregate as k
    from deploytk.ops.token_aggregate import check_aggregate_args  # (deploytk.ops imports this module)

    check_aggregate_args(x, weight, dest, tokens_out)
    _check_dtype("token_aggregate", x)
    _check_device(x, weight, dest)
    b, n, c = x.shape
    x = x.contiguous()
    w = weight.reshape(b, n).to(torch.float32).contiguous()
    out = torch.empty(b, tokens_out, c, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    cfg = k.config(c)
    k.token_aggregate_kernel[k.grid(b, tokens_out, c, cfg)](
        x, w, dest.contiguous(), n, c, tokens_out, out, NORMALIZE=bool(normalize), PRECISION=precision(x.dtype), **cfg
    )
    return out


def proportional_attention(q, k, v, size, scale: float) -> torch.Tensor:
    from deploytk.kernels import proportional_attention as pa
    from deploytk.ops.proportional_attention import check_attention_args

    check_attention_args(q, k, v, size)
    if v.shape != q.shape:
        raise DeploytkError(f"the attention kernel needs v of q's shape {tuple(q.shape)}; got {tuple(v.shape)}.")
    if not (q.dtype == k.dtype == v.dtype):
        raise DeploytkError(f"q, k, v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}.")
    _check_dtype("proportional_attention", q)
    _check_device(q, k, v, size)
    b, h, n, d = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if out.numel() == 0:
        return out
    cfg = pa.config(d, q.dtype == torch.float32)
    pa.proportional_attention_kernel[pa.grid(b, h, n, cfg)](
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        size.reshape(b, n).to(torch.float32).contiguous(),
        n,
        h,
        out,
        SCALE=float(scale),
        HEAD_D=d,
        PRECISION=precision(q.dtype),
        **cfg,
    )
    return out


def _check_tokens(name: str, tokens: int) -> None:
    from deploytk.kernels.topk_select import MAX_TOKENS

    if tokens > MAX_TOKENS:
        raise DeploytkError(
            f"{name}: the kernel holds an image's tokens in registers and supports up to {MAX_TOKENS} tokens; got {tokens}."
        )


def _matching_kernel(name: str, kernel, inputs: list, ints: list, cfg: dict, warps: int) -> torch.Tensor:
    """What every matching launcher ends with: dtype, token-count and device checks, then one program per image -> dest [B, N]."""
    for t in inputs:
        _check_dtype(name, t)
    b, n = inputs[0].shape[:2]
    _check_tokens(name, n)
    _check_device(*inputs)
    dest = torch.empty(b, n, dtype=torch.int64, device=inputs[0].device)
    if dest.numel():
        from deploytk.kernels.tome_match import grid

        kernel[grid(b)](*[t.contiguous() for t in inputs], *ints, dest, num_warps=warps, **cfg)
    return dest


def tome_match(metric: torch.Tensor, r: int, protected: int, sort_unmerged: bool) -> torch.Tensor:
    from deploytk.kernels import tome_match as k
    from deploytk.ops.tome_match import check_tome_match_args

    check_tome_match_args(metric, r, protected)
    _, n, d = metric.shape
    cfg = {**k.config(n, d), "SORT_UNMERGED": bool(sort_unmerged)}
    return _matching_kernel("tome_match", k.tome_match_kernel, [metric], [n, d, r, protected], cfg, k.num_warps(cfg))


def topk_select(scores: torch.Tensor, keep: int, protected: int) -> torch.Tensor:
    from deploytk.kernels import topk_select as k
    from deploytk.ops.attention_select import check_select_args

    check_select_args("topk_select", scores, keep, protected)
    n = scores.shape[1]
    cfg = k.config(n)
    return _matching_kernel("topk_select", k.topk_select_kernel, [scores], [n, keep, protected], cfg, k.num_warps(cfg))


def crucial_match(metric: torch.Tensor, scores: torch.Tensor, keep: int, protected: int) -> torch.Tensor:
    from deploytk.kernels import crucial_match as k
    from deploytk.kernels.topk_select import num_warps
    from deploytk.ops.attention_select import check_select_args

    check_select_args("crucial_match", scores, keep, protected, metric)
    _, n, d = metric.shape
    cfg = k.config(n, d)
    return _matching_kernel("crucial_match", k.crucial_match_kernel, [metric, scores], [n, d, keep, protected], cfg, num_warps(cfg))


def size_split_match(metric: torch.Tensor, size: torch.Tensor, r: int, protected: int) -> torch.Tensor:
    from deploytk.kernels import size_split_match as k
    from deploytk.kernels.topk_select import num_warps
    from deploytk.ops.mctf_match import check_match_args

    n = metric.shape[1] if metric.dim() == 3 else 0
    check_match_args("size_split_match", metric, {"size": size}, r, protected, (n - protected) // 2)
    d = metric.shape[2]
    cfg = k.config(n, d)
    return _matching_kernel("size_split_match", k.size_split_match_kernel, [metric, size], [n, d, r, protected], cfg, num_warps(cfg))


def mctf_match(metric, received, size, r: int, protected: int, tau_sim: float, tau_info: float, tau_size: float, bidirection: bool):
    from deploytk.kernels import mctf_match as k
    from deploytk.ops.mctf_match import check_match_args

    n = metric.shape[1] if metric.dim() == 3 else 0
    check_match_args("mctf_match", metric, {"received": received, "size": size}, r, protected, (n - protected) // 2)
    d = metric.shape[2]
    cfg = k.constants(n, d, tau_sim, tau_info, tau_size, bidirection)
    return _matching_kernel("mctf_match", k.mctf_match_kernel, [metric, received, size], [n, d, r, protected], cfg, k.num_warps(cfg))


def register_cuda_kernels() -> None:
    """Make the Triton kernels the CUDA implementation of the deploytk torch ops (a fast PyTorch GPU path)."""

    @torch.library.register_kernel("deploytk::token_aggregate", "cuda")
    def _(x, weight, dest, tokens_out, normalize):
        return token_aggregate(x, weight, dest, tokens_out, normalize)

    @torch.library.register_kernel("deploytk::tome_match", "cuda")
    def _(metric, r, protected, sort_unmerged):
        return tome_match(metric, r, protected, sort_unmerged)

    @torch.library.register_kernel("deploytk::proportional_attention", "cuda")
    def _(q, k, v, size, scale):
        return proportional_attention(q, k, v, size, scale)

    @torch.library.register_kernel("deploytk::topk_select", "cuda")
    def _(scores, keep, protected):
        return topk_select(scores, keep, protected)

    @torch.library.register_kernel("deploytk::crucial_match", "cuda")
    def _(metric, scores, keep, protected):
        return crucial_match(metric, scores, keep, protected)

    @torch.library.register_kernel("deploytk::size_split_match", "cuda")
    def _(metric, size, r, protected):
        return size_split_match(metric, size, r, protected)

    @torch.library.register_kernel("deploytk::mctf_match", "cuda")
    def _(metric, received, size, r, protected, tau_sim, tau_info, tau_size, bidirection):
        return mctf_match(metric, received, size, r, protected, tau_sim, tau_info, tau_size, bidirection)


__all__ = [
    "KERNEL_DTYPES",
    "token_aggregate",
    "tome_match",
    "proportional_attention",
    "topk_select",
    "crucial_match",
    "size_split_match",
    "mctf_match",
    "register_cuda_kernels",
    "interpreting",
]
