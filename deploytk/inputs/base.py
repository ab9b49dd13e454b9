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
    #: whether `deploytk visualize` draws a sample of this kind
    drawn: ClassVar[bool] = False

    @property
    def shape(self) -> tuple[int, ...]:
        """One sample's shape, without the batch axis."""
        return tuple(int(getattr(self, f.name)) for f in dataclasses.fields(self))

    def batch_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, *self.shape)

    def describe(self) -> str:
        """The input as messages show it: ``pixel_values [batch, 16, 3, 224, 224]``."""
        return f"{self.onnx_name} [batch, {', '.join(map(str, self.shape))}]"

    def label(self) -> str:
        """One sample's size in words, for reports (``224x224 image``)."""
        return f"{'x'.join(map(str, self.shape))} {self.noun}"

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
