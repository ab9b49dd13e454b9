"""mkdocs hook: the pages show the plots and pictures where the scripts that made them wrote them.

The measured plots live beside their JSON in `benchmarks/results/` and the `visualize` picture in `assets/visualize/`;
copying them into `docs/` would leave two files that can disagree. This hook adds them to the site under the same
paths, so a page links `../benchmarks/results/x.png` and `mkdocs build --strict` still checks that the file exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
#: repository files the pages show, as glob patterns relative to the repository root
SHOWN = ("benchmarks/results/*.png", "assets/visualize/*.png")


def on_files(files: Files, config: Any) -> Files:
    for pattern in SHOWN:
        for path in sorted(ROOT.glob(pattern)):
            files.append(
                File(
                    path.relative_to(ROOT).as_posix(),
                    src_dir=str(ROOT),
                    dest_dir=config["site_dir"],
                    use_directory_urls=config["use_directory_urls"],
                )
            )
    return files
