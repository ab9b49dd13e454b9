"""The Python snippets of the README and the docs pages run against what `make demo` writes (issues 41, 43): each
```python block runs in a folder whose artifacts/<demo> is a small export made the way the Makefile's demo target
exports (its `deploytk export` flags), so a snippet that needs a file the demo does not write fails here. A block that
appears on several pages (the README's example, repeated in Getting started) runs once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.docs import fenced_blocks, prose_pages

ROOT = Path(__file__).resolve().parents[1]
MAKEFILE = (ROOT / "Makefile").read_text()

#: the demo's `deploytk export` flags this test knows how to give the shared export
KNOWN_FLAGS = {"--format"}


def python_blocks() -> list[str]:
    """Every distinct ```python block, README first, then the docs pages in path order."""
    blocks = [b.body for name, text in prose_pages().items() for b in fenced_blocks(text, name) if b.lang == "python"]
    return list(dict.fromkeys(blocks))


def readme_python_blocks() -> list[str]:
    return [b.body for b in fenced_blocks(prose_pages()["README.md"], "README.md") if b.lang == "python"]


def demo_export() -> tuple[str, dict]:
    """The demo's artifact folder and its export's flags, read from the Makefile."""
    folder = re.search(r"^DEMO_DIR\s*:=\s*(\S+)", MAKEFILE, flags=re.M).group(1)
    recipe = MAKEFILE.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    line = next(line for line in recipe.splitlines() if "deploytk export" in line)
    words = line.split("deploytk export", 1)[1].split()
    flags = dict(zip(words[::2], words[1::2], strict=True))
    assert set(flags) <= KNOWN_FLAGS, f"the demo exports with {sorted(set(flags) - KNOWN_FLAGS)}: teach this test those flags"
    return folder, flags


def test_the_readme_has_python_snippets_and_the_demo_an_export():
    assert len(python_blocks()) >= 2  # the README's API example and the docs' OpenVINO example at least
    assert "deploytk.export(model" in readme_python_blocks()[0], "the README's first Python example is the API from a model object"
    folder, _ = demo_export()
    assert folder == "artifacts/deit_small_tome_r16"


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_every_python_snippet_runs_against_an_export_made_the_demo_s_way(exported, tmp_path):
    folder, flags = demo_export()
    art = exported("digits_vit_tome_r4", fmt=flags.get("--format", "onnx"))  # the demo's flags on the small digits ViT
    demo = tmp_path / folder
    demo.parent.mkdir(parents=True)
    demo.symlink_to(art, target_is_directory=True)  # the snippets only read it
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for block in python_blocks():
        writes = "deploytk.export(" in block  # a snippet that exports writes its own artifact (under the test's folder)
        assert folder in block or writes or "artifacts/" not in block, f"a snippet reads an artifact other than the demo's:\n{block}"
        done = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"snippet failed:\n{block}\n{done.stderr[-3000:]}"
