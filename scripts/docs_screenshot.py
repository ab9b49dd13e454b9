"""Open the built documentation site in a real headless Chromium and check that a reader sees it (issue 43).

Builds the site (``mkdocs build --strict``) into ``--site`` (default: a temporary folder), serves it over HTTP on
127.0.0.1 (material's search runs in a web worker, which a ``file://`` page may not start), and with playwright
driving Debian's ``chromium`` (``/usr/bin/chromium``; playwright's own browser download is not used) checks that

- the home page, one guide (Bring your own model) and the API reference render: a title, the page's heading and
  the primary navigation with the site's sections (Getting started, Concepts, Guides, Reference, Results,
  Contributing); on the API page the rendered ``deploytk.export`` entry with its signature;
- the search box finds "ToMeMatch": typed into the box as a reader types it, the results are read back;

and writes a screenshot of the home page (1280 x 800) to ``--screenshot`` (default docs/assets/home.png, the one the
docs show). Requests that leave 127.0.0.1 (the theme's web fonts) are refused, so the check is the same offline.
Prints one line per check; exits 1 naming the first check that failed. `make docs-browser` installs chromium and
playwright and runs

    python scripts/docs_screenshot.py                     # build, check, write docs/assets/home.png
    python scripts/docs_screenshot.py --site /tmp/site --screenshot /tmp/home.png
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ["Getting started", "Concepts", "Guides", "Reference", "Results", "Contributing"]
#: the pages checked, by what the script prints: their path and their title in the navigation (marked there as the
#: page being read)
PAGES = {
    "home page": ("", "Home"),
    "guide page": ("guides/bring-your-own-model/", "Bring your own model"),
    "API reference": ("reference/api/", "Python API"),
}
SEARCH_TERM = "ToMeMatch"


class CheckFailed(Exception):
    pass


def build(site: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise CheckFailed(f"mkdocs build --strict failed:\n{result.stderr[-3000:]}")


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """The built site over HTTP on a free port of 127.0.0.1, in a daemon thread."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # one line per request would bury the checks' output
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def primary_nav(page) -> list[str]:
    """The titles of the primary navigation's first level, as material lays it out (the page being read has two links,
    its own and its table of contents' label: listed once)."""
    texts = page.locator(".md-nav--primary > .md-nav__list > .md-nav__item > .md-nav__link .md-ellipsis").all_inner_texts()
    return list(dict.fromkeys(" ".join(text.split()) for text in texts))


def check_page(page, base: str, name: str, path: str, title: str) -> None:
    response = page.goto(base + path, wait_until="load")
    if response is None or response.status != 200:
        raise CheckFailed(f"{name}: {base + path} answered {response.status if response else 'nothing'}")
    if "deploytk" not in page.title():
        raise CheckFailed(f"{name}: the title is {page.title()!r}, not the site's")
    h1 = page.locator("article h1").first
    if not h1.is_visible():
        raise CheckFailed(f"{name}: no visible heading in the page's article")
    shown = " ".join(h1.inner_text().split()).rstrip("¶").strip()
    nav = primary_nav(page)
    missing = [section for section in SECTIONS if section not in nav]
    if missing:
        raise CheckFailed(f"{name}: the navigation lacks {missing} (it shows {nav})")
    active = [" ".join(t.split()) for t in page.locator(".md-nav--primary .md-nav__link--active .md-ellipsis").all_inner_texts()]
    if title not in active:
        raise CheckFailed(f"{name}: the navigation marks {active} as the page being read, not {title!r}")
    print(f"{name}: ok ({base + path}: heading {shown!r}, {title!r} marked in the navigation of {', '.join(nav)})")


def check_api(page) -> None:
    entry = page.locator('[id="deploytk.export"]')
    if entry.count() == 0 or not entry.first.is_visible():
        raise CheckFailed("API reference: no rendered deploytk.export entry")
    signature = page.locator(".doc-signature").first.inner_text()
    if "def export(" not in signature and "export(" not in signature:
        raise CheckFailed(f"API reference: the first signature is {signature[:200]!r}, not export's")


def check_search(page, base: str) -> list[str]:
    page.goto(base, wait_until="load")
    box = page.locator("input.md-search__input")
    if not box.is_visible():  # a narrow window hides the box behind the header's search button
        page.locator("label.md-header__button[for='__search']").first.click()
    box.wait_for(state="visible", timeout=10_000)
    box.click()
    box.press_sequentially(SEARCH_TERM, delay=50)
    results = page.locator(".md-search-result__item")
    try:
        results.first.wait_for(state="visible", timeout=20_000)
    except Exception:
        meta = page.locator(".md-search-result__meta").first.inner_text() if page.locator(".md-search-result__meta").count() else ""
        raise CheckFailed(f"search {SEARCH_TERM!r}: no results ({meta!r})") from None
    found = []  # (the result's title, its page) as the reader sees them
    for item in results.all():
        link = item.locator("a.md-search-result__link").first
        title = link.locator("h1, h2").first.inner_text() if link.locator("h1, h2").count() else link.inner_text()
        found.append((" ".join(title.split()), (link.get_attribute("href") or "").replace(base, "").split("?")[0]))
    if not any(page_path.startswith(("reference/methods", "reference/api")) for _, page_path in found):
        raise CheckFailed(f"search {SEARCH_TERM!r}: no result on the methods or API reference (results: {found})")
    return [f"{title} ({page_path})" for title, page_path in found]


def run(site: Path, screenshot: Path, chromium: str) -> None:
    from playwright.sync_api import sync_playwright

    build(site)
    server, base = serve(site)
    try:
        with sync_playwright() as playwright:
            # --no-sandbox: Chromium refuses to start its sandbox as root, which CI's and this machine's user is
            browser = playwright.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(base) else route.abort())
                for name, (path, title) in PAGES.items():
                    check_page(page, base, name, path, title)
                    if name == "API reference":
                        check_api(page)
                found = check_search(page, base)
                print(f"search {SEARCH_TERM!r}: {len(found)} results: {'; '.join(found)}")
                page.goto(base, wait_until="load")
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(screenshot))
                print(f"wrote {screenshot}")
            finally:
                browser.close()
    finally:
        server.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, help="folder to build the site into (default: a temporary folder)")
    parser.add_argument("--screenshot", type=Path, default=ROOT / "docs" / "assets" / "home.png", help="PNG of the home page")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium", help="the Chromium to drive")
    args = parser.parse_args(argv)
    if not Path(args.chromium).is_file():
        print(f"error: no Chromium at {args.chromium}: install Debian's (`apt-get install chromium`, or make docs-browser)")
        return 1
    try:
        if args.site is None:
            with tempfile.TemporaryDirectory(prefix="deploytk-site-") as folder:
                run(Path(folder) / "site", args.screenshot, args.chromium)
        else:
            run(args.site, args.screenshot, args.chromium)
    except CheckFailed as failed:
        print(f"error: {failed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
