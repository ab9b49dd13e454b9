"""The matching/aggregation ops: ONNX bodies vs torch, and hand-computed small cases."""

import math

import numpy as np
import pytest
import torch
from onnx import TensorProto

import deploytk.ops  # noqa: F401
from deploytk.errors import DeploytkError
from deploytk.ops import OPS
from deploytk.ops.tome_match.reference import merge_tokens

from helpers.bodies import body_model, ort_session

ops = torch.ops.deploytk


def node_session(op_name, inputs: dict, out_type, out_rank, **attrs):
    """A session for a one-node model calling the op's local function, as the exporter writes it."""
    return ort_session(body_model(op_name, inputs, [out_type], out_rank, **attrs))


def run_node(op_name, inputs: dict, out_type, out_rank, **attrs):
    return node_session(op_name, inputs, out_type, out_rank, **attrs).run(None, inputs)[0]


@pytest.mark.parametrize(
    "batch,n,c,r,protected,sort_unmerged",
    [(2, 197, 24, 16, 1, True), (3, 198, 16, 30, 2, True), (1, 261, 8, 40, 5, True), (4, 196, 12, 20, 0, False), (2, 21, 8, 10, 1, True)],
)
def test_tome_match_body_equals_torch_and_merges_like_tome(batch, n, c, r, protected, sort_unmerged):
    g = torch.Generator().manual_seed(n + r)
    x, size, metric = (
        torch.randn(batch, n, c, generator=g),
        torch.rand(batch, n, 1, generator=g) + 0.5,
        torch.randn(batch, n, 7, generator=g),
    )
    dest = torch.ops.deploytk.tome_match(metric, r, protected, sort_unmerged)
    got = run_node(
        "ToMeMatch", {"metric": metric.numpy()}, TensorProto.INT64, 2, r=r, protected=protected, sort_unmerged=int(sort_unmerged), tokens=n
    )
    np.testing.assert_array_equal(got, dest.numpy())
    # independent check: match + aggregate is ToMe's merge (tome_match.reference.merge_tokens, the official algorithm)
    want_x, want_size = merge_tokens(x, size, metric, r, protected, sort_unmerged)
    got_x = torch.ops.deploytk.token_aggregate(x, size, dest, n - r, True)
    got_size = torch.ops.deploytk.token_aggregate(size, torch.ones_like(size), dest, n - r, False)
    torch.testing.assert_close(got_size, want_size, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_x, want_x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "b,n,p,r,bidir", [(2, 197, 1, 16, True), (3, 198, 2, 30, True), (2, 65, 0, 8, True), (2, 197, 1, 16, False), (1, 21, 5, 4, True)]
)
def test_mctf_match_body_equals_torch(b, n, p, r, bidir):
    g = torch.Generator().manual_seed(n + r)
    metric, received = torch.randn(b, n, 12, generator=g), torch.rand(b, n, generator=g) + 0.01
    size = torch.randint(1, 5, (b, n, 1), generator=g).float()
    want = ops.mctf_match(metric, received, size, r, p, 1.0, 20.0, 40.0, bidir)
    got = run_node(
        "MctfMatch",
        {"metric": metric.numpy(), "received": received.numpy(), "size": size.numpy()},
        TensorProto.INT64,
        2,
        r=r,
        protected=p,
        tau_sim=1.0,
        tau_info=20.0,
        tau_size=40.0,
        bidirection=int(bidir),
        tokens=n,
    )
    np.testing.assert_array_equal(got, want.numpy())
    for row in want:  # every output slot used exactly by >= 1 token; protected tokens first and alone
        assert sorted(set(row.tolist())) == list(range(n - r))
        assert row[:p].tolist() == list(range(p)) and all((row == s).sum() == 1 for s in range(p))


