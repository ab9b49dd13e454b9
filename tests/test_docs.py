"""The documentation site (issue 43): its reference pages are generated, it builds with ``mkdocs build --strict``, and
(slow tier) it renders in a real headless browser.

The build takes about a second here, so it runs in the default suite; the browser check needs Chromium and playwright
(`make browser-env` installs them, and `make slow` does so first) and starts a browser, so it is in the slow tier.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import write_docs_reference  # noqa: E402  (scripts/write_docs_reference.py)

#: the site's sections, as issue 43 names them, in the navigation's order
SECTIONS = ["Getting started", "Concepts", "Guides", "Reference", "Results", "Contributing"]
REFERENCE_PAGES = {"CLI": "cli.md", "Python API": "api.md", "Methods": "methods.md", "Config schema": "config.md"}


def run_script(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "write_docs_reference.py"), *args], capture_output=True, text=True, env=env, cwd=ROOT
    )


def test_reference_pages_equal_what_the_script_generates(tmp_path):
    """A hand edit of docs/reference/ fails here; so does a command, API object, method or config key that changed
    without the pages being regenerated. Generating twice gives the same bytes."""
    first = write_docs_reference.render_pages()
    assert sorted(first) == sorted(REFERENCE_PAGES.values())
    stale = [name for name, text in first.items() if (ROOT / "docs" / "reference" / name).read_text() != text]
    stale_paths = ", ".join("docs/reference/" + name for name in stale)
    assert not stale, f"{stale_paths} differ from what the code says: run python scripts/write_docs_reference.py"
    assert write_docs_reference.render_pages() == first


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_check_names_a_hand_edited_page_and_writes_nothing(tmp_path):
    """`--check` (what a contributor runs, here as a script) exits 1 naming the edited page, leaving the folder as it
    was; the script writes the same pages into a fresh folder."""
    assert write_docs_reference.main(["--output", str(tmp_path / "fresh")]) == 0
    for name in REFERENCE_PAGES.values():
        assert (tmp_path / "fresh" / name).read_text() == (ROOT / "docs" / "reference" / name).read_text(), name
    edited = tmp_path / "edited"
    shutil.copytree(ROOT / "docs" / "reference", edited)
    page = edited / "config.md"
    page.write_text(page.read_text().replace("the example batch the export traces", "a hand-written line"))
    before = {p.name: p.read_bytes() for p in edited.iterdir()}
    result = run_script("--check", "--output", str(edited))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"stale: {page} (run python scripts/write_docs_reference.py)" in result.stdout
    assert "cli.md" not in result.stdout and "api.md" not in result.stdout
    assert {p.name: p.read_bytes() for p in edited.iterdir()} == before


def test_reference_pages_cover_every_command_api_object_method_and_config_key():
    """What each page is generated from shows up in it: a command, an exported name, a method or a key the generator
    skipped fails here."""
    import typer.main

    import deploytk
    from deploytk.cli import app
    from deploytk.config import DeployConfig, ExportSettings, MergeConfig
    from deploytk.reducers import METHODS

    pages = {name: (ROOT / "docs" / "reference" / name).read_text() for name in REFERENCE_PAGES.values()}
    root = typer.main.get_command(app)
    for command in root.commands:
        assert f"## `deploytk {command}`" in pages["cli.md"], command
    assert "## `deploytk plugins compile`" in pages["cli.md"]
    assert "| `--min-top1` | float |" in pages["cli.md"]  # a flag whose name is not the parameter's
    assert "| `--baseline` / `--no-baseline` | flag | `--baseline` |" in pages["cli.md"]
    assert str(ROOT) not in pages["cli.md"]  # the default config's path is written relative to the repository
    for name in deploytk.__all__:
        if name != "__version__":  # a type alias is one line of text: mkdocstrings renders objects with a docstring
            assert f"::: deploytk.{name}\n" in pages["api.md"] or f"`deploytk.{name}`: `" in pages["api.md"], name
    for name, method in METHODS.items():
        assert f"## `{name}`" in pages["methods.md"]
        for option in method.Options.model_fields:
            if option != "tuned":
                assert f"| `{option}` |" in pages["methods.md"], (name, option)
    for model, prefix in ((DeployConfig, ""), (MergeConfig, "merge."), (ExportSettings, "export.")):
        for key, field in model.model_fields.items():
            assert field.description, f"config key `{prefix}{key}` has no description: the config reference shows it"
            assert f"| `{prefix}{key}` |" in pages["config.md"], key


class _Nav(HTMLParser):
    """The titles of material's primary navigation, as (level, title): level 1 the sections, 2 their pages."""

    def __init__(self):
        super().__init__()
        self.nav_depth = 0  # <nav> elements open inside the primary navigation
        self.lists = 0  # <ul> lists open inside it
        self.span = False
        self.items: list[tuple[int, str]] = []

    def handle_starttag(self, tag, attrs):
        classes = (dict(attrs).get("class") or "").split()
        if tag == "nav" and (self.nav_depth or "md-nav--primary" in classes):
            self.nav_depth += 1
        elif self.nav_depth and tag == "ul":
            self.lists += 1
        elif self.nav_depth and tag == "span" and "md-ellipsis" in classes:
            self.span = True
            self.items.append((self.lists, ""))

    def handle_endtag(self, tag):
        if tag == "nav" and self.nav_depth:
            self.nav_depth -= 1
        elif tag == "ul" and self.nav_depth:
            self.lists -= 1
        elif tag == "span" and self.span:
            self.span = False

    def handle_data(self, data):
        if self.span:
            level, text = self.items[-1]
            self.items[-1] = (level, (text + " " + data).strip())


