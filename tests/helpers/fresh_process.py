"""A second Python process that opens artifacts the way a user's next session does: nothing of the exporting process
(no model object held in memory, another working folder), only the artifact directory.

One process per test worker serves every request (starting Python with torch and transformers costs seconds): a request
is one JSON line on its stdin, the answer one line on its stdout marked with ``ANSWER`` (libraries may print too).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ANSWER = "@@deploytk-answer "

_SERVER = f"""
import json, sys, traceback
import deploytk
for line in sys.stdin:
    request = json.loads(line)
    try:
        report = deploytk.load(request["artifact"]).validate(request["backends"], num_samples=request["num_images"], batch_size=2)
        answer = {{"passed": report.passed, "report": report.to_dict()}}
    except Exception as err:
        answer = {{"error": f"{{type(err).__name__}}: {{err}}", "traceback": traceback.format_exc()}}
    print({ANSWER!r} + json.dumps(answer), flush=True)
"""


class FreshProcess:
    """``validate(artifact)`` in the other process; ``close()`` ends it."""

    def __init__(self, cwd: Path):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=cwd
        )

    def validate(self, artifact: Path, backends: list[str], num_images: int) -> dict:
        request = {"artifact": str(artifact), "backends": backends, "num_images": num_images}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(ANSWER):
                return json.loads(line[len(ANSWER) :])
        raise RuntimeError(f"the fresh process ended (exit {self.proc.wait()}) without answering for {artifact}")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
