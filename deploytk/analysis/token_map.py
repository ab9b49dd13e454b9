"""Where every patch of an image went: source tracking through a token-reducing ViT, and its picture.

``recording(model)`` runs the merged reference unchanged and records, per block, how the
tokens entering it map onto the tokens leaving it:

- a matching/selection op (``MergedViT.match``, through ``dest_hook``) gives ``dest``, each
  input token's output slot (see each op's ``reference.py``). An op that sees the patch tokens
  only (ATSSample, KMedoidsSelect, DPCKNNAssign) numbers its slots after the protected prefix,
  which keeps its places. The slot past the last output token is the drop bucket (Top-K,
  DynamicViT, K-Medoids' non-medoids); TopKSelect's rest slot (protected + keep) is a real
  token when the method keeps it (EViT's fused token), and its tokens are marked *fused*;
- a learned soft merge (``LearnedMerge``: PatchMerger, SiT, Sinkhorn) makes every output token a
  mixture of all patches; its layer's ``mixing`` gives the weights [K, N], and each input token is
  drawn in the output token that weights it most (an argmax: the picture says so);
- a block that has fewer tokens out than in without either keeps the leading tokens (ATM's last
  block keeps only the class token).

``track_sources`` composes those maps into, for every block, the token each original patch
belongs to after it (or -1: dropped). ``draw`` renders the panels (numpy) and ``save_figure``
writes them with matplotlib (optional: the ``bench`` extra).
"""

from __future__ import annotations

import colorsys
import contextlib
import math
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from deploytk.adapters import ModelFamily
from deploytk.data import load_samples
from deploytk.errors import DeploytkError, file_problem
from deploytk.files import FileOutput
from deploytk.merging.learned import LearnedMerge
from deploytk.merging.merged_vit import MergedViT
from deploytk.ops import spec_for

#: ``colors``: each token in the mean colour of its patches (ToMe's pictures), or one of a fixed palette
COLORS = ("mean", "random")
#: how many reducing blocks are drawn when ``layers`` is not given
DEFAULT_PANELS = 4
#: the PNG's layout: inches per panel (width, height), dots per inch, panels per row, inches for the legend
PANEL_INCHES = (3.0, 3.3)
DPI = 100
MAX_COLUMNS = 5
LEGEND_INCHES = 0.7
CAPTION_CHAR_POINTS = 5.0  # the average width of a character of the 8-point caption
#: panels are upscaled (nearest) to at least this many pixels so that boundaries stay thin
MIN_PANEL_PIXELS = 224


@dataclass
class BlockRecord:
    """How block ``block`` maps its input tokens onto its output tokens (image 0 of the batch)."""

    block: int
    tokens_in: int
    tokens_out: int
    #: identity (no reduction) | match (a deploytk op's ``dest``) | soft (a learned mixture) | truncate
    kind: str = "identity"
    op: str | None = None
    dest: np.ndarray | None = None  # [L] the op's dest
    offset: int = 0  # tokens before the ones ``dest`` covers (the protected prefix, for patch-only ops)
    rest_slot: int | None = None  # TopKSelect: the slot of the tokens it does not keep
    weights: np.ndarray | None = None  # soft: [K, N] the share of each input patch token in each output token

    def token_map(self) -> tuple[np.ndarray, np.ndarray]:
        """(output token of every input token, -1 where dropped; True where it went into a fused token)."""
        n_in, n_out = self.tokens_in, self.tokens_out
        fused = np.zeros(n_in, dtype=bool)
        if self.kind == "identity":
            return np.arange(n_in), fused
        if self.kind == "truncate":
            where = np.arange(n_in)
            return np.where(where < n_out, where, -1), fused
        p = self.offset
        where = np.arange(n_in)  # the prefix before the op's tokens keeps its places
        if self.kind == "soft":
            where[p:] = p + self.weights.argmax(axis=0)
            return where, fused
        slots = n_out - p
        dest = self.dest.astype(np.int64)
        if dest.shape != (n_in - p,) or dest.min() < 0 or dest.max() > slots:
            raise DeploytkError(
                f"block {self.block}: {self.op}'s dest (shape {list(dest.shape)}, values {dest.min()}..{dest.max()}) does not fit "
                f"{n_in} tokens in and {n_out} out."
            )
        where[p:] = np.where(dest < slots, p + dest, -1)
        if self.rest_slot is not None and self.rest_slot < slots:  # the rest is kept as one token: fused
            fused[p:] = dest == self.rest_slot
        return where, fused