@pytest.mark.parametrize("b,n,p,keep", [(2, 197, 1, 137), (3, 50, 2, 20), (2, 30, 0, 10)])
def test_selection_bodies_equal_torch(b, n, p, keep):
    g = torch.Generator().manual_seed(n)
    scores, metric = torch.rand(b, n, generator=g), torch.randn(b, n, 8, generator=g)
    got = run_node("TopKSelect", {"scores": scores.numpy()}, TensorProto.INT64, 2, keep=keep, protected=p, tokens=n)
    np.testing.assert_array_equal(got, ops.topk_select(scores, keep, p).numpy())
    got = run_node(
        "CrucialMatch", {"metric": metric.numpy(), "scores": scores.numpy()}, TensorProto.INT64, 2, keep=keep, protected=p, tokens=n
    )
    np.testing.assert_array_equal(got, ops.crucial_match(metric, scores, keep, p).numpy())


@pytest.mark.parametrize("b,n,p,r", [(2, 197, 1, 16), (2, 100, 2, 30), (1, 65, 0, 20)])
def test_size_split_body_equals_torch(b, n, p, r):
    g = torch.Generator().manual_seed(n)
    metric, size = torch.randn(b, n, 8, generator=g), torch.randint(1, 4, (b, n, 1), generator=g).float()
    got = run_node("SizeSplitMatch", {"metric": metric.numpy(), "size": size.numpy()}, TensorProto.INT64, 2, r=r, protected=p, tokens=n)
    np.testing.assert_array_equal(got, ops.size_split_match(metric, size, r, p).numpy())


@pytest.mark.parametrize("normalize", [True, False])
def test_token_aggregate_body_and_hand_case(normalize):
    x = torch.tensor([[[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]]])
    w = torch.tensor([[[1.0], [3.0], [2.0], [5.0]]])
    dest = torch.tensor([[1, 0, 1, 2]])  # token 3 -> slot 2 = tokens_out: dropped
    got = ops.token_aggregate(x, w, dest, 2, normalize)
    slot0, slot1 = [6.0, 60.0], [7.0, 70.0]  # 3*[2,20]; 1*[1,10] + 2*[3,30]
    if normalize:
        slot0, slot1 = [2.0, 20.0], [7 / 3, 70 / 3]
    torch.testing.assert_close(got, torch.tensor([[slot0, slot1]]))
    body = run_node(
        "TokenAggregate",
        {"x": x.numpy(), "weight": w.numpy(), "dest": dest.numpy()},
        TensorProto.FLOAT,
        3,
        tokens_out=2,
        normalize=int(normalize),
    )
    np.testing.assert_allclose(body, got.numpy(), rtol=1e-6)


