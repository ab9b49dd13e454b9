"""Argument checks shared by the matching ops: the torch op and the kernel launcher run them before any compute."""

from __future__ import annotations

from deploytk.errors import DeploytkError


def check_match_args(name: str, metric, extra: dict, r: int, protected: int) -> None:
    """metric [B, N, D] plus per-token inputs [B, N] or [B, N, 1]; r in [1, (N - protected) // 2] (ToMe's cap)."""
    shapes = {"metric": tuple(metric.shape), **{k: tuple(v.shape) for k, v in extra.items()}}
    if metric.dim() != 3:
        raise DeploytkError(f"{name} expects metric [B, N, D]; got shapes {shapes}.")
    b, n = metric.shape[:2]
    for t in extra.values():
        if tuple(t.shape[:2]) != (b, n) or (t.dim() == 3 and t.shape[2] != 1) or t.dim() not in (2, 3):
            raise DeploytkError(f"{name} inputs disagree on batch/token count (want [{b}, {n}, ...]): {shapes}.")
    if protected < 0 or protected > n:
        raise DeploytkError(f"{name}: protected={protected} must be in [0, {n}] for {n} tokens.")
    cap = (n - protected) // 2
    if r < 1 or r > cap:
        raise DeploytkError(f"{name}: r={r} is not allowed for {n} tokens with {protected} protected; r must be in [1, {cap}].")


def check_select_args(name: str, scores, keep: int, protected: int, metric=None) -> None:
    """scores [B, N] (and metric [B, N, D]); keep in [1, N - protected - 1]."""
    if scores.dim() != 2 or (metric is not None and (metric.dim() != 3 or metric.shape[:2] != scores.shape)):
        got = f"scores {tuple(scores.shape)}" + (f", metric {tuple(metric.shape)}" if metric is not None else "")
        want = " and metric [B, N, D]" if metric is not None else ""
        raise DeploytkError(f"{name} expects scores [B, N]{want}; got {got}.")
    n = scores.shape[1]
    if protected < 0 or protected >= n:
        raise DeploytkError(f"{name}: protected={protected} must be in [0, {n - 1}] for {n} tokens.")
    if keep < 1 or keep >= n - protected:
        raise DeploytkError(
            f"{name}: keep={keep} is not allowed for {n} tokens with {protected} protected; keep must be in [1, {n - protected - 1}]."
        )


def check_cluster_args(name: str, dist, clusters: int, weight=None) -> None:
    """dist [B, M, M] (and weight [B, M]); clusters in [1, M]."""
    if dist.dim() != 3 or dist.shape[1] != dist.shape[2] or (weight is not None and tuple(weight.shape) != tuple(dist.shape[:2])):
        got = f"dist {tuple(dist.shape)}" + (f", weight {tuple(weight.shape)}" if weight is not None else "")
        want = " and weight [B, M]" if weight is not None else ""
        raise DeploytkError(f"{name} expects pairwise distances dist [B, M, M]{want}; got {got}.")
    m = dist.shape[1]
    if not 1 <= clusters <= m:
        raise DeploytkError(f"{name}: clusters={clusters} is not allowed for {m} tokens; clusters must be in [1, {m}].")