@dataclass
class Sources:
    """Every original patch's token after each block."""

    grid: tuple[int, int]  # patch rows, columns
    protected: int
    records: list[BlockRecord]
    owner: np.ndarray = field(init=False)  # [depth, P]: token index after block i, -1 where dropped
    fused: np.ndarray = field(init=False)  # [depth, P]: the patch went into a fused token (and is still there)

    def __post_init__(self):
        patches = self.grid[0] * self.grid[1]
        cur, fused = self.protected + np.arange(patches), np.zeros(patches, dtype=bool)
        owners, flags = [], []
        for rec in self.records:
            where, into_fused = rec.token_map()
            alive = cur >= 0
            idx = np.where(alive, cur, 0)
            fused = np.where(alive, fused | into_fused[idx], False)
            cur = np.where(alive, where[idx], -1)
            fused &= cur >= 0
            owners.append(cur)
            flags.append(fused)
        self.owner, self.fused = np.stack(owners), np.stack(flags)

    @property
    def depth(self) -> int:
        return len(self.records)

    @property
    def reducing_blocks(self) -> list[int]:
        return [r.block for r in self.records if r.kind != "identity"]

    def tokens(self, block: int) -> int:
        """Tokens after ``block`` (protected ones included, empty slots too)."""
        return self.records[block].tokens_out

    def soft_upto(self, block: int) -> bool:
        """Some assignment up to ``block`` is the argmax of a learned mixture."""
        return any(r.kind == "soft" for r in self.records[: block + 1])

    def summary(self, block: int) -> dict:
        owner = self.owner[block]
        kept = owner[owner >= 0]
        return {
            "block": block,
            "tokens": self.tokens(block),
            "tokens_with_patches": int(np.unique(kept).size),
            "patches_dropped": int((owner < 0).sum()),
            "patches_fused": int(self.fused[block].sum()),
            "soft_assignment": self.soft_upto(block),
        }

    def with_dests(self, dests: list[np.ndarray], source: str) -> Sources:
        """The same structure with every matching op's ``dest`` replaced (in call order) by another run's, e.g. a runtime's."""
        matches = [r for r in self.records if r.kind == "match"]
        if len(dests) != len(matches):
            raise DeploytkError(f"{source} has {len(dests)} matching/selection ops, the PyTorch reference made {len(matches)} choices.")
        it = iter(dests)
        records = []
        for rec in self.records:
            if rec.kind == "match":
                dest = np.asarray(next(it)).reshape(-1)
                if dest.shape != rec.dest.shape:
                    raise DeploytkError(
                        f"{source}: {rec.op} in block {rec.block} gives {dest.size} choices, the reference {rec.dest.size}."
                    )
                rec = replace(rec, dest=dest)
            records.append(rec)
        return Sources(self.grid, self.protected, records)


# ---- recording ------------------------------------------------------------------------------


@contextlib.contextmanager
def recording(model: MergedViT) -> Iterator[list[BlockRecord]]:
    """Record every block's token map while ``model`` runs (image 0); the numbers computed are unchanged.

    The method's ``block`` is wrapped on the instance and ``dest_hook`` observes the matching ops
    (an existing hook still runs, first); both are restored on exit.
    """
    reduction = model.reduction
    records: list[BlockRecord] = []
    calls: list[tuple[str, tuple, torch.Tensor]] = []
    previous_hook = model.dest_hook

    def hook(op_name, args, dest):
        if previous_hook is not None:
            dest = previous_hook(op_name, args, dest)
        calls.append((op_name, args, dest))
        return dest

    def block(m, i, blk, x, size):
        calls.clear()
        mixed: list[torch.Tensor] = []
        handle = None
        if isinstance(reduction, LearnedMerge) and i in reduction.stage:
            layer = reduction.layer(i)
            handle = layer.register_forward_hook(lambda mod, inputs, out: mixed.append(mod.mixing(inputs[0])[0].detach()))
        try:
            out_x, out_size = plain_block(m, i, blk, x, size)
        finally:
            if handle is not None:
                handle.remove()
        records.append(_record(i, x.shape[1], out_x.shape[1], list(calls), mixed, reduction.protected))
        return out_x, out_size

    plain_block = reduction.block
    model.dest_hook = hook
    reduction.block = block  # an instance attribute shadows the method
    try:
        yield records
    finally:
        del reduction.block
        model.dest_hook = previous_hook


