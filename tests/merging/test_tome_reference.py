"""The batched reference against an independent, per-sample, loop-based reading of ToMe."""

import math

import pytest
import torch

from deploytk.ops.tome_match.reference import merge_tokens


def naive_tome(x, size, metric, r, protected, sort_unmerged):
    """One sample at a time, plain Python lists; written from the algorithm's description."""
    out_x, out_size = [], []
    for xb, sb, mb in zip(x, size, metric, strict=True):
        n = xb.shape[0]
        m = [v / v.norm() for v in mb]
        a_ids, b_ids = list(range(0, n, 2)), list(range(1, n, 2))
        best = {}
        for ia, ta in enumerate(a_ids):
            scores = []
            for tb in b_ids:
                s = float(m[ta] @ m[tb])
                if ta < protected or tb < protected:
                    s = -math.inf
                scores.append(s)
            j = max(range(len(scores)), key=lambda k: (scores[k], -k))  # first max
            best[ia] = (scores[j], j)
        order = sorted(best, key=lambda ia: (-best[ia][0], ia))  # descending, ties by index
        src, unm = order[:r], order[r:]
        if sort_unmerged:
            unm = sorted(unm)
        acc = {ib: [xb[tb] * sb[tb], sb[tb].clone()] for ib, tb in enumerate(b_ids)}
        for ia in src:
            ib = best[ia][1]
            acc[ib][0] = acc[ib][0] + xb[a_ids[ia]] * sb[a_ids[ia]]
            acc[ib][1] = acc[ib][1] + sb[a_ids[ia]]
        tokens = [(xb[a_ids[ia]] * sb[a_ids[ia]], sb[a_ids[ia]]) for ia in unm] + [tuple(acc[ib]) for ib in range(len(b_ids))]
        # protected tokens first, in their original order; then the rest in [A, B] order
        prot_a = [t for ia, t in zip(unm, tokens, strict=False) if a_ids[ia] < protected]
        prot_b = [tokens[len(unm) + ib] for ib, tb in enumerate(b_ids) if tb < protected]
        prefix = [prot_a[i // 2] if i % 2 == 0 else prot_b[i // 2] for i in range(protected)]
        rest = [t for ia, t in zip(unm, tokens, strict=False) if a_ids[ia] >= protected] + [
            tokens[len(unm) + ib] for ib, tb in enumerate(b_ids) if tb >= protected
        ]
        merged = prefix + rest
        out_x.append(torch.stack([t[0] / t[1] for t in merged]))
        out_size.append(torch.stack([t[1] for t in merged]))
    return torch.stack(out_x), torch.stack(out_size)


CASES = [(17, 4, 1, True), (18, 6, 2, True), (21, 5, 5, True), (16, 7, 0, False), (17, 8, 1, True), (9, 1, 0, True)]


@pytest.mark.parametrize("n,r,protected,sort_unmerged", CASES)
def test_reference_matches_naive(n, r, protected, sort_unmerged):
    g = torch.Generator().manual_seed(n * 31 + r)
    x = torch.randn(3, n, 6, generator=g)
    size = torch.rand(3, n, 1, generator=g) * 3 + 1
    metric = torch.randn(3, n, 5, generator=g)
    got_x, got_size = merge_tokens(x, size, metric, r, protected, sort_unmerged)
    want_x, want_size = naive_tome(x, size, metric, r, protected, sort_unmerged)
    assert got_x.shape == (3, n - r, 6)
    torch.testing.assert_close(got_size, want_size, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_x, want_x, rtol=1e-5, atol=1e-5)


def test_merge_conserves_mass_and_size():
    g = torch.Generator().manual_seed(0)
    x, size, metric = torch.randn(2, 33, 8, generator=g), torch.rand(2, 33, 1, generator=g) + 0.5, torch.randn(2, 33, 4, generator=g)
    nx, ns = merge_tokens(x, size, metric, 10, 1, True)
    torch.testing.assert_close(ns.sum(1), size.sum(1))
    torch.testing.assert_close((nx * ns).sum(1), (x * size).sum(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nx[:, 0], x[:, 0])  # the class token never moves or changes
