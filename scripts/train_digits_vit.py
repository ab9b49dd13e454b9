"""Train the small digits ViT that ships in assets/digits_vit/ (CPU, reproducible).

The model is exactly what ``export_configs/digits_vit_dense.yaml`` builds (``create_vit`` with
the config's model_kwargs and img_size, random init seed 0); the data is scikit-learn's
bundled 8x8 digits written as an ImageFolder tree by ``write_digits_imagefolder`` (fixed
stratified split: 1347 train / 450 val). Images go through the eval preprocessing that
``deploytk eval`` uses (the timm family's ``eval_transform``); training adds random shifts of up to
``--shift`` pixels (background-filled). Fixed seeds, ``torch.use_deterministic_algorithms``.

The weights are stored as fp16 safetensors (``load_checkpoint`` casts them to the model's
fp32 on load); the reported val accuracy is measured after that round trip. The script also
writes assets/digits_vit/README.md with the measured numbers and the command.

    .venv/bin/python scripts/train_digits_vit.py            # defaults = the shipped model
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path

from deploytk.files import atomic_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=ROOT / "export_configs" / "digits_vit_dense.yaml")
    p.add_argument("--data", type=Path, default=None, help="Where to write the digits ImageFolder (default: a temp dir, removed).")
    p.add_argument("--output", type=Path, default=ROOT / "assets" / "digits_vit" / "digits_vit.safetensors")
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup-epochs", type=int, default=2)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--shift", type=int, default=2, help="Max random shift in pixels (at img_size), 0 = no augmentation.")
    p.add_argument(
        "--pos-init",
        choices=["sincos", "timm"],
        default="sincos",
        help="Initial position embedding: 2-D sin-cos (learned from there on) or timm's random init.",
    )
    p.add_argument("--pos-scale", type=float, default=0.5, help="Scale of the sin-cos initial position embedding.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-readme", action="store_true", help="Do not (re)write README.md next to the weights.")
    return p.parse_args(argv)


def seed_everything(seed: int, threads: int) -> None:
    import numpy as np
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)


def load_split(folder, transform, kind):
    import numpy as np
    import torch

    from deploytk.data import load_samples

    files = [f for f, _ in folder.samples]
    x = torch.from_numpy(load_samples(files, transform, kind))
    y = torch.from_numpy(np.array([c for _, c in folder.samples], dtype=np.int64))
    return x, y


def random_shift(x, max_shift: int, fill: float, generator):
    """Shift every image by its own random (dy, dx) in [-max_shift, max_shift], filling with ``fill``."""
    import torch

    if max_shift <= 0:
        return x
    n, _, h, w = x.shape
    padded = torch.nn.functional.pad(x, (max_shift,) * 4, value=fill)
    offsets = torch.randint(0, 2 * max_shift + 1, (n, 2), generator=generator)
    return torch.stack([padded[i, :, dy : dy + h, dx : dx + w] for i, (dy, dx) in enumerate(offsets.tolist())])


def sincos_pos_embed(grid: tuple[int, int], dim: int, prefix: int):
    """2-D sin-cos position embedding [1, prefix + h*w, dim] (MAE's), zeros for prefix tokens."""
    import torch

    h, w = grid
    quarter = dim // 4
    omega = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij")
    parts = []
    for coord in (xs.reshape(-1), ys.reshape(-1)):
        angles = coord[:, None] * omega[None, :]
        parts += [angles.sin(), angles.cos()]
    emb = torch.cat(parts, dim=1)
    emb = torch.nn.functional.pad(emb, (0, dim - emb.shape[1]))
    return torch.cat([torch.zeros(prefix, dim, dtype=torch.float64), emb]).unsqueeze(0).float()


def accuracy(model, x, y, batch_size: int = 256) -> tuple[float, float]:
    import torch

    model.eval()
    top1 = top5 = 0
    with torch.inference_mode():
        for i in range(0, len(x), batch_size):
            logits = model(x[i : i + batch_size])
            top1 += int((logits.argmax(-1) == y[i : i + batch_size]).sum())
            top5 += int((logits.topk(5, -1).indices == y[i : i + batch_size, None]).any(-1).sum())
    return top1 / len(x), top5 / len(x)


def main(argv=None) -> int:
    args = parse_args(argv)
    seed_everything(args.seed, args.threads)

    import torch
    from safetensors.torch import save_file

    from deploytk.adapters import adapt
    from deploytk.config import load_config
    from deploytk.evaluation.accuracy import scan_image_folder
    from deploytk.evaluation.digits import write_digits_imagefolder
    from deploytk.machine import host
    from deploytk.models import create_vit

    cfg = load_config(args.config)
    img_size = cfg.export.img_size
    # the checkpoint named in the config is what this script writes: start from random init
    model = create_vit(cfg.model_copy(update={"checkpoint": None}))
    if args.pos_init == "sincos":  # a spatial prior to start from: converges much faster on 1347 images
        with torch.no_grad():
            prefix = 0 if model.no_embed_class else model.num_prefix_tokens
            model.pos_embed.copy_(args.pos_scale * sincos_pos_embed(model.patch_embed.grid_size, model.embed_dim, prefix))
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model {cfg.model} {dict(cfg.model_kwargs)} img_size={img_size}: {params / 1e6:.3f} M parameters, "
        f"{len(model.blocks)} blocks, {model.patch_embed.num_patches + model.num_prefix_tokens} tokens",
        flush=True,
    )

    t_data = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="digits-") as tmp:
        data_root = args.data or Path(tmp) / "digits"
        counts = write_digits_imagefolder(data_root, img_size=img_size)
        family = adapt(model)
        transform = family.eval_transform()
        x_train, y_train = load_split(scan_image_folder(data_root / "train"), transform, family.input_kind)
        x_val, y_val = load_split(scan_image_folder(data_root / "val"), transform, family.input_kind)
    print(
        f"data: {counts['num_train']} train / {counts['num_val']} val images ({time.perf_counter() - t_data:.1f} s); "
        f"transform: {transform}".replace("\n", " "),
        flush=True,
    )
    # the normalised value of a black pixel: what a shifted-in border looks like
    fill = float(x_train.min())

    generator = torch.Generator().manual_seed(args.seed)
    decay = [p for n, p in model.named_parameters() if p.ndim > 1 and "pos_embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim > 1 and "pos_embed" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=args.lr
    )
    steps_per_epoch = math.ceil(len(x_train) / args.batch_size)
    total_steps, warmup_steps = args.epochs * steps_per_epoch, args.warmup_epochs * steps_per_epoch

    def lr_at(step: int) -> float:
        if step < warmup_steps:
            return args.lr * (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return args.lr * 0.5 * (1 + math.cos(math.pi * progress))

    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    history, step = [], 0
    t_train = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        t_epoch = time.perf_counter()
        model.train()
        order = torch.randperm(len(x_train), generator=generator)
        total_loss = correct = 0.0
        for i in range(0, len(order), args.batch_size):
            idx = order[i : i + args.batch_size]
            xb, yb = random_shift(x_train[idx], args.shift, fill, generator), y_train[idx]
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
            logits = model(xb)
            loss = loss_fn(logits, yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
            total_loss += loss.item() * len(idx)
            correct += int((logits.argmax(-1) == yb).sum())
        val_top1, val_top5 = accuracy(model, x_val, y_val)
        row = {
            "epoch": epoch,
            "loss": round(total_loss / len(x_train), 4),
            "train_top1": round(correct / len(x_train), 4),
            "val_top1": round(val_top1, 4),
            "val_top5": round(val_top5, 4),
            "seconds": round(time.perf_counter() - t_epoch, 1),
        }
        history.append(row)
        print(
            f"epoch {epoch:3d}/{args.epochs}  loss {row['loss']:.4f}  train top-1 {100 * row['train_top1']:.2f}%  "
            f"val top-1 {100 * val_top1:.2f}%  top-5 {100 * val_top5:.2f}%  ({row['seconds']:.1f} s)",
            flush=True,
        )
    train_seconds = time.perf_counter() - t_train

    # store fp16 (half the size); measure what ships: the fp16 weights loaded back into fp32
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()}
    fp32_top1, fp32_top5 = accuracy(model, x_val, y_val)
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, ROOT), *(sys.argv[1:] if argv is None else argv)])
    meta = {
        "config": os.path.relpath(args.config.resolve(), ROOT),
        "model": cfg.model,
        "model_kwargs": json.dumps(dict(cfg.model_kwargs)),
        "img_size": str(img_size),
        "dataset": "sklearn.datasets.load_digits, stratified 75/25 split (random_state=0), 8x8 -> bicubic to img_size",
        "epochs": str(args.epochs),
        "seed": str(args.seed),
        "command": command,
        "dtype": "float16",
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(args.output) as tmp_out:
        save_file(state, str(tmp_out), metadata=meta)
        os.chmod(tmp_out, 0o644)
    shipped = create_vit(cfg.model_copy(update={"checkpoint": str(args.output)}))
    val_top1, val_top5 = accuracy(shipped, x_val, y_val)
    size_mb = args.output.stat().st_size / 1e6
    print(f"trained {args.epochs} epochs in {train_seconds:.1f} s on {host()['cpu']} ({args.threads} threads)")
    print(
        f"val top-1 {100 * val_top1:.2f}% top-5 {100 * val_top5:.2f}% (fp16 weights as shipped; "
        f"fp32 before rounding: {100 * fp32_top1:.2f}% / {100 * fp32_top5:.2f}%)"
    )
    print(f"wrote {args.output} ({size_mb:.2f} MB)")

    summary = {
        "command": command,
        "train_seconds": round(train_seconds, 1),
        "val_top1": val_top1,
        "val_top5": val_top5,
        "val_top1_fp32": fp32_top1,
        "params": params,
        "file_mb": round(size_mb, 2),
        "device": host(),
        "torch": torch.__version__,
        "history": history,
    }
    if not args.no_readme:
        write_readme(args, cfg, counts, summary)
    return 0


def write_readme(args, cfg, counts, s) -> None:
    import timm

    last = s["history"][-1]
    best = max(s["history"], key=lambda r: r["val_top1"])
    epochs_table = "\n".join(
        f"| {r['epoch']} | {r['loss']:.4f} | {100 * r['train_top1']:.2f} | {100 * r['val_top1']:.2f} | {r['seconds']:.1f} |"
        for r in s["history"]
    )
    kw = ", ".join(f"{k}: {v}" for k, v in cfg.model_kwargs.items())
    text = f"""# digits_vit: a small ViT trained on scikit-learn's 8x8 digits

A timm `VisionTransformer` small enough to train on a 2-core CPU, so that the accuracy of
token-merging methods versus GFLOPs can be measured without downloading any dataset or
pretrained weights (`deploytk eval`, `benchmarks/accuracy_vs_gflops.py`).

*This file is written by `scripts/train_digits_vit.py` with the numbers of its run.*

| | |
|---|---|
| model | `{cfg.model}` with `{{{kw}}}`, `img_size` {cfg.export.img_size}: 12 blocks, width 96, 3 heads, patch 4 -> 64 patches + class token = 65 tokens, {s["params"] / 1e6:.2f} M parameters |
| configs | `export_configs/digits_vit_dense.yaml` (r=0), `export_configs/digits_vit_tome_r4.yaml` (ToMe r=4), ... |
| weights | `digits_vit.safetensors`, fp16 ({s["file_mb"]:.2f} MB); `load_checkpoint` casts to the model's fp32 |
| data | `sklearn.datasets.load_digits()` (1797 images), stratified split `train_test_split(test_size=0.25, random_state=0, stratify=y)`: {counts["num_train"]} train / {counts["num_val"]} val; intensities 0..16 -> 0..255, 8x8 -> {cfg.export.img_size}x{cfg.export.img_size} PIL bicubic, RGB PNG (`deploytk.evaluation.digits.write_digits_imagefolder`) |
| preprocessing | timm's eval transform for the model (`TimmViT.eval_transform` in `deploytk/adapters/timm_vit.py`: resize {int(cfg.export.img_size / 0.9)} bicubic, center crop {cfg.export.img_size}, mean/std 0.5), the same as `deploytk eval` |
| training | initial position embedding {"2-D sin-cos x " + str(args.pos_scale) if args.pos_init == "sincos" else "timm's"} (then learned), AdamW (lr {args.lr}, weight decay {args.weight_decay} on matrices), batch {args.batch_size}, {args.epochs} epochs, {args.warmup_epochs} warm-up epochs then cosine, label smoothing {args.label_smoothing}, grad-norm clip 1.0, random shifts of up to {args.shift} px; seed {args.seed}, `torch.use_deterministic_algorithms(True)`, {args.threads} CPU threads |
| train time | **{s["train_seconds"]:.0f} s** on {s["device"]["cpu"]} ({s["device"]["cpu_count"]} cores), torch {s["torch"]}, timm {timm.__version__} |
| **val top-1** | **{100 * s["val_top1"]:.2f}%** (top-5 {100 * s["val_top5"]:.2f}%), {counts["num_val"]} images, fp16 weights as shipped (fp32 before rounding: {100 * s["val_top1_fp32"]:.2f}%) |

Command (from the repository root, in the project venv):

```bash
{s["command"]}
```

The weights are those of the last epoch (no selection on the val split): loss {last["loss"]:.4f}, train top-1
{100 * last["train_top1"]:.2f}%. Best val top-1 seen during training: {100 * best["val_top1"]:.2f}% (epoch {best["epoch"]}).
The run is deterministic on a given machine and software stack; other CPUs or library
versions may change the last digits.

Check it (dense and ToMe, PyTorch and ONNX Runtime):

```bash
python -c "from deploytk.evaluation import write_digits_imagefolder as w; w('/tmp/digits')"
deploytk eval export_configs/digits_vit_dense.yaml --data /tmp/digits/val
deploytk eval export_configs/digits_vit_tome_r4.yaml --data /tmp/digits/val
```

## Per-epoch log

| epoch | train loss | train top-1 % | val top-1 % | seconds |
|---:|---:|---:|---:|---:|
{epochs_table}
"""
    (args.output.parent / "README.md").write_text(text)


if __name__ == "__main__":
    sys.exit(main())