def _record(i: int, n_in: int, n_out: int, calls: list, mixed: list, protected: int) -> BlockRecord:
    rec = BlockRecord(i, n_in, n_out)
    if len(calls) + len(mixed) > 1:
        raise DeploytkError(f"block {i} made {len(calls) + len(mixed)} reductions; visualize follows one per block.")
    if calls:
        op, args, dest = calls[0]
        dest = dest[0].detach().cpu().numpy()
        spec = spec_for(op)  # what the op's dest numbers is declared in its spec
        offset = protected if spec.dest_covers_patches_only else 0
        rest = spec.rest_slot(args) if spec.rest_slot else None
        return replace(rec, kind="match", op=op, dest=dest, offset=offset, rest_slot=rest)
    if mixed:
        weights = mixed[0][0].float().cpu().numpy()
        if weights.shape != (n_out - protected, n_in - protected):
            raise DeploytkError(f"block {i}: the learned layer's mixing weights {list(weights.shape)} do not fit {n_in} -> {n_out} tokens.")
        return replace(rec, kind="soft", weights=weights, offset=protected)
    if n_out < n_in:
        return replace(rec, kind="truncate")
    if n_out > n_in:
        raise DeploytkError(f"block {i} has more tokens out ({n_out}) than in ({n_in}) and no matching op: visualize cannot follow it.")
    return rec


def track_sources(model: MergedViT, image: torch.Tensor) -> Sources:
    """Run ``model`` on one preprocessed image [1, 3, H, W] and return where every patch went after each block."""
    if image.ndim != 4 or image.shape[0] != 1:
        raise DeploytkError(f"track_sources takes one image [1, 3, H, W]; got shape {list(image.shape)}.")
    grid = model.family.grid_size
    with recording(model) as records, torch.no_grad():
        model(image)
    stem = [BlockRecord(i, model.num_tokens, model.num_tokens) for i in range(model.family.stem_blocks)]  # ran in ``embed``
    return Sources(grid, model.protected, stem + records)


# ---- inputs ---------------------------------------------------------------------------------


def require_image_file(path: Path) -> Path:
    path = Path(path)
    problem = file_problem(path, "an image file")
    if problem:
        raise DeploytkError(f"image {path} {problem} (`image=`): give a PNG or JPG file (anything Pillow reads).")
    return path


def load_image(path: Path, family: ModelFamily) -> torch.Tensor:
    """``path`` preprocessed by the model family's eval transform (as ``deploytk eval`` does): [1, 3, H, W]."""
    path = require_image_file(path)
    try:
        return torch.from_numpy(load_samples([path], family.eval_transform(), family.input_kind))
    except DeploytkError as err:
        raise DeploytkError(f"{err.message} `image=` takes a PNG or JPG file (anything Pillow reads).") from None


def display_image(family: ModelFamily, image: torch.Tensor) -> np.ndarray:
    """The preprocessed image as the model sees it, back in [0, 1] RGB [H, W, 3] (mean/std undone)."""
    mean, std = (np.asarray(v, dtype=np.float32)[:, None, None] for v in family.normalization())
    return np.clip(image[0].numpy() * std + mean, 0, 1).transpose(1, 2, 0)


