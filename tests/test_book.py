"""The book builds with no warnings (-W -n), and every chapter page links to its notebook on Colab."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_repository import ROOT, toc_files

ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Sphinx colours its log even when it is not a terminal
COLAB = "colab.research.google.com/github/vitlab-course/vit-lab/blob/main/"


def jupyter_book() -> str:
    """The jupyter-book next to this Python (the .venv one), else the one on PATH."""
    beside = Path(sys.executable).with_name("jupyter-book")
    found = str(beside) if beside.exists() else shutil.which("jupyter-book")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("jupyter-book is not installed, and CI must build the book (pip install -r requirements.txt)")
        pytest.skip("jupyter-book is not installed (pip install -r requirements.txt)")
    return found


@pytest.fixture(scope="module")
def html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the book once, out of tree, exactly as `make book` does; return the html folder."""
    out = tmp_path_factory.mktemp("book")
    command = [jupyter_book(), "build", str(ROOT), "-W", "-n", "--keep-going", "--path-output", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        log = ANSI.sub("", result.stdout + result.stderr).splitlines()
        problems = [line for line in log if "WARNING" in line or "ERROR" in line]
        pytest.fail("book build failed:\n" + "\n".join(problems or log[-40:]), pytrace=False)
    return out / "_build" / "html"


def test_landing_page_exists(html: Path) -> None:
    assert (html / "index.html").exists()
    assert (html / f"{toc_files()[0]}.html").exists()


@pytest.mark.parametrize("page", toc_files())
def test_page_is_built(html: Path, page: str) -> None:
    assert (html / f"{page}.html").exists(), f"{page}.html was not built"


@pytest.mark.parametrize("page", [f for f in toc_files() if f.startswith("notebooks/")])
def test_chapter_links_to_its_notebook_on_colab(html: Path, page: str) -> None:
    text = (html / f"{page}.html").read_text(encoding="utf-8")
    assert f"{COLAB}{page}.ipynb" in text, f"{page}.html has no Colab launch link to {page}.ipynb"
