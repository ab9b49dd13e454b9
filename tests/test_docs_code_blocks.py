"""Every fenced code block of the README and the docs pages (not the generated docs/reference/) is run by a test or
says why it is not (issue 43).

- ```python blocks run in tests/test_readme_snippets.py, against an export made the demo's way; none may be marked
  "not run".
- A block marked `<!-- run: ... -->` on the line before its fence runs here: ```bash lines are `deploytk` commands
  cheap enough for the default suite (CHEAP), run in the repository root; ```yaml is a config, loaded as one.
- Every other block carries `<!-- not run: why -->` on the line before its fence.
"""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from helpers import snapshot
from helpers.docs import ROOT, Block, every_block, fenced_blocks

#: the commands a `run` block may hold: they read the repository and write nothing, in seconds on the digits ViT
CHEAP = {"methods", "configs", "inspect", "families", "--help", "--version"}
#: what a `run` marker can mean, per language
RUNNABLE = {"bash", "yaml"}


def problems(blocks: list[Block]) -> list[str]:
    """What is wrong with the blocks' markers: one line per block that is neither run nor says why."""
    found = []
    for block in blocks:
        kind = block.marker[0] if block.marker else None
        if block.lang == "python":
            if kind == "not run":
                found.append(f"{block.where()}: a Python block is run by tests/test_readme_snippets.py, not marked 'not run'")
        elif kind is None:
            found.append(f"{block.where()}: neither run by a test nor marked `<!-- not run: why -->` on the line before it")
        elif kind == "run" and block.lang not in RUNNABLE:
            found.append(f"{block.where()}: marked 'run', but only {sorted(RUNNABLE)} blocks are run here")
        elif kind == "run" and block.lang == "bash":
            for line in commands(block):
                words = shlex.split(line)
                if words[:1] != ["deploytk"] or len(words) < 2 or words[1] not in CHEAP:
                    found.append(f"{block.where()}: `{line}` is not one of the cheap commands run here ({sorted(CHEAP)})")
    return found


def commands(block: Block) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in block.body.splitlines() if line.split("#", 1)[0].strip()]


def test_every_block_is_run_or_says_why():
    blocks = every_block()
    assert len(blocks) > 20 and {b.page for b in blocks} >= {"README.md", "docs/getting-started.md"}
    assert problems(blocks) == []


def test_an_unmarked_or_overreaching_block_is_caught():
    page = "\n".join(
        [
            "```bash",
            "deploytk export x.yaml",
            "```",
            "<!-- run: here -->",
            "```bash",
            "deploytk export x.yaml",
            "```",
            "<!-- not run: shown only -->",
            "```python",
            "print(1)",
            "```",
            "<!-- not run: a listing -->",
            "```text",
            "a",
            "```",
        ]
    )
    found = problems(fenced_blocks(page, "page.md"))
    assert len(found) == 3, found
    assert "page.md:1 (bash): neither run by a test nor marked" in found[0]
    assert "`deploytk export x.yaml` is not one of the cheap commands" in found[1]
    assert "page.md:9 (python)" in found[2]


def run_blocks(lang: str) -> list[Block]:
    return [b for b in every_block() if b.marker and b.marker[0] == "run" and b.lang == lang]


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize("block", run_blocks("bash"), ids=lambda b: f"{b.page}:{b.line}")
def test_the_run_bash_blocks_run(block):
    configs = snapshot(ROOT / "export_configs")
    for line in commands(block):
        words = shlex.split(line)
        done = subprocess.run([sys.executable, "-m", "deploytk", *words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{block.where()}: `{line}` exited {done.returncode}\n{done.stderr[-2000:]}"
        assert done.stdout.strip(), f"{block.where()}: `{line}` printed nothing"
    assert snapshot(ROOT / "export_configs") == configs


@pytest.mark.parametrize("block", run_blocks("yaml"), ids=lambda b: f"{b.page}:{b.line}")
def test_the_run_yaml_blocks_are_configs(block, tmp_path):
    from deploytk.config import load_config

    path = tmp_path / "config.yaml"
    path.write_text(block.body)
    cfg = load_config(path)
    assert cfg.merge.method in block.body and cfg.model in block.body