def parse_layers(text: str | None) -> list[int] | None:
    """``layers`` as text, ``3,6,11`` -> [3, 6, 11] (None: not given); checked against the model by ``choose_layers``."""
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise DeploytkError(
            f"`layers={text!r}` is not a list of block indices: give 0-based block indices, comma-separated (e.g. 3,6,11)."
        ) from None


def check_layers_exist(requested: list[int] | None, depth: int) -> None:
    bad = [i for i in requested or [] if not 0 <= i < depth]
    if bad:
        raise DeploytkError(
            f"`layers={','.join(map(str, requested))}`: block {bad[0]} does not exist; block indices are 0-based, from 0 to {depth - 1} "
            f"for the {depth} blocks this model's graph runs (a block before any reduction is fine)."
        )


def choose_layers(requested: list[int] | None, sources: Sources) -> list[int]:
    """The blocks to draw: ``requested`` (sorted, distinct, each in [0, depth)); by default up to DEFAULT_PANELS evenly spaced
    reducing blocks (the first and the last among them), or the last block when nothing reduces."""
    depth = sources.depth
    if requested is None:
        reducing = sources.reducing_blocks
        if not reducing:
            return [depth - 1]
        if len(reducing) <= DEFAULT_PANELS:
            return reducing
        picks = np.linspace(0, len(reducing) - 1, DEFAULT_PANELS).round().astype(int)
        return sorted({reducing[k] for k in picks})
    check_layers_exist(requested, depth)
    return sorted(set(requested))


# ---- drawing --------------------------------------------------------------------------------


def palette(n: int) -> np.ndarray:
    """``n`` distinct colours [n, 3] in [0, 1] (golden-ratio hues, alternating brightness)."""
    return np.array([colorsys.hsv_to_rgb((0.13 + 0.618034 * k) % 1.0, 0.65, 0.95 if k % 2 else 0.75) for k in range(n)])


