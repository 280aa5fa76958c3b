"""The book, built once per test session: a pytest plugin that test_book.py and the browser tests load.

Both modules say ``pytest_plugins = ["book_build"]``, so the ``html`` fixture is registered
once, for the whole session, and the book is built once however many modules use it. A
session here is one process: under pytest-xdist (``make test`` runs two workers) both
modules are one group (``XDIST_GROUPS`` in conftest.py), so they run in the same worker and
share its one build. Both are marked slow, so ``make test-fast`` builds nothing. The browser
tests also take ``site`` (the build served on 127.0.0.1) and ``browser`` (Chromium) from here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from book_browser import chromium, serve

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Sphinx colours its log even when it is not a terminal
# The book serves its own MathJax (mathjax_path in _config.yml); `make mathjax` puts it here.
MATHJAX = ROOT / "book" / "_static" / "mathjax" / "tex-mml-chtml.js"


def jupyter_book() -> str:
    """The jupyter-book next to this Python (the .venv one), else the one on PATH."""
    beside = Path(sys.executable).with_name("jupyter-book")
    found = str(beside) if beside.exists() else shutil.which("jupyter-book")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("jupyter-book is not installed, and CI must build the book (pip install -r requirements.txt)")
        pytest.skip("jupyter-book is not installed (pip install -r requirements.txt)")
    return found


@pytest.fixture(scope="session")
def html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the book once, out of tree, as `make book-all` does; return the html folder.

    English is at its root, the Korean and Chinese editions in its ``ko/`` and ``zh/``
    folders; every edition is built with ``-W -n``, so a catalogue that breaks a role, a
    link or a reference fails here.
    """
    if not MATHJAX.exists():
        pytest.fail(
            f"{MATHJAX.relative_to(ROOT)} is missing, so the book would have no math: run `make mathjax` "
            "(npm ci, then a copy into book/_static; `make test` and `make book` do it for you)",
            pytrace=False,
        )
    out = tmp_path_factory.mktemp("book")
    jupyter_book()  # skips (or fails on CI) when it is missing
    command = [sys.executable, str(ROOT / "book" / "_scripts" / "editions.py"), "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        log = ANSI.sub("", result.stdout + result.stderr).splitlines()
        problems = [line for line in log if "WARNING" in line or "ERROR" in line]
        pytest.fail("book build failed:\n" + "\n".join(problems or log[-40:]), pytrace=False)
    return out / "_build" / "html"


@pytest.fixture(scope="module")
def site(html: Path) -> Iterator[str]:
    """The built book served on 127.0.0.1 (a free port) for the module; its base URL."""
    with serve(html) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as opened:
        yield opened
