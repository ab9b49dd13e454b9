"""Train the multi-scale digits ViT with crucial-token mergence, and the plain digits ViT with it, the same way.

"Multi-Scale And Token Mergence" trains its multi-scale model with the token mergence in place (Table 3 ablates
token mergence, TM, and the multi-scale fusion, MF, on EViT-DeiT-S). This script does the digits version of that
comparison on a 2-core CPU, for two configs:

- ``export_configs/digits_vit_crucial_k70_trained.yaml``: the digits ViT (12 blocks, width 96, patch 4, 32 px)
  with crucial mergence at keep rate 0.7 in blocks 3, 6, 9 (+TM);
- ``export_configs/digits_vit_multiscale_crucial_k70.yaml``: the same ViT as the multi-scale model
  (``deploytk/adapters/multiscale_vit.py``: an 8x8 and a 4x4 token grid, fused before block 3) with the same
  mergence (+TM +MF).

Both train from random init (seeded alike: every parameter the two share starts equal) with the recipe of
``scripts/train_digits_vit.py`` (AdamW, 50 epochs, warm-up then cosine, label smoothing, random shifts, 2-D sin-cos
initial position embeddings, also for the low scale) through the merged PyTorch reference itself: the crucial
choice is made by the op, TokenAggregate passes gradients to the tokens and their class-attention weights. As the
paper does (after EViT), the keep rate goes from 1 to 0.7 on a cosine over ``--shrink-epochs`` epochs starting at
``--shrink-start``. The weights are written as fp16 safetensors (the checkpoint each config names), and the val
top-1 printed is measured on what was written (loaded back through the config).

    .venv/bin/python scripts/train_digits_multiscale.py [--epochs 50] [--only multiscale]
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
from train_digits_vit import accuracy, load_split, random_shift, seed_everything, sincos_pos_embed  # noqa: E402

CONFIGS = {
    "plain": ROOT / "export_configs" / "digits_vit_crucial_k70_trained.yaml",
    "multiscale": ROOT / "export_configs" / "digits_vit_multiscale_crucial_k70.yaml",
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=sorted(CONFIGS), nargs="+", default=list(CONFIGS))
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup-epochs", type=int, default=2)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--shift", type=int, default=2)
    p.add_argument("--pos-scale", type=float, default=0.5)
    p.add_argument("--shrink-start", type=int, default=3, help="First epoch (1-based) with a keep rate below 1.")
    p.add_argument("--shrink-epochs", type=int, default=15, help="Epochs over which the keep rate goes from 1 to the config's.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


def keep_rate_at(epoch: int, target: float, args) -> float:
    """EViT's warm-up of the keep rate: 1 until ``shrink_start``, then a cosine down to ``target``."""
    done = min(max(epoch - args.shrink_start + 1, 0) / args.shrink_epochs, 1.0)
    return target + (1.0 - target) * 0.5 * (1 + math.cos(math.pi * done))


def train(which: str, args, data) -> dict:
    import torch
    from safetensors.torch import save_file

    from deploytk.config import load_config
    from deploytk.files import atomic_file
    from deploytk.merging.merged_vit import build_merged
    from deploytk.models import build_reference, create_vit

    seed_everything(args.seed, args.threads)
    x_train, y_train, x_val, y_val = data
    cfg = load_config(CONFIGS[which])
    vit = create_vit(cfg.model_copy(update={"checkpoint": None}))
    with torch.no_grad():  # the spatial prior train_digits_vit.py starts from, on each token grid
        grids = [("pos_embed", vit.patch_embed.grid_size)] + ([("pos_embed_low", vit.grid_low)] if hasattr(vit, "grid_low") else [])
        for name, grid in grids:
            getattr(vit, name).copy_(args.pos_scale * sincos_pos_embed(tuple(grid), vit.embed_dim, 1))
    method, options = cfg.merge.reduction, cfg.merge.parsed_options
    target = float(options.keep_rate)
    params = sum(p.numel() for p in vit.parameters())
    print(f"{which}: {cfg.model} {dict(cfg.model_kwargs)}: {params / 1e6:.3f} M parameters", flush=True)

    decay = [p for n, p in vit.named_parameters() if p.ndim > 1 and "pos_embed" not in n]
    no_decay = [p for n, p in vit.named_parameters() if not (p.ndim > 1 and "pos_embed" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=args.lr
    )
    steps_per_epoch = math.ceil(len(x_train) / args.batch_size)
    total, warmup = args.epochs * steps_per_epoch, args.warmup_epochs * steps_per_epoch
    fill = float(x_train.min())
    generator = torch.Generator().manual_seed(args.seed)
    ce = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    step, t0, history = 0, time.perf_counter(), []
    for epoch in range(1, args.epochs + 1):
        keep = keep_rate_at(epoch, target, args)
        model = build_merged(method, vit, cfg.r_spec(), cfg.merge.prop_attn, options.model_copy(update={"keep_rate": keep}))
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
            loss = ce(model(xb), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(vit.parameters(), 1.0)
            optimizer.step()
            step += 1
        top1 = accuracy(model, x_val, y_val)[0]
        history.append(top1)
        print(
            f"  {which} epoch {epoch:2d}/{args.epochs}  keep rate {keep:.3f}  loss {loss.item():.4f}  val top-1 {100 * top1:.2f}%",
            flush=True,
        )
    seconds = time.perf_counter() - t0
    out = ROOT / cfg.checkpoint
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, ROOT), *sys.argv[1:]])
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in vit.state_dict().items()}
    with atomic_file(out) as tmp:
        save_file(
            state, str(tmp), metadata={"config": os.path.relpath(CONFIGS[which], ROOT), "epochs": str(args.epochs), "command": command}
        )
        os.chmod(tmp, 0o644)
    written = build_reference(cfg.model_copy(update={"checkpoint": str(out)}))
    after = accuracy(written, x_val, y_val)[0]
    print(
        f"{which}: val top-1 {100 * after:.2f}% at keep rate {target} after {args.epochs} epochs ({seconds:.0f} s); "
        f"wrote {os.path.relpath(out, ROOT)} ({out.stat().st_size / 1e6:.2f} MB)",
        flush=True,
    )
    return {"model": which, "params": params, "top1": after, "best_seen": max(history), "seconds": seconds}


def main(argv=None) -> int:
    args = parse_args(argv)
    seed_everything(args.seed, args.threads)
    from deploytk.config import load_config
    from deploytk.evaluation.accuracy import scan_image_folder
    from deploytk.evaluation.digits import write_digits_imagefolder
    from deploytk.models import create_model

    cfg = load_config(CONFIGS["plain"])
    transform = create_model(cfg.model_copy(update={"checkpoint": None})).eval_transform()
    with tempfile.TemporaryDirectory(prefix="digits-") as tmp:
        write_digits_imagefolder(Path(tmp), img_size=cfg.export.img_size)
        data = (
            *load_split(scan_image_folder(Path(tmp) / "train"), transform),
            *load_split(scan_image_folder(Path(tmp) / "val"), transform),
        )
    rows = [train(which, args, data) for which in args.only]
    print(
        "\n| model (crucial, keep 0.7, trained with it) | parameters | val top-1 | best val top-1 seen | seconds |\n|---|---|---|---|---|"
    )
    for r in rows:
        print(f"| {r['model']} | {r['params'] / 1e6:.3f} M | {100 * r['top1']:.2f}% | {100 * r['best_seen']:.2f}% | {r['seconds']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
