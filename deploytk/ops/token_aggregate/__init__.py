"""``deploytk.TokenAggregate``: apply an assignment, the one merge op every method shares.

out[b, j] = sum_{i: dest[b,i] = j} w[b,i] x[b,i]  (divided by sum w when ``normalize``).
Inputs: x [B, N, C], weight [B, N, 1] (fp32), dest [B, N] int64 in [0, tokens_out]
(tokens_out = dropped). Attributes: tokens_out, normalize. Output [B, tokens_out, C].

Contract on ``dest`` (what every matching op gives; tests/merging/test_aggregate_contract.py holds
every method to it): at most N - tokens_out of the kept tokens (dest < tokens_out) share their slot
with a lower-numbered token. A merging op gives every slot 0..tokens_out-1 at least one token, which
implies it; a selecting op (ATSSample, KMedoidsSelect: each kept token its own slot, the rest
dropped) may leave a slot empty, out of no more slots than tokens it drops. The ONNX body adds at
most N - tokens_out tokens onto each slot's first one and would silently leave out any beyond; an
empty slot sums to 0 (NaN when normalised), as in the reference. The torch op does not check it.
"""

from __future__ import annotations

import torch

from deploytk.errors import DeploytkError
from deploytk.ops.flop_rules import no_flops
from deploytk.ops.spec import FLOAT, OpSpec, SelftestPlan, floats, fp32, int64
from deploytk.ops.token_aggregate.onnx_function import TokenAggregate
from deploytk.ops.token_aggregate.reference import token_aggregate as reference


def check_aggregate_args(x, weight, dest, tokens_out: int) -> None:
    if x.dim() != 3 or weight.dim() != 3 or dest.dim() != 2:
        raise DeploytkError(
            "token_aggregate expects x [B, N, C], weight [B, N, 1] and dest [B, N]; got "
            f"x {tuple(x.shape)}, weight {tuple(weight.shape)}, dest {tuple(dest.shape)}."
        )
    if weight.shape[:2] != x.shape[:2] or weight.shape[2] != 1 or dest.shape != x.shape[:2]:
        raise DeploytkError(
            "token_aggregate inputs disagree on batch/token count: "
            f"x {tuple(x.shape)}, weight {tuple(weight.shape)}, dest {tuple(dest.shape)}."
        )
    if dest.dtype != torch.int64:
        raise DeploytkError(f"token_aggregate: dest must be int64, got {dest.dtype}.")
    if not 1 <= tokens_out <= x.shape[1]:
        raise DeploytkError(f"token_aggregate: tokens_out={tokens_out} must be in [1, {x.shape[1]}].")


def check_dest_range(dest: torch.Tensor, tokens_out: int) -> None:
    """dest in [0, tokens_out]. On a CPU tensor a clear error; on a GPU a device-side assert, since reading the values
    on the host would wait for the GPU in every merging block (the first H200 run's merged models were slower than the
    dense ones at every batch) and cannot be captured in a CUDA graph."""
    if not dest.numel():
        return
    message = f"token_aggregate: dest values must be in [0, {tokens_out}]."
    if dest.device.type == "cpu":
        if int(dest.min()) < 0 or int(dest.max()) > tokens_out:
            raise DeploytkError(message)
    else:
        torch._assert_async((dest.min() >= 0) & (dest.max() <= tokens_out), message)


@torch.library.custom_op("deploytk::token_aggregate", mutates_args=())
def token_aggregate(x: torch.Tensor, weight: torch.Tensor, dest: torch.Tensor, tokens_out: int, normalize: bool) -> torch.Tensor:
    check_aggregate_args(x, weight, dest, tokens_out)
    check_dest_range(dest, tokens_out)
    # contiguous, as the fake below promises: without `normalize` the reference returns a slice of a (tokens_out + 1)-token
    # buffer, whose batch stride torch.compile found differing from the fake's (182 against 181: MCTF's sizes, DeiT-B)
    return reference(x, weight, dest, tokens_out, normalize).contiguous()


@token_aggregate.register_fake
def _token_aggregate_fake(x, weight, dest, tokens_out, normalize):
    return x.new_empty(x.shape[0], tokens_out, x.shape[2])


def _setup_backward(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1], inputs[2])
    ctx.tokens_out, ctx.normalize = inputs[3], inputs[4]


def _backward(ctx, grad):
    """The gradient of the reference's own formula (autograd through its scatter-adds), for x and weight: training through
    the merged reference (scripts/train_digits_multiscale.py) needs it; dest is a discrete choice and has none."""
    x, weight, dest = ctx.saved_tensors
    with torch.enable_grad():
        xr, wr = x.detach().requires_grad_(), weight.detach().requires_grad_()
        out = reference(xr, wr, dest, ctx.tokens_out, ctx.normalize)
        gx, gw = torch.autograd.grad(out, (xr, wr), grad)
    return gx, gw, None, None, None


token_aggregate.register_autograd(_backward, setup_context=_setup_backward)


def translate(x, weight, dest, tokens_out: int, normalize: bool):
    return TokenAggregate(x, weight, dest, tokens_out=tokens_out, normalize=int(normalize))


def _selftest_calls(draw: dict) -> list:
    return [
        ([draw["x"], draw["weight"], draw["dest"], draw["tokens_out"], normalize], {**draw["shape"], "normalize": normalize})
        for normalize in (True, False)
    ]


SPEC = OpSpec(
    name="TokenAggregate",
    torch_op=token_aggregate,
    onnx_function=TokenAggregate,
    translation=translate,
    reference=reference,
    inputs=(floats("B N C"), fp32("B N 1"), int64("B N")),
    output=FLOAT,
    output_shape=lambda shapes, attrs: [shapes[0][0], int(attrs["tokens_out"]), shapes[0][2]],
    flops=no_flops,
    kernel="deploytk.ops.token_aggregate.kernel",
    selftest=SelftestPlan("aggregate", _selftest_calls),
)
