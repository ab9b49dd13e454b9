"""Where every patch of a sample went: source tracking through a token-reducing ViT, and its picture.

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
belongs to after it (or -1: dropped). ``draw`` renders the panels (numpy) on the sample's canvas (its input kind
lays it out: an image, a clip's frames side by side, a spectrogram; ``InputKind.canvas``) and ``save_figure`` writes
them with matplotlib (optional: the ``bench`` extra).
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
from deploytk.inputs import NO_PATCH, Canvas, InputKind
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
#: panels wider than this (width / height: a clip's frames side by side, a spectrogram) are drawn one per row,
#: WIDE_ROW_INCHES high, at most WIDE_MAX_INCHES wide (and at least PANEL_INCHES[0] * 2 for the caption)
WIDE = 1.5
WIDE_ROW_INCHES = 2.4
WIDE_MAX_INCHES = 20.0
#: panels are upscaled (nearest) to at least this many pixels (their shorter side) so that boundaries stay thin, but
#: not past the widest panel's pixels in the PNG: a panel the PNG shrinks loses its one-pixel boundaries (an AST's
#: 1024 frames upscaled twice lost every line across time)
MIN_PANEL_PIXELS = 224
MAX_PANEL_PIXELS = int(WIDE_MAX_INCHES * DPI * 0.96)
TITLE_INCHES = 0.55


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

    grid: tuple[int, int]  # patch rows, columns (of one time group)
    protected: int
    records: list[BlockRecord]
    owner: np.ndarray = field(init=False)  # [depth, P]: token index after block i, -1 where dropped
    fused: np.ndarray = field(init=False)  # [depth, P]: the patch went into a fused token (and is still there)
    time_groups: int = 1  # a video's tubelet groups: P = time_groups x rows x cols, time first

    @property
    def patches(self) -> int:
        return self.time_groups * self.grid[0] * self.grid[1]

    def __post_init__(self):
        patches = self.patches
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
        return Sources(self.grid, self.protected, records, self.time_groups)


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


def track_sources(model: MergedViT, sample: torch.Tensor) -> Sources:
    """Run ``model`` on one preprocessed sample [1, *input_kind.shape] and return where every patch went after each block."""
    kind = model.family.input_kind
    if tuple(sample.shape) != kind.batch_shape(1):
        raise DeploytkError(f"track_sources takes one sample {list(kind.batch_shape(1))}; got shape {list(sample.shape)}.")
    family = model.family
    with recording(model) as records, torch.no_grad():
        model(sample)
    stem = [BlockRecord(i, model.num_tokens, model.num_tokens) for i in range(family.stem_blocks)]  # ran in ``embed``
    return Sources(family.grid_size, model.protected, stem + records, family.time_groups)


# ---- inputs ---------------------------------------------------------------------------------


def require_sample_file(path: Path, kind: InputKind) -> Path:
    """``path`` (the parameter ``image``), refused unless it is a file: the model's kind (an image, a clip, a sound) says
    what to give instead."""
    path = Path(path)
    problem = file_problem(path, f"{'an' if kind.noun[0] in 'aeiou' else 'a'} {kind.noun} file")
    if problem:
        raise DeploytkError(f"{kind.noun} {path} {problem} (`image=`): give {kind.file_help}.")
    return path


def load_sample(path: Path, family: ModelFamily) -> torch.Tensor:
    """``path`` decoded by the family's input kind and preprocessed by its eval transform (as ``deploytk eval`` and
    ``validate`` do): [1, *input_kind.shape]; a file that cannot be decoded is refused with its name."""
    kind = family.input_kind
    path = require_sample_file(path, kind)
    try:
        return torch.from_numpy(load_samples([path], family.input_transform(), kind))
    except DeploytkError as err:
        raise DeploytkError(f"{err.message} `image=` takes {kind.file_help} for this model.", hint=err.hint) from None


def canvas(family: ModelFamily, sample: torch.Tensor) -> Canvas:
    """The preprocessed ``sample`` [1, ...] laid out by the family's input kind, the family's patches mapped onto it."""
    return family.input_kind.canvas(sample[0].numpy(), family.normalization(), family.patch_grid)


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


def panel_scale(canvas: Canvas) -> int:
    """The whole-number upscaling of a canvas's panels: its shorter side to MIN_PANEL_PIXELS, its longer at most
    MAX_PANEL_PIXELS."""
    h, w = canvas.patch.shape
    return max(1, min(math.ceil(MIN_PANEL_PIXELS / min(h, w)), MAX_PANEL_PIXELS // max(h, w)))


def upscaled(canvas: Canvas) -> np.ndarray:
    """The canvas's background as the input panel (uint8, at the panels' scale)."""
    s = panel_scale(canvas)
    return (np.repeat(np.repeat(canvas.background, s, axis=0), s, axis=1) * 255).round().astype(np.uint8)


def draw(canvas: Canvas, sources: Sources, block: int, colors: str = "mean") -> np.ndarray:
    """The panel of ``block`` (uint8 [H*s, W*s, 3], ``canvas`` upscaled): every patch in its token's colour, thin
    boundaries between tokens (white on dark, black on light), dropped patches dimmed, fused ones hatched; what no patch
    covers in grey, the gaps of the layout as they are."""
    if colors not in COLORS:
        raise DeploytkError(f"`colors={colors!r}`: allowed {', '.join(COLORS)}.")
    scale = panel_scale(canvas)
    owner = sources.owner[block]
    patches = sources.patches
    if canvas.patch.max() >= patches:
        raise DeploytkError(f"the canvas shows patch {canvas.patch.max()}, the model has {patches}.")
    covered = canvas.patch >= 0
    index = canvas.patch[covered]
    counts = np.maximum(np.bincount(index, minlength=patches), 1)[:, None]
    patch_mean = np.stack([np.bincount(index, canvas.background[covered][:, c], minlength=patches) for c in range(3)], 1) / counts
    tokens, inverse = np.unique(owner, return_inverse=True)
    if colors == "mean":
        token_colour = np.stack([patch_mean[owner == t].mean(0) for t in tokens])
    else:
        token_colour = palette(sources.tokens(block))[np.maximum(tokens, 0)]
    patch_colour = token_colour[inverse.reshape(-1)]  # [P, 3]
    # pixels: the canvas upscaled, each pixel knowing its patch (-1: none)
    patch = np.repeat(np.repeat(canvas.patch, scale, axis=0), scale, axis=1)
    shown = patch >= 0
    big = np.repeat(np.repeat(canvas.background, scale, axis=0), scale, axis=1)
    out = big.copy()
    out[shown] = patch_colour[patch[shown]]
    uncovered = patch == NO_PATCH
    out[uncovered] = 0.3 + 0.4 * (big[uncovered] @ np.array([0.299, 0.587, 0.114]))[:, None]  # grey: the sample's luma
    dropped = shown & (owner < 0)[np.maximum(patch, 0)]
    out[dropped] = 0.25 * big[dropped] + 0.1  # dimmed: the sample, darkened
    fused = shown & sources.fused[block][np.maximum(patch, 0)]
    yy, xx = np.mgrid[: patch.shape[0], : patch.shape[1]]
    stripe = ((yy + xx) // max(2, scale)) % 4 == 0
    out[fused & stripe] = 0.5 * out[fused & stripe]  # hatched: dark diagonal stripes
    who = np.where(shown, owner[np.maximum(patch, 0)], -2)
    edge = np.zeros(who.shape, dtype=bool)
    across = (who[:, :-1] != who[:, 1:]) & shown[:, :-1] & shown[:, 1:]  # between two tokens, not at a gap
    down = (who[:-1, :] != who[1:, :]) & shown[:-1, :] & shown[1:, :]
    edge[:, :-1] |= across
    edge[:-1, :] |= down
    light = out @ np.array([0.299, 0.587, 0.114]) > 0.55
    out[edge & ~light] = 1.0  # white lines on dark tokens, black on light ones
    out[edge & light] = 0.0
    return (np.clip(out, 0, 1) * 255).round().astype(np.uint8)


def png_size(panels: int, aspect: float = 1.0) -> tuple[int, int]:
    """(width, height) in pixels of a picture with ``panels`` panels (the input included) of ``aspect`` (width / height):
    up to MAX_COLUMNS square-ish panels a row, or one wide panel (a clip's frames, a spectrogram) a row."""
    width, rows, row_height = _layout(panels, aspect)
    return round(width * DPI), round((rows * row_height + LEGEND_INCHES) * DPI)


def _layout(panels: int, aspect: float) -> tuple[float, int, float]:
    """(figure width, rows, row height) in inches; the columns are ``_columns``."""
    if aspect <= WIDE:
        cols = min(panels, MAX_COLUMNS)
        return cols * PANEL_INCHES[0], math.ceil(panels / cols), PANEL_INCHES[1]
    panel_width = min(WIDE_MAX_INCHES, aspect * WIDE_ROW_INCHES)
    return max(panel_width, 2 * PANEL_INCHES[0]), panels, panel_width / aspect + TITLE_INCHES


def _columns(panels: int, aspect: float) -> int:
    return min(panels, MAX_COLUMNS) if aspect <= WIDE else 1


def legend(method: str, kind: str, sources: Sources, layers: list[int], colors: str, backend: str, uncovered: bool = False) -> str:
    """The picture's caption: what the colours mean for this method (``uncovered``: some of the sample is in no patch)."""
    fill = "the mean colour of its patches" if colors == "mean" else "a colour of its own"
    parts = [f"{method} ({kind}), choices of {backend}: each token in {fill}, thin lines between tokens"]
    if sources.time_groups > 1:
        parts.append("a token can span frames (tubelets merge across time): its colour then shows in each")
    if uncovered:
        parts.append("grey: in no patch")
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
    aspect = panels[0].shape[1] / panels[0].shape[0]
    width, height = png_size(len(panels), aspect)
    cols = _columns(len(panels), aspect)
    rows = math.ceil(len(panels) / cols)
    fig = figure_cls(figsize=(width / DPI, height / DPI), dpi=DPI)
    legend_frac = LEGEND_INCHES * DPI / height
    title_frac = 0.2 if aspect <= WIDE else TITLE_INCHES / _layout(len(panels), aspect)[2]  # of a row: the title above the panel
    for k, (panel, title) in enumerate(zip(panels, titles, strict=True)):
        r, c = divmod(k, cols)
        cell_w, cell_h = 1 / cols, (1 - legend_frac) / rows
        box = (c * cell_w + 0.02 * cell_w, 1 - (r + 1) * cell_h + 0.02 * cell_h, 0.96 * cell_w, (1 - title_frac) * cell_h)
        ax = fig.add_axes(box)
        ax.imshow(panel, interpolation="nearest")
        ax.set_title(title, fontsize=9)
        ax.set_axis_off()
    chars = int(width / DPI * 72 / CAPTION_CHAR_POINTS)  # a line of the caption fits the figure's width
    fig.text(0.5, legend_frac / 2, textwrap.fill(caption, chars), ha="center", va="center", fontsize=8)
    output.save_figure(fig, dpi=DPI)
    return width, height
