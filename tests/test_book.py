"""The book builds with no warnings (-W -n), serves its own MathJax, and links each chapter to Colab."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from conftest import ROOT, toc_files

sys.path.insert(0, str(ROOT / "book" / "_scripts"))
import editions  # noqa: E402 (book/_scripts is not a package): what book-all builds

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


# --- the Korean and Chinese editions (book/_scripts/editions.py), built beside the English ---
EDITIONS = {f"{e.folder}/" if e.folder else "": e.html_lang for e in editions.EDITIONS}  # folder -> <html lang>
_LANG = re.compile(r"<html[^>]*\blang=\"([^\"]+)\"")
_NAV = re.compile(r'<nav class="vitlab-editions"[^>]*>(.*?)</nav>', re.S)
_HREF = re.compile(r'href="([^"]+)"')


@pytest.mark.parametrize("folder", list(EDITIONS))
@pytest.mark.parametrize("page", toc_files())
def test_every_edition_has_the_page_and_links_the_others(html: Path, folder: str, page: str) -> None:
    """Each page exists in all three editions, says its language in <html lang>, and links the
    same page in the two other editions (relative links that resolve)."""
    path = html / f"{folder}{page}.html"
    assert path.exists(), f"{folder}{page}.html was not built"
    text = path.read_text(encoding="utf-8")
    lang = _LANG.search(text)
    assert lang and lang.group(1) == EDITIONS[folder], f"{folder}{page}.html has <html lang={lang and lang.group(1)}>"
    nav = _NAV.search(text)
    assert nav, f"{folder}{page}.html has no links to the other editions"
    targets = {(path.parent / href).resolve() for href in _HREF.findall(nav.group(1))}
    others = {(html / f"{other}{page}.html").resolve() for other in EDITIONS if other != folder}
    assert targets == others, f"{folder}{page}.html links {sorted(map(str, targets))}"


@pytest.mark.parametrize("folder", ["ko/", "zh/"])
def test_editions_search_their_own_language(html: Path, folder: str) -> None:
    """Each edition has its own search index, with words of its language in it (Chinese ones
    need jieba's segmentation, which Sphinx uses only when it is installed)."""
    script = (html / folder / "searchindex.js").read_text(encoding="utf-8")
    index = json.loads(script[script.index("(") + 1 : script.rindex(")")])
    word = {"ko/": "어텐션", "zh/": "注意力"}[folder]
    terms = [term for term in index["terms"] if term.startswith(word)]
    assert terms, f"{folder}searchindex.js has no term starting with {word!r}"
    pages = {page for term in terms for page in _as_list(index["terms"][term])}
    assert len(pages) >= 5, f"{folder}: {word!r} is indexed on {len(pages)} pages only"


def _as_list(value: int | list[int]) -> list[int]:
    return value if isinstance(value, list) else [value]


@pytest.mark.parametrize(("folder", "script"), [("ko/", "[\uac00-\ud7af]"), ("zh/", "[\u4e00-\u9fff]")])
def test_edition_sidebar_is_translated(html: Path, folder: str, script: str) -> None:
    """The table of contents' part captions and chapter titles are in the edition's language."""
    text = (html / folder / f"{toc_files()[3]}.html").read_text(encoding="utf-8")
    captions = re.findall(r'class="caption-text">([^<]+)<', text)
    assert captions and all(re.search(script, c) for c in captions), f"{folder}: captions {captions}"
