"""Knowledge about one runtime stays in its Backend, about one method in its file: no backend or method name is
compared as a string elsewhere.

The way the layer contract is checked by import-linter, this is checked by reading the source: a comparison with a
backend's ``--backend`` name outside ``deploytk/backends/``, or with a method's ``merge.method`` name outside
``deploytk/reducers/``, is that runtime's or method's knowledge leaking out (ask the Backend or the method instead).
"""

import ast
import re
from pathlib import Path

import pytest

from deploytk.backends import BACKENDS
from deploytk.reducers import METHODS

ROOT = Path(__file__).resolve().parents[1]


def compared(names) -> re.Pattern:
    """A string comparison (==, !=, in (...)) with one of ``names``."""
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.compile(rf"""(==|!=|\bin\s*[\(\[\{{][^\)\]\}}]*)\s*["']({alternatives})["']|["']({alternatives})["']\s*(==|!=)""")


@pytest.mark.parametrize("names, home", [(BACKENDS, "backends"), (METHODS, "reducers")], ids=["backend", "method"])
def test_no_name_is_compared_outside_its_home(names, home):
    pattern, found = compared(names), []
    for folder in ("deploytk", "benchmarks", "plugins"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if home in path.relative_to(ROOT).parts:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, f"names compared outside deploytk/{home}/:\n" + "\n".join(found)


def test_the_check_finds_what_it_looks_for():
    backend, method = compared(BACKENDS), compared(METHODS)
    assert backend.search('if backend.name == "trt" and x:') and backend.search("if name in ('ort', 'ort-cuda'):")
    assert method.search('if cfg.merge.method != "atm":') and method.search('if method == "tome" and model == m:')
    assert not backend.search('help="ort | openvino"') and not backend.search('get_backend("ort")')
    assert not method.search('get_method("atm")')


def test_every_backend_names_itself_for_reports_and_says_whether_it_needs_a_build(tmp_path):
    assert all(b.display_name for b in BACKENDS.values())
    assert [n for n, b in BACKENDS.items() if b.needs_build(tmp_path)] == ["trt"]  # no model.engine yet
    (tmp_path / "model.engine").write_bytes(b"")
    assert not any(b.needs_build(tmp_path) for b in BACKENDS.values())


def test_model_library_classes_are_touched_only_by_their_family():
    """timm's model modules and transformers are imported only in deploytk/adapters/ (timm's loader in models.py is the one
    exception left until it moves into the timm family); timm.data transforms belong to the timm family too."""
    found = []
    for path in sorted((ROOT / "deploytk").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if "adapters" in rel.parts or rel.as_posix() == "deploytk/models.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):  # import statements, not examples in docstrings
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [f"{rel}:{node.lineno}: {name}" for name in names if name.split(".")[0] in ("timm", "transformers")]
    assert not found, "model-library imports outside deploytk/adapters/:\n" + "\n".join(found)


def test_every_family_describes_itself():
    from deploytk.adapters import FAMILIES, describe_families

    described = describe_families()
    assert [f["name"] for f in described] == list(FAMILIES) and all(f["summary"] and f["classes"] for f in described)
    assert [f["name"] for f in described if f["learned_reducers"]] == ["timm"]


def test_onnx_files_are_written_in_one_place():
    """exporter/onnx_io.py writes every ONNX file (external data past 2 GiB); a save_model elsewhere would break large models."""
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in ("deploytk", "benchmarks", "scripts", "plugins")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.name != "onnx_io.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bonnx\.save(_model)?\(|\.SerializeToString\(\)", line) and "schema" not in line
    ]
    assert not found, "ONNX written or serialised outside deploytk/exporter/onnx_io.py:\n" + "\n".join(found)


#: an input layout spelled out: a channels-first image shape (``3, *img_size``, ``("batch", 3``), or a feed by a
#: hard-coded input name; the input kinds (``deploytk/inputs/``) own both
LAYOUT = re.compile(r"""\b3,\s*\*\w|["']batch["'],\s*3\b|\(batch(_size)?, 3, |\{\s*["'](input|pixel_values|input_values)["']\s*:""")


def test_no_input_layout_is_known_outside_the_input_kinds():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for folder in ("deploytk", "benchmarks", "plugins", "serving")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "inputs" not in path.relative_to(ROOT).parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if LAYOUT.search(line)
    ]
    assert not found, "input layouts outside deploytk/inputs/ (ask the artifact's or family's input_kind):\n" + "\n".join(found)


def test_the_layout_check_finds_what_it_looks_for():
    assert LAYOUT.search("x = torch.randn(batch, 3, *img_size)") and LAYOUT.search('shape=("batch", 3, *self.img_size)')
    assert LAYOUT.search('session.run(None, {"input": x})') and LAYOUT.search("feed = {'pixel_values': clip}")
    assert not LAYOUT.search("session.run(None, {kind.onnx_name: x})") and not LAYOUT.search("range(3, 120)")
