"""`tune`'s report (every candidate measured, the choice and the next less aggressive one, a message) and its plot."""

from __future__ import annotations

from deploytk.files import FileOutput
from deploytk.tuning.search import Search


def build_report(config, cfg, search: Search, backend, batch, percentile, folder, device) -> dict:
    budget = search.budget
    measured = [c for c in search.candidates if c.latencies]
    rows = [c.row(budget) for c in measured]
    dense = round(search.dense_latency(), 3)
    report = {
        "config": str(config),
        "model": cfg.model,
        "method": cfg.merge.method,
        "knob": cfg.merge.reduction.tune_knob,
        "budget_ms": budget,
        "percentile": percentile,
        "batch": batch,
        "backend": backend.name,
        "device": device,
        "dense_latency_ms": dense,
        "dense_gflops": measured[0].dense_gflops,
        "candidates": len(search.candidates),
        "measurements": search.runs,
        "exports": len(measured),
        "data": str(folder.root) if folder else None,
        "outcome": search.outcome,
        "measured": sorted(rows, key=lambda r: -r["estimated_gflops"]),
        "chosen": None,
        "next_less_aggressive": None,
        "output": None,
    }
    most = search.candidates[-1]
    if search.outcome == "dense":
        report["message"] = (
            f"the dense model already meets the budget: its {percentile} is {dense:.2f} ms <= {budget:g} ms at batch {batch} on "
            f"{backend.name} (the most aggressive schedule, {most.label}, takes {most.latency:.2f} ms); no reduction is needed, so no "
            "config was written."
        )
        return report
    if search.outcome == "impossible":
        report["message"] = (
            f"no schedule meets {budget:g} ms: the most aggressive, {most.label} ({most.gflops} GFLOPs), takes {most.latency:.2f} ms "
            f"({percentile}, batch {batch}, {backend.name}; dense {dense:.2f} ms). Raise the budget, lower the batch, or use a faster "
            "backend or a smaller model."
        )
        return report
    lo, hi = search.boundary
    within = [c for c in measured if c.latency <= budget]
    chosen = search.candidates[hi]
    if folder is not None:  # the most accurate within budget; ties: the least aggressive
        chosen = max(within, key=lambda c: (c.accuracy["top1"], c.cost))
    report["chosen"] = chosen.row(budget)
    report["next_less_aggressive"] = search.candidates[lo].row(budget) if lo >= 0 else {"label": "dense", "latency_ms": dense}
    nxt = report["next_less_aggressive"]
    report["message"] = (
        f"{chosen.label}: {percentile} {chosen.latency:.2f} ms <= {budget:g} ms (dense {dense:.2f} ms, {chosen.gflops} GFLOPs); the next "
        f"less aggressive, {nxt['label']}, takes {nxt['latency_ms']:.2f} ms."
    )
    return report


def plot(report: dict, out: FileOutput) -> str | None:
    """Latency vs GFLOPs of every measured candidate (top-1 as colour with ``data``), the budget and the choice; None without matplotlib."""
    try:
        import matplotlib  # optional (the bench extra): the JSON has every number

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [r for r in report["measured"] if r["latency_ms"] is not None]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    top1 = [r["top1"] for r in rows]
    if all(t is not None for t in top1):
        xs, ys = [r["gflops"] for r in rows], [r["latency_ms"] for r in rows]
        points = ax.scatter(xs, ys, c=[100 * t for t in top1], cmap="viridis", zorder=3)
        fig.colorbar(points, ax=ax, label="top-1 (%)")
    else:
        ax.scatter([r["gflops"] for r in rows], [r["latency_ms"] for r in rows], color="tab:blue", zorder=3, label="candidates")
    for r in rows:
        ax.annotate(r["label"], (r["gflops"], r["latency_ms"]), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.scatter([report["dense_gflops"]], [report["dense_latency_ms"]], marker="s", color="black", zorder=3, label="dense")
    ax.axhline(report["budget_ms"], color="tab:red", linestyle="--", label=f"budget {report['budget_ms']:g} ms")
    if report["chosen"]:
        ch = report["chosen"]
        label = f"chosen: {ch['label']}"
        ax.scatter([ch["gflops"]], [ch["latency_ms"]], s=160, facecolors="none", edgecolors="tab:red", zorder=4, label=label)
    ax.set_xlabel("GFLOPs (per image)")
    ax.set_ylabel(f"{report['percentile']} latency (ms), batch {report['batch']}")
    ax.set_title(f"{report['model']} {report['method']} on {report['backend']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out.save_figure(fig, dpi=120)
    plt.close(fig)
    return str(out.path)
