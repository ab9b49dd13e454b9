"""How fast the CLI answers (issue 42, item 4; issue 55, item 7): wall time of `deploytk --help`, `deploytk --version`,
`deploytk methods`, `python -c "import deploytk"`, `deploytk.load` of an export (the digits ViT ToMe r=4, exported
first into a temporary folder) and `deploytk inspect` answered from its cache (filled by one run first, in a temporary
cache folder), each a fresh interpreter run N times, as a user starts it.

    python benchmarks/cli_startup.py --runs 10           # benchmarks/results/cli_startup_<cpu>.json
    python benchmarks/cli_startup.py --smoke --output X  # 2 runs each (the test suite's check)

The children import this checkout's deploytk (PYTHONPATH is set to it), not an installed copy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, cpu_result_output, write_result  # noqa: E402

from deploytk import __version__  # noqa: E402
from deploytk.machine import host  # noqa: E402

COMMANDS = {
    "deploytk --help": ["-m", "deploytk", "--help"],
    "deploytk --version": ["-m", "deploytk", "--version"],
    "deploytk methods": ["-m", "deploytk", "methods"],
    "import deploytk": ["-c", "import deploytk"],
}


def run_once(args: list[str], env: dict) -> float:
    """Seconds of one child interpreter; a failed run stops the benchmark with its stderr. (No memory figure: a child's
    ru_maxrss includes this process's, torch included, from before its exec.)"""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr.decode()[-2000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="fresh interpreters per command")
    parser.add_argument("--smoke", action="store_true", help="2 runs per command: checks the script, measures nothing")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    runs = 2 if args.smoke else args.runs
    out = cpu_result_output("cli_startup", "cli_startup.py", args.output)
    scratch = tempfile.TemporaryDirectory(prefix="deploytk-startup-")
    env = dict(os.environ, PYTHONPATH=str(ROOT), DEPLOYTK_CACHE=str(Path(scratch.name) / "cache"))
    artifact = Path(scratch.name) / "digits"
    config = str(ROOT / "export_configs" / "digits_vit_tome_r4.yaml")
    run_once(["-m", "deploytk", "export", config, "--output", str(artifact)], env)  # what load opens
    run_once(["-m", "deploytk", "inspect", config], env)  # fills the cache the timed runs answer from
    commands = COMMANDS | {
        "deploytk.load(export)": ["-c", f"import deploytk; deploytk.load({str(artifact)!r})"],
        "deploytk inspect (cached)": ["-m", "deploytk", "inspect", config],
    }
    rows = []
    for name, child_args in commands.items():
        seconds = [run_once(child_args, env) for _ in range(runs)]
        row = {
            "command": name,
            "runs": runs,
            "median_s": round(statistics.median(seconds), 4),
            "min_s": round(min(seconds), 4),
            "max_s": round(max(seconds), 4),
        }
        rows.append(row)
        print(f"{name:26s} median {row['median_s']:.3f} s  min {row['min_s']:.3f}  max {row['max_s']:.3f}")
    write_result(out, {"smoke": args.smoke, "deploytk": __version__, "host": host(), "python": sys.version.split()[0], "rows": rows})
    scratch.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
