"""The book builds with no warnings (-W -n), serves its own MathJax, and links each chapter to Colab."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import toc_files

pytest_plugins = ["book_build"]  # the session-wide `html` fixture: the book, built once
# Slow (a strict book build, then a browser): not in `make test-fast`. Under pytest-xdist both
# modules run in one worker (conftest.XDIST_GROUPS), so the book is built once there too.
pytestmark = pytest.mark.slow

COLAB = "colab.research.google.com/github/vitlab-course/vit-lab/blob/main/"


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


def test_math_is_served_by_the_book(html: Path) -> None:
    """MathJax comes from the book itself (no CDN), with its fonts, so math renders offline."""
    served = html / "_static" / "mathjax"
    assert (served / "tex-mml-chtml.js").exists(), "the built book has no _static/mathjax (mathjax_path in _config.yml)"
    assert list((served / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff")), "MathJax's CHTML fonts are missing"
    for page in html.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert "cdn.jsdelivr.net" not in text and "mathjax@" not in text, f"{page.name} loads MathJax from a CDN"