def draw(image: np.ndarray, sources: Sources, block: int, colors: str = "mean") -> np.ndarray:
    """The panel of ``block`` (uint8 [H*s, W*s, 3]): every patch in its token's colour, thin boundaries between
    tokens (white on dark, black on light), dropped patches dimmed, fused ones hatched. ``image`` [H, W, 3] in [0, 1]."""
    if colors not in COLORS:
        raise DeploytkError(f"`colors={colors!r}`: allowed {', '.join(COLORS)}.")
    rows, cols = sources.grid
    h, w = image.shape[:2]
    ph, pw = h // rows, w // cols
    scale = max(1, math.ceil(MIN_PANEL_PIXELS / max(h, w)))
    owner = sources.owner[block]
    patch_mean = image[: rows * ph, : cols * pw].reshape(rows, ph, cols, pw, 3).mean(axis=(1, 3)).reshape(-1, 3)
    tokens, inverse = np.unique(owner, return_inverse=True)
    if colors == "mean":
        token_colour = np.stack([patch_mean[owner == t].mean(0) for t in tokens])
    else:
        token_colour = palette(sources.tokens(block))[np.maximum(tokens, 0)]
    patch_colour = token_colour[inverse]  # [P, 3]
    # pixels: the patch grid upscaled, each pixel knowing its patch
    py = np.minimum(np.arange(h * scale) // (ph * scale), rows - 1)
    px = np.minimum(np.arange(w * scale) // (pw * scale), cols - 1)
    patch = py[:, None] * cols + px[None, :]
    out = patch_colour[patch]
    dropped = (owner < 0)[patch]
    big = np.repeat(np.repeat(image, scale, axis=0), scale, axis=1)
    out[dropped] = 0.25 * big[dropped] + 0.1  # dimmed: the image, darkened
    fused = sources.fused[block][patch]
    yy, xx = np.mgrid[: h * scale, : w * scale]
    stripe = ((yy + xx) // max(2, scale)) % 4 == 0
    out[fused & stripe] = 0.5 * out[fused & stripe]  # hatched: dark diagonal stripes
    who = owner[patch]
    edge = np.zeros(who.shape, dtype=bool)
    edge[:, :-1] |= who[:, :-1] != who[:, 1:]
    edge[:-1, :] |= who[:-1, :] != who[1:, :]
    light = out @ np.array([0.299, 0.587, 0.114]) > 0.55
    out[edge & ~light] = 1.0  # white lines on dark tokens, black on light ones
    out[edge & light] = 0.0
    return (np.clip(out, 0, 1) * 255).round().astype(np.uint8)


def png_size(panels: int) -> tuple[int, int]:
    """(width, height) in pixels of a picture with ``panels`` panels (the original image included)."""
    cols = min(panels, MAX_COLUMNS)
    rows = math.ceil(panels / cols)
    return round(cols * PANEL_INCHES[0] * DPI), round((rows * PANEL_INCHES[1] + LEGEND_INCHES) * DPI)


def legend(method: str, kind: str, sources: Sources, layers: list[int], colors: str, backend: str) -> str:
    """The picture's caption: what the colours mean for this method."""
    fill = "the mean colour of its patches" if colors == "mean" else "a colour of its own"
    parts = [f"{method} ({kind}), choices of {backend}: each token in {fill}, thin lines between tokens"]
    if any(sources.summary(b)["patches_dropped"] for b in layers):
        parts.append("dimmed: dropped")
    if any(sources.summary(b)["patches_fused"] for b in layers):
        parts.append("hatched: fused into the extra token")
    if any(sources.soft_upto(b) for b in layers):
        parts.append("soft merge: every new token mixes all patches; each patch is drawn in the token that weights it most")
    return "; ".join(parts) + "."


def panel_title(sources: Sources, block: int) -> str:
    s = sources.summary(block)
    title = f"after block {block}: {s['tokens']} token" + ("" if s["tokens"] == 1 else "s")
    detail = []
    if s["tokens_with_patches"] == 0:
        detail.append("no patch token left")
    elif s["tokens_with_patches"] + sources.protected < s["tokens"] and not s["soft_assignment"]:
        detail.append(f"{s['tokens_with_patches']} hold patches")
    if s["soft_assignment"]:
        detail.append("argmax of soft weights")
    return title + ("\n(" + ", ".join(detail) + ")" if detail else "")


def _matplotlib_figure():
    try:
        from matplotlib.figure import Figure  # optional: the `bench` extra
    except ImportError:
        raise DeploytkError(
            "deploytk visualize draws with matplotlib, which is not installed.",
            hint="Install it with `pip install 'deploytk[bench]'` (or `pip install matplotlib`).",
        ) from None
    return Figure


def require_matplotlib() -> None:
    """Fail early (before any model runs) when matplotlib is missing."""
    _matplotlib_figure()


def save_figure(panels: list[np.ndarray], titles: list[str], caption: str, output: FileOutput) -> tuple[int, int]:
    """Write the panels side by side (MAX_COLUMNS per row) with their titles and the caption to ``output`` (a claimed
    PNG), atomically. Returns the PNG's (width, height)."""
    figure_cls = _matplotlib_figure()
    width, height = png_size(len(panels))
    cols = min(len(panels), MAX_COLUMNS)
    rows = math.ceil(len(panels) / cols)
    fig = figure_cls(figsize=(width / DPI, height / DPI), dpi=DPI)
    legend_frac = LEGEND_INCHES * DPI / height
    for k, (panel, title) in enumerate(zip(panels, titles, strict=True)):
        r, c = divmod(k, cols)
        cell_w, cell_h = 1 / cols, (1 - legend_frac) / rows
        ax = fig.add_axes((c * cell_w + 0.02 * cell_w, 1 - (r + 1) * cell_h + 0.02 * cell_h, 0.96 * cell_w, 0.8 * cell_h))
        ax.imshow(panel, interpolation="nearest")
        ax.set_title(title, fontsize=9)
        ax.set_axis_off()
    chars = int(width / DPI * 72 / CAPTION_CHAR_POINTS)  # a line of the caption fits the figure's width
    fig.text(0.5, legend_frac / 2, textwrap.fill(caption, chars), ha="center", va="center", fontsize=8)
    output.save_figure(fig, dpi=DPI)
    return width, height
