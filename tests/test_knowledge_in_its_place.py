"""Knowledge about one runtime stays in its Backend: no backend name is compared as a string elsewhere.

The way the layer contract is checked by import-linter, this is checked by reading the source: a comparison
with a backend's ``--backend`` name outside ``deploytk/backends/`` is a runtime's knowledge leaking out.
"""

import re
from pathlib import Path

from deploytk.backends import BACKENDS

ROOT = Path(__file__).resolve().parents[1]
NAMES = "|".join(re.escape(n) for n in sorted(BACKENDS, key=len, reverse=True))
COMPARED = re.compile(rf"""(==|!=|\bin\s*[\(\[\{{][^\)\]\}}]*)\s*["']({NAMES})["']|["']({NAMES})["']\s*(==|!=)""")


def sources():
    for folder in ("deploytk", "benchmarks", "plugins"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "backends" not in path.relative_to(ROOT).parts:
                yield path


def test_no_backend_name_is_compared_outside_the_backends():
    found = []
    for path in sources():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if COMPARED.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "backend names compared outside deploytk/backends/ (ask the Backend instead):\n" + "\n".join(found)


def test_the_check_finds_what_it_looks_for():
    assert COMPARED.search('if backend.name == "trt" and x:') and COMPARED.search("if name in ('ort', 'ort-cuda'):")
    assert not COMPARED.search('help="ort | openvino"') and not COMPARED.search('get_backend("ort")')


def test_every_backend_names_itself_for_reports_and_says_whether_it_needs_a_build(tmp_path):
    assert all(b.display_name for b in BACKENDS.values())
    assert [n for n, b in BACKENDS.items() if b.needs_build(tmp_path)] == ["trt"]  # no model.engine yet
    (tmp_path / "model.engine").write_bytes(b"")
    assert not any(b.needs_build(tmp_path) for b in BACKENDS.values())
