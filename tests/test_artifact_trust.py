"""Artifacts users can trust: an edited manifest is refused by every command before any work; an artifact works from
any working folder and knows when the weights it was made from moved or changed; derived files (the dense baseline) live
in deploytk's cache folder, are verified on every read and rebuilt when corrupt, and never touch the artifact, which may
be read-only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from deploytk.cli import app
from deploytk.exporter.artifacts import Artifact
from deploytk.exporter.baseline import baseline_name

from helpers import seeded_init, snapshot
from helpers.configs import ROOT

runner = CliRunner()

#: a command that reads an artifact, with the arguments that make it quick; each must refuse an edited manifest
READERS = {
    "validate": ["validate", "{art}", "--num-samples", "2", "--batch-size", "2"],
    "profile": ["profile", "{art}", "--batch-sizes", "1", "--warmup", "0", "--iterations", "1"],
    "package": ["package", "{art}", "--triton", "{tmp}/repo"],
    "quantize": ["quantize", "{art}", "--backend", "ort", "--synthetic", "4", "--output", "{tmp}/int8"],
    "build": ["build", "{art}"],
}


def text_of(result) -> str:
    return " ".join(result.output.split())


@pytest.fixture
def edited(exported, tmp_path):
    """A copy of the digits ToMe export whose manifest was edited by hand (r 4 -> 2, as a user tried)."""
    art = exported.copy("digits_vit_tome_r4", tmp_path / "art")
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["config"]["merge"]["r"] = 2
    (art / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return art


@pytest.mark.parametrize("command", sorted(READERS))
def test_an_edited_manifest_is_refused_before_any_work(command, edited, tmp_path):
    args = [a.format(art=edited, tmp=tmp_path) for a in READERS[command]]
    before = snapshot(tmp_path)
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    text = text_of(result)
    assert f"{edited / 'manifest.json'} was edited after deploytk wrote it" in text and "Traceback" not in text
    assert "Re-run `deploytk export`" in text
    assert snapshot(tmp_path) == before


def test_a_manifest_without_a_seal_is_refused(exported, tmp_path):
    art = exported.copy("digits_vit_tome_r4", tmp_path / "art")
    manifest = json.loads((art / "manifest.json").read_text())
    del manifest["content_sha256"]
    (art / "manifest.json").write_text(json.dumps(manifest))
    result = runner.invoke(app, READERS["validate"][:1] + [str(art)])
    assert result.exit_code == 2 and "has no seal" in text_of(result)


# ---- portable: hf: folders ------------------------------------------------------------------


@pytest.fixture
def hf_project(tmp_path):
    """c2/hf_vit (a save_pretrained ViT with seeded random weights) and c2/vit.yaml naming it relative to the config."""
    transformers = pytest.importorskip("transformers")
    project = tmp_path / "c2"
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8
    )
    seeded_init(transformers.ViTModel(config), seed=3).save_pretrained(project / "hf_vit")
    (project / "vit.yaml").write_text("model: hf:hf_vit\nmerge: {method: tome, r: 2}\nexport: {img_size: null, batch_size: 2}\n")
    return project


def deploytk(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "deploytk", *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_an_hf_folder_is_read_from_the_config_s_folder_and_the_artifact_validates_from_anywhere(hf_project, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    exported = deploytk("export", "c2/vit.yaml", "--output", "c2/art", cwd=tmp_path)  # the config's folder is not the working one
    assert exported.returncode == 0, exported.stderr
    manifest = Artifact.open(hf_project / "art").manifest
    assert manifest["config"]["model"] == f"hf:{(hf_project / 'hf_vit').resolve()}" and len(manifest["model"]["model_folder_sha256"]) == 64
    validated = deploytk("validate", hf_project / "art", "--num-samples", "4", "--batch-size", "2", "--json", cwd=elsewhere)
    assert validated.returncode == 0, validated.stderr
    assert json.loads(validated.stdout)["passed"] is True

    (hf_project / "hf_vit" / "config.json").write_text(
        (hf_project / "hf_vit" / "config.json").read_text() + "\n"
    )  # weights' folder changed
    changed = deploytk("validate", hf_project / "art", "--num-samples", "4", "--batch-size", "2", cwd=elsewhere)
    assert changed.returncode == 2 and f"the model folder {(hf_project / 'hf_vit').resolve()} changed after" in " ".join(
        changed.stderr.split()
    )

    shutil.move(hf_project / "hf_vit", tmp_path / "moved")
    moved = deploytk("validate", hf_project / "art", "--num-samples", "4", "--batch-size", "2", cwd=elsewhere)
    text = " ".join(moved.stderr.split())
    assert moved.returncode == 2 and f"model folder {(hf_project / 'hf_vit').resolve()}, which no longer exists" in text
    assert "Traceback" not in text


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_a_missing_hf_folder_fails_fast_naming_the_path_looked_up(hf_project, tmp_path):
    (hf_project / "vit.yaml").write_text("model: hf:no_such_folder\nmerge: {method: tome, r: 2}\nexport: {img_size: null}\n")
    result = deploytk("export", hf_project / "vit.yaml", "--output", tmp_path / "out", cwd=tmp_path)
    text = " ".join(result.stderr.split())
    assert result.returncode == 2, result.stderr
    assert "there is no folder" in text and "no_such_folder" in text and "HF_HUB_OFFLINE is set" in text
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_a_relative_hf_folder_meant_from_the_working_folder_gets_the_right_spelling(hf_project, tmp_path):
    (tmp_path / "cfgs").mkdir()
    (tmp_path / "cfgs" / "vit.yaml").write_text("model: hf:c2/hf_vit\nmerge: {method: tome, r: 2}\nexport: {img_size: null}\n")
    result = deploytk("inspect", "cfgs/vit.yaml", cwd=tmp_path)
    assert result.returncode == 2 and "Write `model: hf:../c2/hf_vit`" in " ".join(result.stderr.split())


# ---- the dense baseline: in the cache, verified, never in the artifact ------------------------


def profile_args(art) -> list[str]:
    return ["profile", str(art), "--backend", "ort", "--batch-sizes", "1", "--warmup", "0", "--iterations", "1", "--json"]


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_a_corrupt_cached_baseline_is_rebuilt_and_said(exported, tmp_path, monkeypatch):
    monkeypatch.setenv("DEPLOYTK_CACHE", str(tmp_path / "cache"))
    art = exported("digits_vit_tome_r4")
    before = snapshot(art)
    assert runner.invoke(app, profile_args(art)).exit_code == 0
    cached = tmp_path / "cache" / "baselines" / baseline_name(Artifact.open(art))
    good = cached.read_bytes()
    flipped = bytearray(good)
    flipped[len(flipped) // 2] ^= 0xFF
    for damaged in (bytes(flipped), good[: len(good) // 3]):  # a flipped byte, a truncated file
        cached.write_bytes(damaged)
        with pytest.warns(UserWarning, match="did not match its recorded sha256; rebuilt it"):
            result = runner.invoke(app, profile_args(art))
        assert result.exit_code == 0, result.output
        assert cached.read_bytes() == good  # the same export again
    assert snapshot(art) == before  # nothing written into the artifact


def test_a_read_only_artifact_profiles_and_quantizes(exported, tmp_path, monkeypatch):
    """A read-only bind mount of the export (root and mount rights needed; skipped with the reason elsewhere)."""
    monkeypatch.setenv("DEPLOYTK_CACHE", str(tmp_path / "cache"))
    art = exported.copy("digits_vit_tome_r4", tmp_path / "art")
    store = tmp_path / "store"
    store.mkdir()
    mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(art), str(store)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot make a read-only bind mount here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(store)], capture_output=True)  # older mounts ignore ro on --bind
        with pytest.raises(OSError):
            (store / ".probe").write_text("x")  # truly read-only
        result = runner.invoke(app, profile_args(store))
        assert result.exit_code == 0, result.output
        result = runner.invoke(app, ["quantize", str(store), "--backend", "ort", "--synthetic", "8", "--output", str(tmp_path / "int8")])
        assert result.exit_code == 0, result.output
    finally:
        subprocess.run(["umount", str(store)], check=False)
    assert Artifact.open(tmp_path / "int8").quantization["runtime"] == "ort"


def test_an_unwritable_cache_folder_is_one_paragraph(exported, tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("not a folder")
    monkeypatch.setenv("DEPLOYTK_CACHE", str(tmp_path / "afile" / "cache"))
    result = runner.invoke(app, profile_args(exported("digits_vit_tome_r4")))
    assert result.exit_code == 2, result.output
    text = text_of(result)
    assert "is kept in deploytk's cache folder, which cannot be written" in text and "Set DEPLOYTK_CACHE to a writable folder" in text
