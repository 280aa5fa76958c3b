"""The built book in Debian's Chromium, offline: what the browser tests share.

Test modules never import each other, so the pieces a second browser test needs live here:
the server that serves the built book on 127.0.0.1, the Chromium flags that keep it off the
network, the rule that tells this machine's requests from another host's, and axe-core. The
fixtures that serve and open the book are book_build.py's.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from conftest import ROOT, toc_files

CHROMIUM = Path(os.environ.get("VITLAB_CHROMIUM", "/usr/bin/chromium"))
# Flags that work on a machine with no network: without the background-networking ones,
# Chromium keeps trying to reach Google's hosts. Playwright adds a fresh --user-data-dir.
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
SCREENSHOTS = ROOT / "_build" / "screenshots"
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
VEGA_MIME = re.compile(r"application/vnd\.vegalite\.v\d+\+json")


def figures_in(notebook: Path) -> tuple[int, int]:
    """How many interactive figures a chapter's stored outputs hold (a Vega-Lite spec, or the
    HTML that holds one), and how many of them are attention explorers (a "patch" parameter)."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    figures = explorers = 0
    for data in (output.get("data", {}) for cell in cells for output in cell.get("outputs", [])):
        spec = next((value for mime, value in data.items() if VEGA_MIME.fullmatch(mime)), None)
        if spec is not None or 'class="vitlab-vega"' in "".join(data.get("text/html", "")):
            figures += 1
            explorers += spec is None or any(param.get("name") == "patch" for param in spec.get("params", []))
    return figures, explorers


# chapter -> (its figures, its explorers)
FIGURES = {page: figures_in(ROOT / f"{page}.ipynb") for page in toc_files() if page.startswith("notebooks/")}
FIRST_EXPLORER = next((page for page, (_, explorers) in FIGURES.items() if explorers), "")
# The pages test_browser_explorer.py opens at a phone's width (and checks that they do not
# scroll sideways there): every chapter with a figure, and the first explorer's chapter in
# Korean and Chinese.
EXPLORED = {page for page, (figures, _) in FIGURES.items() if figures} | {
    f"{edition}/{FIRST_EXPLORER}" for edition in ("ko", "zh")
}


def unavailable(reason: str) -> None:
    """Skip, saying why; CI (VITLAB_REQUIRE_BROWSER=1) fails instead, so the tests cannot silently vanish."""
    if os.environ.get("VITLAB_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason}, and VITLAB_REQUIRE_BROWSER=1 requires the browser tests", pytrace=False)
    pytest.skip(reason)


def is_local(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme not in ("http", "https") or parts.hostname in LOCAL_HOSTS


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass


@contextmanager
def serve(folder: Path) -> Iterator[str]:
    """``folder`` served on 127.0.0.1 (a free port); its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextmanager
def chromium() -> Iterator[Any]:
    """Debian's Chromium driven by Playwright (never a downloaded browser), or a skip."""
    if not CHROMIUM.exists():
        unavailable(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set VITLAB_CHROMIUM)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("playwright is not installed (pip install -r requirements-dev.txt)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def axe(page: Any, selector: str = "html") -> list[str]:
    """axe-core's WCAG 2.1 A/AA violations inside the elements ``selector`` matches, one line each."""
    if not AXE.exists():
        pytest.fail(f"{AXE.relative_to(ROOT)} is missing: run `make mathjax` (npm ci)", pytrace=False)
    page.add_script_tag(path=str(AXE))
    return page.evaluate(
        """async ([selector, tags]) => {
            const result = await axe.run({include: [[selector]]}, {runOnly: {type: "tag", values: tags}});
            return result.violations.flatMap((v) => v.nodes.map(
                (n) => `${v.id} (${v.impact}): ${n.target.join(" ")}  ${n.html.slice(0, 120)}`));
        }""",
        [selector, AXE_TAGS],
    )
