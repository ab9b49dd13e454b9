"""The requirements of one extra of deploytk's pyproject.toml, one per line: what `make docs` installs into its own venv
without installing deploytk (and its torch) itself.

    python3 scripts/extra_requirements.py docs
"""

from __future__ import annotations

import sys
from pathlib import Path

import tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def main(argv: list[str]) -> int:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    if len(argv) != 1 or argv[0] not in extras:
        print(f"usage: extra_requirements.py EXTRA (one of {', '.join(extras)})", file=sys.stderr)
        return 2
    print("\n".join(extras[argv[0]]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