def build_site(site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    mkdocs = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    return subprocess.run(mkdocs, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def nav_of(page: Path) -> list[tuple[int, str]]:
    parser = _Nav()
    parser.feed(page.read_text())
    return [(level, " ".join(title.split())) for level, title in parser.items]


def test_site_builds_strict_with_the_issues_sections(tmp_path):
    """`mkdocs build --strict` (what `make docs` runs; a broken link or a page outside the nav fails it) into a temp
    folder, leaving the checkout's files as they were; the built navigation has the issue's sections and the four
    generated reference pages, and the API page holds the rendered docstrings."""
    tracked = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], capture_output=True, text=True, cwd=ROOT).stdout
    result = build_site(tmp_path / "site")
    assert result.returncode == 0, result.stderr[-3000:]
    nav = nav_of(tmp_path / "site" / "index.html")
    top = [title for level, title in nav if level == 1]
    assert [title for title in top if title in SECTIONS] == SECTIONS, top
    reference = [title for level, title in nav[[t for _, t in nav].index("Reference") + 1 :][:4]]
    assert reference == list(REFERENCE_PAGES), nav
    for page in REFERENCE_PAGES.values():
        assert (tmp_path / "site" / "reference" / page.removesuffix(".md") / "index.html").is_file()
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert 'id="deploytk.export"' in api and "deploytk.Artifact" in api
    assert "Export <code>model</code> reduced by <code>method</code>" in api  # the docstring, its ``code`` rendered
    assert "::: deploytk" not in api  # every directive was rendered by mkdocstrings
    assert (
        subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], capture_output=True, text=True, cwd=ROOT).stdout
        == tracked
    )


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_strict_build_fails_on_a_broken_link(tmp_path):
    """The build the suite relies on does fail: the site's config (inherited, hooks and all) over a copy of docs/ with
    one broken link is refused by --strict, naming the link."""
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    page = docs / "reference" / "config.md"
    page.write_text(page.read_text() + "\n[a page that is not there](no-such-page.md)\n")
    config = tmp_path / "mkdocs.yml"
    settings = {"INHERIT": str(ROOT / "mkdocs.yml"), "docs_dir": str(docs)}
    hooks = yaml.safe_load((ROOT / "mkdocs.yml").read_text()).get("hooks")
    if hooks:  # paths relative to the config file: the repository's, from this one in a temp folder
        settings["hooks"] = [str(ROOT / hook) for hook in hooks]
    config.write_text(yaml.safe_dump(settings))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode != 0
    assert "no-such-page.md" in result.stderr, result.stderr[-2000:]
    page.write_text(page.read_text().replace("\n[a page that is not there](no-such-page.md)\n", ""))
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]  # the same copy without the link builds: the link was the failure


@pytest.mark.slow
def test_site_renders_in_headless_chromium_and_search_finds_tomematch(tmp_path):
    """scripts/docs_screenshot.py in a real headless Chromium: the home page, one guide and the API reference render
    with their navigation, the search box finds "ToMeMatch", and the home page's screenshot is written."""
    missing = [
        what
        for what, present in (
            ("playwright (pip)", importlib.util.find_spec("playwright") is not None),
            ("Debian's chromium", shutil.which("chromium") is not None),
        )
        if not present
    ]
    if missing:
        reason = f"{' and '.join(missing)} not installed: `make browser-env` installs them"
        if os.environ.get("DEPLOYTK_REQUIRE_BROWSER"):  # `make slow` sets it: the tier never passes without the browser
            pytest.fail(f"the browser test must run here (DEPLOYTK_REQUIRE_BROWSER is set): {reason}")
        pytest.skip(reason)
    shot = tmp_path / "home.png"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "docs_screenshot.py"), "--site", str(tmp_path / "site"), "--screenshot", str(shot)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for line in ("home page: ok", "guide page: ok", "API reference: ok", "search 'ToMeMatch': "):
        assert line in result.stdout, result.stdout
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_docs_build_needs_only_the_docs_extra_with_a_signature_formatter():
    """Issue 55, item 6: `make docs` makes its own venv from the [docs] extra (no `make install`, no torch: mkdocstrings
    reads the source), and the extra holds a formatter mkdocstrings wraps long signatures with."""
    import tomllib

    docs = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["docs"]
    names = {re.split(r"[<>=!~\[ ]", requirement, maxsplit=1)[0] for requirement in docs}
    assert {"mkdocs", "mkdocstrings-python"} <= names and names & {"ruff", "black"} and not names & {"torch", "timm", "deploytk"}
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^docs: (.*)$", makefile, re.M).group(1)
    assert "install" not in target.split() and "DOCS_VENV" in target
    listed = subprocess.run([sys.executable, str(ROOT / "scripts" / "extra_requirements.py"), "docs"], capture_output=True, text=True)
    assert listed.returncode == 0 and listed.stdout.split() == docs
