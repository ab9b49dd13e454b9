"""Write deploytk/cli/methods.json, what `deploytk methods` prints, from the method registry.

`deploytk methods` reads that file instead of the registry, which imports torch and timm with every method
(issue 42: the command answers in a tenth of a second). tests/merging/test_registry.py holds the file equal to
``describe_methods()``: after changing a method, its options or their descriptions, run

    python scripts/write_cli_methods.py
"""

import json
import sys
from pathlib import Path

from deploytk.reducers import describe_methods

TARGET = Path(__file__).resolve().parents[1] / "deploytk" / "cli" / "methods.json"


def main() -> int:
    TARGET.write_text(json.dumps(describe_methods(), indent=1) + "\n")
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
