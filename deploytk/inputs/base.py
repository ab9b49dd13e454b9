"""``InputKind``: one sample of a model's input, and the registry of kinds."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from deploytk.errors import DeploytkError

#: kind name -> its class; filled by ``@register_kind`` as ``deploytk.inputs`` loads
KINDS: dict[str, type[InputKind]] = {}


@dataclasses.dataclass(frozen=True)
class PatchGrid:
    """How a model cuts one sample into patch tokens (the family knows it: ``ModelFamily.patch_grid``): ``time_groups``
    grids of ``rows`` x ``cols`` patches, time first, then row by row. ``stride`` and ``size`` (rows, cols, in the
    input's own cells: pixels, mel bins x time frames) are set where patches overlap (AST: 16 x 16 patches 10 apart);
    None: the patches tile the input."""

    rows: int
    cols: int
    time_groups: int = 1
    stride: tuple[int, int] | None = None
    size: tuple[int, int] | None = None

    @property
    def patches(self) -> int:
        return self.time_groups * self.rows * self.cols


#: ``Canvas.patch`` where a pixel shows no patch: a part of the sample that no patch covers (drawn in grey), or the gap
#: between the pieces of a layout (a clip's frames; drawn as the background)
NO_PATCH, GAP = -1, -2


@dataclasses.dataclass(frozen=True)
class Canvas:
    """What ``visualize`` draws one sample on: ``background`` [H, W, 3] RGB in [0, 1] (the sample as the model saw it)
    and ``patch`` [H, W], the patch token each pixel shows (index in the model's patch order), or ``NO_PATCH`` (the
    spectrogram bins past AST's last patch) or ``GAP`` (between a clip's frames). ``title``: the input panel's title."""

    background: np.ndarray
    patch: np.ndarray
    title: str


def cells(length: int, count: int, stride: int, size: int) -> np.ndarray:
    """For each of ``length`` positions, the patch among ``count`` patches ``stride`` apart (each ``size`` long) whose
    stride cell holds it: overlapping patches are drawn in their own first ``stride`` positions, the last patch in all of
    its own; ``NO_PATCH`` past the last patch."""
    where = np.minimum(np.arange(length) // stride, count - 1)
    return np.where(np.arange(length) < (count - 1) * stride + size, where, NO_PATCH)


def tiles(shape: tuple[int, int], grid: PatchGrid) -> np.ndarray:
    """[H, W] the patch of one plane of ``shape`` cut as ``grid`` says (its rows along H), ``NO_PATCH`` where none is."""
    h, w = shape
    if grid.stride is None:  # tiling patches; a remainder joins the last row / column
        stride, size = (h // grid.rows, w // grid.cols), (h - (grid.rows - 1) * (h // grid.rows), w - (grid.cols - 1) * (w // grid.cols))
    else:
        stride, size = grid.stride, grid.size or grid.stride
    row, col = cells(h, grid.rows, stride[0], size[0]), cells(w, grid.cols, stride[1], size[1])
    return np.where((row[:, None] >= 0) & (col[None, :] >= 0), row[:, None] * grid.cols + col[None, :], NO_PATCH)


@dataclasses.dataclass(frozen=True)
class InputKind:
    """The input of one model: its kind's layout at the sizes the model was built for (a frozen dataclass per kind)."""

    #: the kind's name, recorded in the manifest's ``inputs[0].kind``
    kind: ClassVar[str] = ""
    #: the ONNX graph input's name (what a caller feeds: ``session.run(None, {name: batch})``)
    onnx_name: ClassVar[str] = ""
    #: the names of one sample's axes, in order (the batch axis comes first and is symbolic)
    axes: ClassVar[tuple[str, ...]] = ()
    #: what one sample is called in messages ("image", "clip", "sound") and its plural
    noun: ClassVar[str] = ""
    nouns: ClassVar[str] = ""
    #: the file name suffixes (lower case, with the dot) a folder of real samples is searched for
    suffixes: ClassVar[frozenset[str]] = frozenset()
    #: whether `deploytk visualize` draws a sample of this kind (``canvas``)
    drawn: ClassVar[bool] = False
    #: the files ``read`` takes, in words, for messages
    file_help: ClassVar[str] = ""

    @property
    def shape(self) -> tuple[int, ...]:
        """One sample's shape, without the batch axis."""
        return tuple(int(getattr(self, f.name)) for f in dataclasses.fields(self))

    def batch_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, *self.shape)

    def describe(self) -> str:
        """The input as messages show it: ``pixel_values [batch, 16, 3, 224, 224]``."""
        return f"{self.onnx_name} [batch, {', '.join(map(str, self.shape))}]"

    def record(self) -> dict[str, Any]:
        """The manifest's ``inputs[0]`` (and what ``package`` writes into Triton's config from it)."""
        return {
            "name": self.onnx_name,
            "kind": self.kind,
            "dtype": "float32",
            "shape": ["batch", *self.shape],
            "axes": ["batch", *self.axes],
        }

    @classmethod
    def from_shape(cls, shape: tuple[int, ...]) -> InputKind:
        """The kind at one sample's ``shape`` (as ``shape`` returns it)."""
        return cls(*(int(v) for v in shape))

    def synthetic(self, batch: int, rng: np.random.Generator) -> np.ndarray:
        """A batch like a normalised input (standard normal float32), drawn from ``rng``."""
        return rng.standard_normal(self.batch_shape(batch), dtype=np.float32)

    def check_batch(self, batch: np.ndarray, what: str) -> None:
        """Refuse ``batch`` (named ``what`` in the message) unless it is [batch, *shape]."""
        if batch.ndim != len(self.shape) + 1 or tuple(batch.shape[1:]) != self.shape:
            raise DeploytkError(f"{what} has shape {list(batch.shape)}; this model takes {self.describe()}.")

    def preprocessing(self) -> str:
        """How a file becomes one sample of this input, in a sentence for a client that must send it preprocessed (the
        README `package` writes beside a served model)."""
        raise NotImplementedError

    def read(self, path: Path) -> Any:
        """The file at ``path`` decoded into what the family's processor takes (an RGB image, a clip's frames, a
        waveform); a file that cannot be decoded is refused with its name."""
        raise NotImplementedError

    def canvas(self, sample: np.ndarray, normalization: tuple, grid: PatchGrid) -> Canvas:
        """One preprocessed ``sample`` (``shape``, normalised by ``normalization`` = (mean, std)) laid out as ``visualize``
        draws it, with ``grid``'s patches mapped onto it."""
        raise NotImplementedError

    def files(self, folder: Path, count: int, what: str) -> list[Path]:
        """Up to ``count`` files of this kind under ``folder`` (recursively, sorted); a missing folder, or one without
        such files, is refused naming the parameter ``what``."""
        folder = Path(folder)
        if not folder.is_dir():
            problem = "does not exist" if not folder.exists() else f"is a file, not a folder of {self.nouns}"
            raise DeploytkError(f"{self.noun} folder {folder} {problem} (`{what}=`).")
        found = sorted(p for p in folder.rglob("*") if p.suffix.lower() in self.suffixes)[:count]  # a folder named so: refused by read
        if not found:
            raise DeploytkError(f"{self.noun} folder {folder} holds no {self.nouns} ({', '.join(sorted(self.suffixes))}).")
        return found


def register_kind(cls: type[InputKind]) -> type[InputKind]:
    """Class decorator: make ``cls`` a kind a manifest can name."""
    if not (isinstance(cls, type) and issubclass(cls, InputKind)) or not cls.kind:
        raise TypeError(f"@register_kind needs an InputKind subclass with its own `kind`; got {cls!r}.")
    KINDS[cls.kind] = cls
    return cls


def input_from_record(record: dict[str, Any]) -> InputKind:
    """The input a manifest's ``inputs[0]`` records (an export from before input kinds recorded none: an image)."""
    name = record.get("kind", "image")
    if name not in KINDS:
        raise DeploytkError(
            f"the manifest's input kind {name!r} is not one this deploytk knows ({', '.join(KINDS)}).",
            hint="Open the artifact with the deploytk version that exported it, or export it again.",
        )
    return KINDS[name].from_shape(tuple(record["shape"][1:]))
