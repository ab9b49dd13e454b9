"""Every method's assignments meet TokenAggregate's contract, which its ONNX body relies on, and the body sums them.

The body (deploytk/ops/token_aggregate/onnx_function.py) gathers each slot's first token and adds at most
N - tokens_out others: a method whose ``dest`` put more kept tokens beside a slot's first one would lose
them silently in ONNX Runtime and OpenVINO, while its PyTorch reference stayed right. So each method's
reference runs here with every ``token_aggregate`` call watched (a dispatch mode sees the op, whoever
calls it), and each call's inputs go through the ONNX body too.
"""

import numpy as np
import pytest
import timm
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from deploytk.merging.merged_vit import build_merged
from deploytk.reducers import METHODS, get_method

from helpers import seeded_images, seeded_init
from helpers.aggregate import aggregate_model, aggregate_runner

#: the selecting ops: each kept token its own slot, the rest dropped; a duplicate pick (ATS) or a medoid shared by two
#: clusters (K-Medoids) leaves a slot empty, which the contract allows (no more empty slots than dropped tokens)
EMPTY_SLOTS_ALLOWED = {"ATSSample", "KMedoidsSelect"}


class WatchAggregate(TorchDispatchMode):
    """Records (x, weight, dest, tokens_out, normalize, output) of every deploytk.token_aggregate call."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.deploytk.token_aggregate.default:
            self.calls.append((*(a.clone() if isinstance(a, torch.Tensor) else a for a in args), out.clone()))
        return out


def slot_counts(dest: torch.Tensor, tokens_out: int) -> torch.Tensor:
    """[B, tokens_out + 1]: how many tokens each slot receives (the last: dropped)."""
    return torch.zeros(dest.shape[0], tokens_out + 1, dtype=torch.long).scatter_add(1, dest, torch.ones_like(dest))


def check_contract(calls, name: str, empty_allowed: bool) -> int:
    """Asserts the contract on every call; returns how many slots were empty in all."""
    empty_total = 0
    for x, _, dest, tokens_out, _, _ in calls:
        n = x.shape[1]
        counts = slot_counts(dest, tokens_out)
        empty = (counts[:, :tokens_out] == 0).sum(1)
        beside_first = (dest < tokens_out).sum(1) - (tokens_out - empty)  # kept tokens that are not their slot's first
        assert (beside_first <= n - tokens_out).all(), (name, n, tokens_out, beside_first.tolist())
        if not empty_allowed:
            assert (empty == 0).all(), f"{name}: slots left empty {empty.tolist()} (N={n}, tokens_out={tokens_out})"
        empty_total += int(empty.sum())
    return empty_total


def check_body(calls, runtime: str) -> None:
    """Each call's inputs through the ONNX body on ``runtime``: the torch op's output to 1e-5."""
    runners = {}
    for x, weight, dest, tokens_out, normalize, want in calls:
        key = (x.shape[1], x.shape[2], tokens_out, normalize)
        if key not in runners:
            runners[key] = aggregate_runner(runtime, aggregate_model(*key))
        got = runners[key]({"x": x.float().numpy(), "weight": weight.float().numpy(), "dest": dest.numpy()})
        want = want.float().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(float(np.nanmax(np.abs(want))), 1.0))


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_meets_the_aggregate_contract_and_the_body_sums_its_calls(name):
    method = get_method(name)
    vit = seeded_init(timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, embed_dim=48, num_heads=3, depth=12))
    model = build_merged(method, vit, 4, method.needs_prop_attn, method.parse_options({})).eval()
    watch = WatchAggregate()
    with torch.no_grad(), watch:
        model(torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)))
    if "TokenAggregate" not in method.ops:
        assert watch.calls == []
        return
    assert watch.calls, f"{name} declares TokenAggregate but made no call the watch saw"
    check_contract(watch.calls, name, empty_allowed=bool(EMPTY_SLOTS_ALLOWED & set(method.ops)))
    check_body(watch.calls, "ort")


@pytest.mark.parametrize("runtime", ["ort", "openvino"])
def test_ats_empty_slots_meet_the_contract_and_the_body_sums_them(runtime):
    """ATS at keep 0.7 on the seeded DeiT-S leaves slots empty (duplicate samples; tests/merging/test_official_study.py):
    the one method seen to, so the body is held to the reference on exactly those calls."""
    m = get_method("ats")
    vit = seeded_init(timm.create_model("deit_small_patch16_224"), seed=1)
    model = build_merged(m, vit, 0, m.needs_prop_attn, m.parse_options({"keep_rate": 0.7})).eval()
    watch = WatchAggregate()
    with torch.no_grad(), watch:
        model(seeded_images(2, seed=2))
    assert check_contract(watch.calls, "ats", empty_allowed=True) > 0  # some slot was empty
    check_body(watch.calls, runtime)