@pytest.mark.parametrize("normalize", [True, False])
def test_token_aggregate_gradient_is_the_formulas(normalize):
    """Training through the reference (the multi-scale digits model) needs TokenAggregate's gradient: held to the derivative
    written out by hand (a dropped token gets none) and to finite differences."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(2, 7, 1, generator=gen, dtype=torch.float64) + 0.5).requires_grad_()
    dest = torch.tensor([[0, 1, 1, 2, 0, 3, 2], [2, 2, 0, 1, 3, 3, 1]])  # slot 3 = tokens_out: dropped
    out = ops.token_aggregate(x, w, dest, 3, normalize)
    g = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    gx, gw = torch.autograd.grad(out, (x, w), g)
    kept = (dest < 3)[..., None]
    g_at = torch.cat([g, torch.zeros(2, 1, 3, dtype=g.dtype)], 1).gather(1, dest[..., None].expand(-1, -1, 3))
    total = torch.zeros(2, 4, 1, dtype=w.dtype).scatter_add(1, dest[..., None], w.detach()).gather(1, dest[..., None])
    if normalize:
        out_at = torch.cat([out.detach(), torch.zeros(2, 1, 3, dtype=g.dtype)], 1).gather(1, dest[..., None].expand(-1, -1, 3))
        want_x, want_w = g_at * w.detach() / total, (g_at * (x.detach() - out_at)).sum(-1, keepdim=True) / total
    else:
        want_x, want_w = g_at * w.detach(), (g_at * x.detach()).sum(-1, keepdim=True)
    torch.testing.assert_close(gx, torch.where(kept, want_x, 0.0))
    torch.testing.assert_close(gw, torch.where(kept, want_w, 0.0))
    assert torch.autograd.gradcheck(lambda a, b: ops.token_aggregate(a, b, dest, 3, normalize), (x, w))


def test_topk_select_and_evit_fusion_hand_case():
    # tokens: cls + 5; CLS attention to them; keep 2 -> tokens 4 and 2 (original order), rest -> slot 3
    scores = torch.tensor([[0.0, 0.10, 0.30, 0.05, 0.40, 0.15]])
    dest = ops.topk_select(scores, 2, 1)
    assert dest.tolist() == [[0, 3, 1, 3, 2, 3]]
    x = torch.arange(6.0).reshape(1, 6, 1)
    weight = torch.where((dest == 3)[..., None], scores[..., None], torch.ones(1, 6, 1))
    fused = ops.token_aggregate(x, weight, dest, 4, False)  # EViT: the rest summed with raw attention
    assert fused.flatten().tolist() == pytest.approx([0.0, 2.0, 4.0, 0.10 * 1 + 0.05 * 3 + 0.15 * 5])
    pruned = ops.token_aggregate(x, torch.ones(1, 6, 1), dest, 3, False)
    assert pruned.flatten().tolist() == [0.0, 2.0, 4.0]


def test_crucial_match_hand_case():
    # cls + 4 tokens; crucial = the 2 with most CLS attention (tokens 1 and 3); 2 -> like 1, 4 -> like 3
    metric = torch.tensor([[[1.0, 1.0], [1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.2, 1.0]]])
    scores = torch.tensor([[0.0, 0.5, 0.1, 0.3, 0.1]])
    dest = ops.crucial_match(metric, scores, 2, 1)
    assert dest.tolist() == [[0, 1, 1, 2, 2]]
    x = torch.tensor([[[0.0], [10.0], [20.0], [30.0], [40.0]]])
    out = ops.token_aggregate(x, scores[..., None] + (scores[..., None] == 0), dest, 3, True)  # cls weight 1
    assert out.flatten().tolist() == pytest.approx([0.0, (0.5 * 10 + 0.1 * 20) / 0.6, (0.3 * 30 + 0.1 * 40) / 0.4])


def test_size_split_hand_case():
    # no protected tokens; sizes [1, 4, 1, 4]: small half = tokens 0, 2; large = 1, 3.
    metric = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.1, 1.0], [1.0, 0.1]]])
    size = torch.tensor([[[1.0], [4.0], [1.0], [4.0]]])
    dest = ops.size_split_match(metric, size, 1, 0)
    # both small tokens match perfectly-ish (0 -> 3, 2 -> 1); r=1 merges the better pair
    s03 = 1.0 / math.hypot(1.0, 0.1)  # cos(token0, token3) == cos(token2, token1); tie -> lower index (token 0)
    assert s03 < 1
    assert dest.tolist() == [[2, 0, 1, 2]]


def test_mctf_match_hand_case_bidirectional():
    # 1 protected + 5 tokens, sim only (tau_info = tau_size = 0). A = [cls, t2, t4], B = [t1, t3, t5].
    e = torch.eye(3)
    metric = torch.stack([e[0], e[0], e[0] * 0.9 + e[1] * 0.1, e[1], e[2], e[2] * 0.8 + e[1] * 0.2])[None]
    received = torch.ones(1, 6)
    size = torch.ones(1, 6, 1)
    dest = ops.mctf_match(metric, received, size, 2, 1, 1.0, 0.0, 0.0, True)
    # A->B (r1 = 1): t2's best is t1 ((0.994+1)/2), t4's is t5 ((0.970+1)/2) -> t2 merges into t1; unmerged A = [cls, t4].
    # B->A (r2 = 1) over unmerged A (cls blocked): t1 -> t4 (0.5), t3 -> t4 (0.5), t5 -> t4 (0.985) -> t5 merges into t4.
    # Output: [cls, t4 (+t5), then unmerged B by descending score, ties by index: t1 (+t2), t3].
    assert dest.tolist() == [[0, 2, 2, 3, 1, 1]]
    no_bidir = ops.mctf_match(metric, received, size, 2, 1, 1.0, 0.0, 0.0, False)
    # one-directional: both A tokens merge (t2 -> t1, t4 -> t5); output [cls, t1 (+t2), t3, t5 (+t4)]
    assert no_bidir.tolist() == [[0, 1, 1, 2, 3, 3]]


@pytest.mark.parametrize(
    "b,n,p,r,protect,margin",
    [(2, 197, 1, 19, False, 0.75), (2, 197, 1, 19, True, 0.0625), (3, 65, 0, 10, False, 0.5), (2, 21, 5, 8, True, 0.9)],
)
def test_pitome_match_body_equals_torch(b, n, p, r, protect, margin):
    g = torch.Generator().manual_seed(n + r)
    metric = torch.randn(b, n, 12, generator=g)
    want = ops.pitome_match(metric, r, p, margin, 1.0, protect)
    got = run_node(
        "PiToMeMatch",
        {"metric": metric.numpy()},
        TensorProto.INT64,
        2,
        r=r,
        protected=p,
        margin=margin,
        alpha=1.0,
        protect=int(protect),
        tokens=n,
    )
    np.testing.assert_array_equal(got, want.numpy())
    for row in want:  # every output slot used; the prefix first and alone
        assert sorted(set(row.tolist())) == list(range(n - r)) and row[:p].tolist() == list(range(p))


def test_pitome_match_hand_case():
    # cls + 4 tokens: t1 = t2 (the highest energy, tied: t1 first), t3 close to them, t4 alone (lowest energy).
    # Energy order t1, t2, t3, t4; margin 0.5: energies (0.5 + 0.5 + 0.3 + elu(-0.5)) / 4 for t1 and t2, ...
    metric = torch.tensor([[[0.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.8, 0.6, 0.0], [0.0, 0.0, 1.0]]])
    # all matched: A = [t1, t3], B = [t2, t4]; t1 -> t2 (cos 1) beats t3 -> t2 (0.8): [cls, t3, t2 + t1, t4]
    assert ops.pitome_match(metric, 1, 1, 0.5, 1.0, False).tolist() == [[0, 2, 2, 1, 3]]
    # protected: only the 2r = 2 highest-energy tokens match (t1 into t2); t3, t4 kept in energy order: [cls, t3, t4, t2 + t1]
    assert ops.pitome_match(metric, 1, 1, 0.5, 1.0, True).tolist() == [[0, 3, 3, 1, 2]]


@pytest.mark.parametrize("protect", [False, True])
def test_pitome_near_tie_accepts_tied_energy_orders_and_rejects_wrong_merges(protect):
    from deploytk.ops.pitome_match.reference import pitome_near_tie

    g = torch.Generator().manual_seed(1)
    metric = torch.randn(1, 41, 16, generator=g)
    want = ops.pitome_match(metric, 8, 1, 0.5, 1.0, protect)
    assert pitome_near_tie(metric, 8, 1, 0.5, 1.0, protect, want)
    for i, j in ((3, 7), (2, 30), (11, 12)):  # two tokens trade slots: a wrong merge, not a tie
        wrong = want.clone()
        wrong[0, [i, j]] = wrong[0, [j, i]]
        assert torch.equal(wrong, want) or not pitome_near_tie(metric, 8, 1, 0.5, 1.0, protect, wrong), (i, j)
    # two identical tokens have the same energy: the order between them, and so which is A and which B, may go either way
    tied = metric.clone()
    tied[0, 9] = tied[0, 5]
    want = ops.pitome_match(tied, 8, 1, 0.5, 1.0, protect)
    swapped = ops.pitome_match(tied[:, [*range(5), 9, *range(6, 9), 5, *range(10, 41)]], 8, 1, 0.5, 1.0, protect)
    swapped[0, [5, 9]] = swapped[0, [9, 5]]  # the choice made with tokens 5 and 9 in the other order, in token order
    assert pitome_near_tie(tied, 8, 1, 0.5, 1.0, protect, swapped)


def test_ops_reject_bad_input_before_compute():
    m = torch.randn(2, 11, 4)
    with pytest.raises(DeploytkError, match=r"r=6 is not allowed for 11 tokens with 1 protected; r must be in \[1, 5\]"):
        ops.mctf_match(m, torch.rand(2, 11), torch.ones(2, 11, 1), 6, 1, 1.0, 20.0, 40.0, True)
    with pytest.raises(DeploytkError, match="disagree on batch/token count"):
        ops.mctf_match(m, torch.rand(3, 11), torch.ones(2, 11, 1), 2, 1, 1.0, 20.0, 40.0, True)
    with pytest.raises(DeploytkError, match="expects metric \\[B, N, D\\]"):
        ops.size_split_match(m[0], torch.ones(2, 11, 1), 2, 1)
    with pytest.raises(DeploytkError, match=r"keep=10 is not allowed for 11 tokens with 1 protected; keep must be in \[1, 9\]"):
        ops.topk_select(torch.rand(2, 11), 10, 1)
    with pytest.raises(DeploytkError, match="expects scores \\[B, N\\] and metric"):
        ops.crucial_match(torch.randn(2, 10, 4), torch.rand(2, 11), 3, 1)
    with pytest.raises(DeploytkError, match=r"pitome_match: r=6 is not allowed for 11 tokens with 1 protected; r must be in \[1, 5\]"):
        ops.pitome_match(m, 6, 1, 0.5, 1.0, True)
    with pytest.raises(DeploytkError, match="disagree on batch/token count"):
        ops.token_aggregate(m, torch.ones(2, 11, 1), torch.zeros(3, 11, dtype=torch.long), 5, True)
    with pytest.raises(DeploytkError, match=r"dest values must be in \[0, 5\]"):
        ops.token_aggregate(m, torch.ones(2, 11, 1), torch.full((2, 11), 9), 5, True)


def test_token_aggregate_body_is_exact_and_repeatable_on_multithreaded_ort():
    """Regression: the former ScatterND(add) body raced on duplicate indices in ORT's CPU kernel
    (wrong sums in 2 of 5 runs on this 2-core machine)."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 197, 192, generator=g), torch.rand(8, 197, 1, generator=g)
    # every slot one token (the op's contract), then 40 tokens more into slot 3, the last 7 dropped
    dest = torch.cat([torch.arange(150), torch.full((40,), 3), torch.full((7,), 150)])
    dest = torch.stack([dest[torch.randperm(197, generator=g)] for _ in range(8)])
    want = ops.token_aggregate(x, w, dest, 150, False).numpy()
    inputs = {"x": x.numpy(), "weight": w.numpy(), "dest": dest.numpy()}
    session = node_session("TokenAggregate", inputs, TensorProto.FLOAT, 3, tokens_out=150, normalize=0, tokens=197)
    for _ in range(10):  # the race showed from the second run of a session on
        got = session.run(None, inputs)[0]
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("channels", [1, 4])
@pytest.mark.parametrize("normalize", [False, True])
def test_token_aggregate_returns_what_its_fake_kernel_promises(channels, normalize):
    """torch.compile checks a custom op's real output against its fake (meta) kernel, strides included: the reference's
    slice of its drop-bucket buffer once gave a batch stride of tokens_out + 1 (MCTF's size aggregation, DeiT-B batch 8:
    "expected size 8==8, stride 182==181"). opcheck runs that comparison and the op's other registrations."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 9, channels, generator=gen)
    weight = torch.rand(3, 9, 1, generator=gen)
    dest = torch.randint(0, 6, (3, 9), generator=gen)  # 5 = tokens_out: some tokens dropped
    out = ops.token_aggregate(x, weight, dest, 5, normalize)
    assert out.is_contiguous() and out.stride() == (5 * channels, channels, 1)
    torch.library.opcheck(ops.token_aggregate.default, (x, weight, dest, 5, normalize), test_utils=("test_faketensor", "test_schema"))


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_s_fake_kernel_matches_what_it_computes(name):
    """What torch.compile (and torch.export) assume of each op, its fake kernel's shapes, dtypes and strides, checked by
    torch.library.opcheck on the selftest's own seeded draws (two small shapes of the op's family)."""
    import random

    from deploytk.ops.selftest import FAMILIES

    spec = OPS[name]
    family = FAMILIES[spec.selftest.family]
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    calls = 0
    for k, shape in enumerate(family.shapes(True, rng)[:2]):
        draw = family.draw(shape, k, rng, gen)
        for args, _ in spec.selftest.calls(draw):
            torch.library.opcheck(spec.overload, tuple(args), test_utils=("test_faketensor", "test_schema"))
            calls += 1
    assert calls >= 2
