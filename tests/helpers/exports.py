"""One export per (config, overrides, format) for the whole test run, shared by every test that reads an export.

Exports are the suite's most repeated work (the digits ToMe export alone was made in ten modules). The cache lives
under the run's base temporary folder, which both pytest-xdist workers share, with a file lock per export, so each is
made once per run whichever worker asks first. A test that changes files in an export takes its own copy (``copy``).
Each export's digest (every file in it) is recorded when it is made and checked when the run ends: a test that wrote
into a shared export fails the run, and so does a command that wrote a derived file into the artifact it read (the
dense baselines live in deploytk's cache folder, ``DEPLOYTK_CACHE``, which tests/conftest.py points at the run's).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from filelock import FileLock

from helpers.configs import digits_config


def tree_digest(folder: Path) -> str:
    """sha256 over every file's relative path and bytes."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder)
        digest.update(str(relative).encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


class ExportCache:
    """``cache(stem, fmt=..., **overrides)`` -> the folder of export_configs/<stem>.yaml exported with ``overrides``."""

    def __init__(self, root: Path):
        self.root = root
        self.used: dict[str, Path] = {}

    def key(self, stem: str, fmt: str, overrides: dict) -> str:
        name = stem + {"onnx-inlined": "-inlined", "onnx-ort": "-ort"}.get(fmt, "")
        if overrides:
            name += "-" + hashlib.sha1(json.dumps(overrides, sort_keys=True, default=str).encode()).hexdigest()[:10]
        return name

    def __call__(self, stem: str, fmt: str = "onnx", **overrides) -> Path:
        from deploytk.exporter.pipeline import run_export

        key = self.key(stem, fmt, overrides)
        folder = self.root / key
        self.root.mkdir(parents=True, exist_ok=True)
        with FileLock(self.root / f"{key}.lock"):
            stamp = self.root / f"{key}.sha256"
            if not stamp.is_file():
                run_export(digits_config(stem, **overrides), folder, fmt=fmt, force=folder.exists())
                stamp.write_text(tree_digest(folder))
        self.used[key] = folder
        return folder

    def tiny(self, name: str) -> Path:
        """helpers.media_models' tiny ``name`` model (``videomae``, ``ast``: from its config, seeded weights, no download)
        exported with ToMe r=4, made once per run and checked like the shipped configs' exports."""
        from helpers.media_models import export_tiny

        key = f"tiny-{name}"
        folder = self.root / key
        self.root.mkdir(parents=True, exist_ok=True)
        with FileLock(self.root / f"{key}.lock"):
            stamp = self.root / f"{key}.sha256"
            if not stamp.is_file():
                shutil.rmtree(folder, ignore_errors=True)  # what an interrupted attempt left
                export_tiny(name, folder)
                stamp.write_text(tree_digest(folder / name))
        self.used[key] = folder / name
        return folder / name

    def copy(self, stem: str, dest: Path, fmt: str = "onnx", **overrides) -> Path:
        """A copy of the shared export at ``dest`` (derived caches included), for a test that changes files."""
        return Path(shutil.copytree(self(stem, fmt, **overrides), dest))

    def with_ort_copy(self, stem: str, dest: Path, **overrides) -> Path:
        """The shared export at ``dest`` with ONNX Runtime's fused copy added, as ``fmt='onnx-ort'`` writes it: its files
        hard-linked (no second torch export), the manifest and any external data copied, the manifest extended."""
        import onnx

        from deploytk.exporter.artifacts import MANIFEST_FILE, MODEL_FILE, read_manifest, write_manifest
        from deploytk.exporter.pipeline import write_ort_copy

        source = self(stem, **overrides)

        def link(src: str, dst: str) -> None:
            # the manifest is rewritten below: a copy, never a link to the shared one; ONNX external data too, which onnx
            # refuses to read through a file with several hard links ("a potential hardlink attack": CLIP-L/336's weights)
            name = Path(src).name
            shutil.copy2(src, dst) if name == MANIFEST_FILE or name.endswith(".data") else os.link(src, dst)

        shutil.copytree(source, dest, copy_function=link)
        manifest = read_manifest(dest)
        manifest["onnx_ort"] = write_ort_copy(onnx.load(str(dest / MODEL_FILE)), dest)
        write_manifest(dest, manifest)
        return dest

    def changed(self) -> list[str]:
        """The shared exports this process used whose files differ from when they were made."""
        return [key for key, folder in self.used.items() if tree_digest(folder) != (self.root / f"{key}.sha256").read_text()]
