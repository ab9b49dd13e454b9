"""`deploytk inspect`: a config's token schedule, method options and GFLOPs, without weights or export.

The same summaries go into every export's manifest.
"""

from __future__ import annotations

from deploytk.analysis.flops import FlopReport, count_flops
from deploytk.config import DeployConfig
from deploytk.merging.merged_vit import MergedViT
from deploytk.models import build_reference
from deploytk.progress import SILENT, Progress


def img_size_of(model: MergedViT) -> tuple[int, int]:
    return model.family.img_size


def schedule_summary(model: MergedViT) -> dict:
    s = model.schedule
    return {
        "requested_r": s.requested_r,
        "effective_r": s.effective_r,
        "tokens_per_layer": s.tokens,
        "tokens_out": s.tokens_out,
        "protected_tokens": s.protected,
        "capped": s.capped,
    }


def method_summary(cfg: DeployConfig) -> dict:
    """The method with every option resolved (defaults filled in), for the manifest."""
    method = cfg.merge.reduction
    options = cfg.merge.parsed_options.model_dump(mode="json")
    if options.get("tuned") is None:  # every method's provenance field: only shown when `deploytk tune` wrote it
        options.pop("tuned", None)
    return {"name": method.name, "summary": method.summary, "options": options}


def output_summary(model: MergedViT) -> dict:
    """What the graph outputs: the kind, its settings and, for ``tokens``, K (static)."""
    out = model.output
    summary = {"kind": model.output_kind, "names": model.output_names, "feature_layer": out.feature_layer, "blocks_run": model.blocks_run}
    if model.output_kind == "tokens":
        summary |= {"tokens": model.output_tokens, "keep_prefix_tokens": out.keep_prefix_tokens, "token_map": out.token_map}
    return summary


def flops_summary(model: MergedViT, dense: FlopReport | None = None) -> dict:
    """The manifest's FLOPs record; ``dense``: the unreduced model's count when already made (it does not depend on
    the schedule)."""
    merged = count_flops(model)
    dense = dense or dense_flops(model)
    return {
        "gflops": round(merged.total_gflops, 4),
        "gflops_per_layer": [round(v, 4) for v in merged.per_block_gflops],
        "gflops_outside_blocks": round(merged.other_gflops, 4),
        "gflops_of_parts": {label: round(v, 4) for label, v in merged.parts_gflops.items()},
        "params_millions": round(sum(p.numel() for p in model.parameters()) / 1e6, 3),
        "stem_blocks": model.family.stem_blocks,
        "dense_gflops": round(dense.total_gflops, 4),
        "flop_reduction": round(dense.total_gflops / merged.total_gflops, 4),
    }


def dense_flops(model: MergedViT) -> FlopReport:
    """The same weights without reduction, counted the same way."""
    return count_flops(MergedViT.dense(model.family, model.prop_attn, model.output))


def inspect_config(cfg: DeployConfig, progress: Progress = SILENT, dense: FlopReport | None = None) -> dict:
    """Schedule and FLOPs of ``cfg`` with random weights (they do not change either); ``dense``: the unreduced model's
    count when already made."""
    cfg = cfg.model_copy(update={"checkpoint": None, "pretrained": False})
    progress.step("building the model")
    model = build_reference(cfg)
    progress.step("counting FLOPs")
    flops = flops_summary(model, dense)
    return {
        "model": cfg.model,
        "method": cfg.merge.method,
        "r": cfg.merge.model_dump(mode="json")["r"] if cfg.merge.reduction.uses_r else None,  # keep-rate methods: none
        "prop_attn": cfg.merge.prop_attn,
        "method_options": method_summary(cfg)["options"],
        "input": model.family.input_kind.record(),
        "output": output_summary(model),
        **schedule_summary(model),
        **flops,
    }


def inspect_schedules(configs: list[DeployConfig], progress: Progress = SILENT) -> list[dict]:
    """``inspect_config`` of several schedules of one model: the unreduced model is counted once."""
    answers: list[dict] = []
    dense = None
    for i, cfg in enumerate(configs):
        progress.step(f"schedule {i + 1} of {len(configs)}")
        if dense is None:
            model = build_reference(cfg.model_copy(update={"checkpoint": None, "pretrained": False}))
            dense = dense_flops(model)
        answers.append(inspect_config(cfg, progress, dense))
    return answers
