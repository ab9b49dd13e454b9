"""A model object handed to the Python API as an export's source.

The caller's object is never changed: deploytk works on a copy (on the CPU, in fp32), held for this process under a
``memory:`` name (``deploytk.models.hold``). Its family writes what rebuilds it in another process (the weights as
safetensors, and the architecture: timm's name and constructor arguments, or transformers' config.json); the copy is
rebuilt from those files here, once, and its output compared with the object's, so an artifact only claims to be
rebuildable when it is. The files travel in the artifact's ``source/`` folder, hashed in the manifest.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from deploytk.adapters import adapt
from deploytk.adapters.base import ModelFamily
from deploytk.config import DeployConfig
from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import SOURCE_DIR, rebuild_config
from deploytk.exporter.manifest import sha256_file
from deploytk.models import create_vit, hold

#: the largest difference between the object's output and the rebuilt model's that still counts as the same model
REBUILD_ATOL = 1e-5


@dataclass
class HeldObject:
    """A copy of the caller's model, held for this process, and what rebuilds it elsewhere (``folder`` and ``recipe``),
    or why nothing can (``cannot_rebuild``)."""

    name: str
    model_class: str
    family: str
    img_size: tuple[int, int]
    folder: Path | None
    recipe: dict | None
    cannot_rebuild: str | None

    def record(self, artifact: Path) -> dict:
        """The manifest's ``model.source``: the object's class, the recipe and the stored files' sha256."""
        files = {}
        if self.folder is not None:
            root = artifact / SOURCE_DIR
            files = {p.relative_to(artifact).as_posix(): sha256_file(p) for p in sorted(root.rglob("*")) if p.is_file()}
        return {"object": self.model_class, "rebuild": self.recipe, "cannot_rebuild": self.cannot_rebuild, "files": files}

    def copy_files(self, artifact: Path) -> None:
        if self.folder is not None:
            shutil.copytree(self.folder, artifact / SOURCE_DIR)

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder.parent, ignore_errors=True)


def _working_copy(model: nn.Module) -> nn.Module:
    try:
        dup = copy.deepcopy(model)
    except Exception as err:  # a module holding a lock, a file handle, ...
        raise DeploytkError(
            f"the model object ({type(model).__name__}) cannot be copied ({type(err).__name__}: {err}); deploytk never changes "
            "the caller's model, so it works on a copy.",
            hint="Save the model (timm: its name and a state dict; transformers: save_pretrained) and pass the name or folder.",
        ) from None
    return dup.to("cpu", torch.float32).eval()


def take(model: nn.Module, store: bool = True) -> HeldObject:
    """Copy ``model``, check its family takes it (errors name the reason), hold the copy and (``store``) write what
    rebuilds it, checked by rebuilding it."""
    if not isinstance(model, nn.Module):
        raise DeploytkError(
            f"`model` is a {type(model).__name__}; deploytk takes a torch.nn.Module of a supported family, a timm name, "
            "an hf: name or folder, a YAML config path or a DeployConfig."
        )
    dup = _working_copy(model)
    family = adapt(dup)  # refuses a model no family runs, naming the families
    family.as_loaded()  # what the family's own loader sets (transformers: the eager attention)
    cls = type(model)
    held = HeldObject(
        name=hold(dup),
        model_class=f"{cls.__module__}.{cls.__qualname__}",
        family=family.name,
        img_size=tuple(int(v) for v in family.img_size),
        folder=None,
        recipe=None,
        cannot_rebuild=None,
    )
    if not store:
        return held
    folder = Path(tempfile.mkdtemp(prefix="deploytk-source-")) / SOURCE_DIR
    folder.mkdir()
    recipe = family.save_source(folder)
    problem = recipe if isinstance(recipe, str) else _rebuild_problem(family, recipe, folder, held.img_size)
    if problem:
        shutil.rmtree(folder.parent, ignore_errors=True)
        held.cannot_rebuild = problem
    else:
        held.folder, held.recipe = folder, recipe
    return held


def _rebuild_problem(family: ModelFamily, recipe: dict, folder: Path, img_size: tuple[int, int]) -> str | None:
    """Why the stored files do not rebuild the object (None: they do, to within ``REBUILD_ATOL`` on a seeded image). The
    recipe is read back as the manifest stores it (JSON: a tuple comes back a list), as another process would read it.
    The reason never names ``folder``: it is a temporary folder, gone when the reason is read."""
    try:
        stored = json.loads(json.dumps(recipe))
    except (TypeError, ValueError) as err:
        return f"its recipe holds a value that cannot be stored in the manifest ({err})"
    cfg = rebuild_config(DeployConfig(model="memory:", export={"img_size": list(img_size)}), stored, folder)
    try:
        rebuilt = adapt(create_vit(cfg))
    except DeploytkError as err:
        return f"rebuilding it from its stored weights and architecture failed: {_without_folder(err.message, folder)}".rstrip(".")
    except Exception as err:  # the family's library refusing the stored arguments: reported, not raised (the export is sound)
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return f"rebuilding it from its stored weights and architecture failed ({type(err).__name__}: {_without_folder(first, folder)})"
    x = torch.from_numpy(family.input_kind.synthetic(1, np.random.default_rng(0)))
    with torch.no_grad():
        want, got = family.plain()(x), rebuilt.plain()(x)
    if type(rebuilt.model) is not type(family.model) or want.shape != got.shape:
        return f"its stored architecture rebuilds a {type(rebuilt.model).__name__} with output {list(got.shape)}, not the object's"
    diff = float((want - got).abs().max())
    if not diff <= REBUILD_ATOL:
        return f"the model rebuilt from its stored weights and architecture differs from the object (max |diff| {diff:.3g})"
    return None


def _without_folder(message: str, folder: Path) -> str:
    """``message`` with the temporary ``folder``'s path left out: ``checkpoint /tmp/deploytk-source-x/source/model.safetensors``
    becomes ``checkpoint model.safetensors``."""
    return message.replace(f"{folder}{os.sep}", "").replace(str(folder.parent), "the stored files").replace(str(folder), "the stored files")
