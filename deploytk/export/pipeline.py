"""`deploytk export`: config -> reference -> model.onnx + manifest.json, atomically."""

from __future__ import annotations

import json
import time
from pathlib import Path

from deploytk.analysis.flops import count_flops
from deploytk.config import DeployConfig, config_to_dict
from deploytk.errors import DeploytkError
from deploytk.export.artifacts import MANIFEST_FILE, MODEL_FILE, atomic_directory
from deploytk.export.manifest import now_utc, package_versions, sha256_file
from deploytk.export.onnx_export import INPUT_NAME, IR_VERSION, OUTPUT_NAME, custom_op_counts, export_model
from deploytk.merging.patch import MergedViT
from deploytk.merging.precision import to_precision
from deploytk.models import build_reference


def img_size_of(model: MergedViT) -> tuple[int, int]:
    return tuple(int(v) for v in model.vit.patch_embed.img_size)


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
    from deploytk.merging.registry import get_method

    method = get_method(cfg.merge.method)
    return {"name": method.name, "summary": method.summary, "options": method.parse_options(cfg.merge.options).model_dump(mode="json")}


def flops_summary(model: MergedViT) -> dict:
    img = img_size_of(model)
    merged = count_flops(model, img)
    dense = count_flops(MergedViT(model.vit, [0] * len(model.vit.blocks), model.prop_attn), img)  # same weights, no reduction
    return {
        "gflops": round(merged.total_gflops, 4),
        "gflops_per_layer": [round(v, 4) for v in merged.per_block_gflops],
        "gflops_outside_blocks": round(merged.other_gflops, 4),
        "dense_gflops": round(dense.total_gflops, 4),
        "flop_reduction": round(dense.total_gflops / merged.total_gflops, 4),
    }


def run_export(cfg: DeployConfig, output: Path, step=lambda msg: None) -> dict:
    """Export and return the manifest; nothing is left at ``output`` if anything fails."""
    step("building the PyTorch reference")
    model = build_reference(cfg)
    step("counting FLOPs")
    flops = flops_summary(model)
    if cfg.export.precision != "fp32":
        step(f"casting to {cfg.export.precision} (norms, softmax, sizes, matching in fp32)")
        to_precision(model, cfg.export.precision)
    img = img_size_of(model)
    with atomic_directory(output) as tmp:
        step("exporting to ONNX (torch.onnx, dynamo)")
        t0 = time.perf_counter()
        proto = export_model(model, img, cfg.export.batch_size, cfg.export.opset, tmp / MODEL_FILE)
        seconds = time.perf_counter() - t0
        counts = custom_op_counts(proto)
        expected = {k: v for k, v in model.expected_custom_ops().items() if v}
        # a layer's size aggregation is dead code (and removed) when nothing after it reads sizes
        slack = {"TokenAggregate": sum(v for k, v in expected.items() if k.endswith(("Match", "Select")))}
        if set(counts) != set(expected) or any(not expected[k] - slack.get(k, 0) <= counts[k] <= expected[k] for k in expected):
            raise DeploytkError(f"internal: exported custom ops {counts} differ from the schedule's {expected}.")
        step("writing manifest")
        manifest = {
            "format": "deploytk-artifact/1",
            "created": now_utc(),
            "config": config_to_dict(cfg) | {"checkpoint": str(Path(cfg.checkpoint).resolve()) if cfg.checkpoint else None},
            "model": {
                "name": cfg.model,
                "class": type(model.vit).__name__,
                "img_size": list(img),
                "num_classes": int(model.vit.num_classes),
                "blocks": len(model.vit.blocks),
                "checkpoint_sha256": sha256_file(Path(cfg.checkpoint)) if cfg.checkpoint else None,
            },
            "schedule": schedule_summary(model),
            "method": method_summary(cfg),
            **flops,
            "inputs": [{"name": INPUT_NAME, "dtype": "float32", "shape": ["batch", 3, *img]}],
            "outputs": [{"name": OUTPUT_NAME, "dtype": "float32", "shape": ["batch", int(model.vit.num_classes)]}],
            "custom_ops": counts,
            "onnx": {
                "file": MODEL_FILE,
                "sha256": sha256_file(tmp / MODEL_FILE),
                "ir_version": IR_VERSION,
                "opset": cfg.export.opset,
                "precision": cfg.export.precision,
                "export_seconds": round(seconds, 2),
            },
            "versions": package_versions(),
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
