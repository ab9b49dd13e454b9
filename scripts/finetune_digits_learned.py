"""Fine-tune the digits ViT with each learned reducer (DynamicViT, PatchMerger, SiT, Sinkhorn), as the study does.

"Which Tokens to Use?" inserts the reducer into a pretrained DeiT and fine-tunes the whole
model; this does the same, briefly, with the shipped digits ViT (``assets/digits_vit/``) on the
digits training split, for ``export_configs/digits_vit_{method}_k70.yaml``:

- the learned layers start from deploytk's seeded random init, the ViT from the shipped weights;
- PatchMerger, SiT, Sinkhorn train through the deploytk reference itself (every op is
  differentiable), cross-entropy with label smoothing;
- DynamicViT trains as its paper and the study do: Gumbel-softmax hard keep decisions with the
  dropped tokens masked out of attention (the official ``softmax_with_policy``), loss =
  cross-entropy + 2.0 x the keep-ratio loss + 0.5 x KL to the dense digits ViT (teacher) +
  0.5 x MSE of the kept tokens' final features to the teacher's (the study's defaults); at
  evaluation the predictor's top tokens are kept, as in deploytk's export.

Each checkpoint is written in the official TokenReduction key layout (the ViT's keys and the
learned layers' ``score_predictor.*`` / ``cluster_layers.*``), fp16 safetensors, and the val
top-1 printed is measured on what was written (loaded back through ``build_reference``).
Deterministic (fixed seeds, ``torch.use_deterministic_algorithms``) on a given machine.

    .venv/bin/python scripts/finetune_digits_learned.py [--methods sit sinkhorn] [--epochs 10]
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from train_digits_vit import accuracy, load_split, random_shift, seed_everything  # noqa: E402

METHODS = ("dynamicvit", "patchmerger", "sit", "sinkhorn")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup-epochs", type=int, default=1)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--shift", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


def config_path(method: str) -> Path:
    return ROOT / "export_configs" / f"digits_vit_{method}_k70.yaml"


def policy_attention(blk, x, policy, eps: float = 1e-6):
    """A block's attention (its family's ``BlockParts``) with the dropped tokens masked as DynamicViT trains (each token
    still sees itself)."""
    import torch

    q, k, v = blk.qkv(x)
    logits = (q * blk.scale) @ k.transpose(-2, -1)
    n = x.shape[1]
    mask = policy.reshape(-1, 1, 1, n)
    eye = torch.eye(n, dtype=mask.dtype).view(1, 1, n, n)
    mask = mask + (1.0 - mask) * eye
    weights = (logits - logits.amax(dim=-1, keepdim=True)).exp() * mask
    probs = (weights + eps / n) / (weights.sum(dim=-1, keepdim=True) + eps)
    return blk.attn_output(probs @ v)


def dynamicvit_train_forward(model, images):
    """(logits, patch features after the final norm, last keep decisions [B, N, 1], keep decisions per stage)."""
    import torch
    import torch.nn.functional as F

    family, reduction = model.family, model.reduction
    x = family.embed(images)
    b, p = x.shape[0], reduction.protected
    keep = torch.ones(b, x.shape[1] - p, 1)
    policy = torch.ones(b, x.shape[1], 1)
    decisions = []
    for i, blk in enumerate(family.blocks):
        if i in reduction.stage:
            scores = reduction.layer(i)(x[:, p:], keep)
            keep = F.gumbel_softmax(scores, hard=True)[..., :1] * keep
            decisions.append(keep[..., 0])
            policy = torch.cat([torch.ones(b, p, 1), keep], dim=1)
        x = blk.mlp_residual(blk.attn_residual(x, policy_attention(blk, blk.attn_input(x), policy)))
    x = family.final_norm(x)
    return model.vit.head(x[:, 0]), x[:, p:], keep, decisions


def dense_features(teacher, images):
    import torch

    with torch.no_grad():
        x = teacher.forward_features(images)
        return teacher.forward_head(x), x[:, teacher.num_prefix_tokens :]


def official_state(model) -> dict:
    """The checkpoint in the official layout: the ViT's keys and the learned layers' keys, fp16."""
    import torch

    state = model.vit.state_dict() | model.reduction.state_dict()
    return {k: v.detach().to(torch.float16).contiguous() for k, v in state.items()}


def finetune(method: str, args, data) -> dict:
    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file

    from deploytk.config import load_config
    from deploytk.files import atomic_file
    from deploytk.models import build_reference, create_vit

    seed_everything(args.seed, args.threads)
    x_train, y_train, x_val, y_val = data
    cfg = load_config(config_path(method))
    dense_cfg = load_config(ROOT / "export_configs" / "digits_vit_dense.yaml")
    shipped = str(ROOT / dense_cfg.checkpoint)
    vit = create_vit(dense_cfg.model_copy(update={"checkpoint": shipped}))
    teacher = create_vit(dense_cfg.model_copy(update={"checkpoint": shipped})).eval()
    model = build_reference(cfg.model_copy(update={"checkpoint": None}), vit=vit)
    before = accuracy(model, x_val, y_val)[0]
    params = [p for p in model.parameters()]
    decay = [p for n, p in model.named_parameters() if p.ndim > 1 and "pos_embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim > 1 and "pos_embed" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=args.lr
    )
    steps_per_epoch = math.ceil(len(x_train) / args.batch_size)
    total, warmup = args.epochs * steps_per_epoch, args.warmup_epochs * steps_per_epoch
    fill = float(x_train.min())
    generator = torch.Generator().manual_seed(args.seed)
    ce = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    ratios = [0.7 ** (s + 1) for s in range(len(model.reduction.layers))]
    step, t0, history = 0, time.perf_counter(), []
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = torch.randperm(len(x_train), generator=generator)
        for i in range(0, len(order), args.batch_size):
            idx = order[i : i + args.batch_size]
            xb, yb = random_shift(x_train[idx], args.shift, fill, generator), y_train[idx]
            lr = (
                args.lr * (step + 1) / warmup
                if step < warmup
                else args.lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
            )
            for group in optimizer.param_groups:
                group["lr"] = lr
            if method == "dynamicvit":
                logits, tokens, keep, decisions = dynamicvit_train_forward(model, xb)
                t_logits, t_tokens = dense_features(teacher, xb)
                loss = ce(logits, yb)
                loss = loss + 2.0 * sum(((d.mean(1) - r) ** 2).mean() for d, r in zip(decisions, ratios, strict=True)) / len(ratios)
                loss = loss + 0.5 * F.kl_div(F.log_softmax(logits, -1), F.log_softmax(t_logits, -1), reduction="batchmean", log_target=True)
                kept = keep[..., 0] > 0.5
                if kept.any():
                    loss = loss + 0.5 * (tokens[kept] - t_tokens[kept]).pow(2).mean()
            else:
                loss = ce(model(xb), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            step += 1
        top1 = accuracy(model, x_val, y_val)[0]
        history.append(top1)
        print(f"  {method} epoch {epoch:2d}/{args.epochs}  loss {loss.item():.4f}  val top-1 {100 * top1:.2f}%", flush=True)
    seconds = time.perf_counter() - t0
    out = ROOT / cfg.checkpoint
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, ROOT), *sys.argv[1:]])
    with atomic_file(out) as tmp:
        save_file(official_state(model), str(tmp), metadata={"method": method, "epochs": str(args.epochs), "command": command})
        os.chmod(tmp, 0o644)
    written = build_reference(cfg.model_copy(update={"checkpoint": str(out)}))
    after = accuracy(written, x_val, y_val)[0]
    print(
        f"{method}: val top-1 {100 * before:.2f}% with random learned layers -> {100 * after:.2f}% after {args.epochs} epochs "
        f"({seconds:.0f} s); wrote {os.path.relpath(out, ROOT)} ({out.stat().st_size / 1e6:.2f} MB)",
        flush=True,
    )
    return {"method": method, "before": before, "after": after, "seconds": seconds}


def main(argv=None) -> int:
    args = parse_args(argv)
    seed_everything(args.seed, args.threads)
    from deploytk.config import load_config
    from deploytk.evaluation.accuracy import scan_image_folder
    from deploytk.evaluation.digits import write_digits_imagefolder
    from deploytk.models import create_model

    dense_cfg = load_config(ROOT / "export_configs" / "digits_vit_dense.yaml")
    transform = create_model(dense_cfg.model_copy(update={"checkpoint": None})).eval_transform()
    with tempfile.TemporaryDirectory(prefix="digits-") as tmp:
        write_digits_imagefolder(Path(tmp), img_size=dense_cfg.export.img_size)
        data = (
            *load_split(scan_image_folder(Path(tmp) / "train"), transform),
            *load_split(scan_image_folder(Path(tmp) / "val"), transform),
        )
    rows = [finetune(method, args, data) for method in args.methods]
    print("\n| method | val top-1, random learned layers | after fine-tuning | seconds |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {100 * r['before']:.2f}% | {100 * r['after']:.2f}% | {r['seconds']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
