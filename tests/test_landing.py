"""The landing page and its learning-path diagram: well-formed, accessible, offline, up to date."""

from __future__ import annotations

import importlib.util
import json
import posixpath
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import pytest

from conftest import ROOT, toc_files

INTRO = ROOT / "book" / "intro.md"
SCRIPT = ROOT / "book" / "_scripts" / "make_learning_path.py"
SVG = ROOT / "book" / "_static" / "learning_path.svg"
NS = "{http://www.w3.org/2000/svg}"
REGENERATE = "run: .venv/bin/python book/_scripts/make_learning_path.py"
# Okabe and Ito's palette, told apart with every common colour-vision deficiency, and greys.
OKABE_ITO = {"#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#666666"}


def load_script() -> ModuleType:
    """book/_scripts/make_learning_path.py as a module (it is not in a package)."""
    if "make_learning_path" not in sys.modules:
        spec = importlib.util.spec_from_file_location("make_learning_path", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["make_learning_path"]


@pytest.fixture(scope="module")
def svg() -> ET.Element:
    return ET.parse(SVG).getroot()  # raises on XML that is not well-formed


def chapters() -> list[str]:
    """The chapters of the learning path (the appendix, notebooks numbered after 13, is not one)."""
    return [
        page for page in toc_files() if page.startswith("notebooks/") and int(page.split("/")[1].split("_")[0]) <= 13
    ]


def svg_text(root: ET.Element) -> str:
    """Everything the diagram shows, one line of a box after the other."""
    return " ".join(" ".join(t.itertext()) for t in root.iter(f"{NS}text"))


def test_svg_is_up_to_date() -> None:
    assert SVG.read_text(encoding="utf-8") == load_script().render(toc_files()), (
        f"{SVG.relative_to(ROOT)} is not what its script draws from _toc.yml; {REGENERATE}"
    )


def test_every_line_fits_its_box() -> None:
    assert load_script().overflowing_lines() == []


def test_svg_has_a_title_and_a_description_for_screen_readers(svg: ET.Element) -> None:
    assert svg.tag == f"{NS}svg"
    title, desc = svg[0], svg[1]
    assert title.tag == f"{NS}title" and title.text.strip()
    assert desc.tag == f"{NS}desc" and len(desc.text) > 200
    assert svg.get("aria-labelledby") == f"{title.get('id')} {desc.get('id')}"
    for link in svg.iter(f"{NS}a"):
        assert link.find(f"{NS}title") is not None, f"the link to {link.get('href')} has no <title>"


def test_svg_is_shown_inline_so_its_ids_are_prefixed(svg: ET.Element) -> None:
    """The page's own ids must not clash with the diagram's."""
    ids = [e.get("id") for e in svg.iter() if e.get("id")]
    assert len(ids) == len(set(ids))
    assert all(i.startswith(("lp-", "vitlab-")) for i in ids), ids


def test_svg_needs_nothing_from_the_network() -> None:
    text = SVG.read_text(encoding="utf-8").replace('xmlns="http://www.w3.org/2000/svg"', "")
    for needle in ("http:", "https:", "//", "@import", "@font-face", "<image", "<script", "xlink"):
        assert needle not in text, f"the SVG contains {needle!r}"
    assert set(re.findall(r"url\(([^)]*)\)", text)) <= {"#lp-arrow"}


def test_svg_text_is_real_text(svg: ET.Element) -> None:
    """Text is <text>, not outlines, so it is crisp and the browser's search finds it."""
    assert "Multi-scale" in svg_text(svg)
    assert len(list(svg.iter(f"{NS}path"))) == 1, "only the arrow head may be a path"


def test_svg_colours_are_colour_blind_safe() -> None:
    script = load_script()
    assert {g.colour for g in script.GROUPS} <= OKABE_ITO


@pytest.mark.parametrize("page", chapters())
def test_every_chapter_in_the_toc_is_in_the_diagram_with_a_link(svg: ET.Element, page: str) -> None:
    number = int(Path(page).name[:2])
    assert re.search(rf"\b{number:02d} \w", svg_text(svg)), f"no box for chapter {number}; {REGENERATE}"
    hrefs = {a.get("href") for a in svg.iter(f"{NS}a")}
    assert f"../{page}.html" in hrefs, f"the box of chapter {number} is not a link to {page}; {REGENERATE}"


@pytest.mark.parametrize("page", chapters())
def test_every_variant_is_named_in_the_diagram(svg: ET.Element, page: str) -> None:
    """The variant in a chapter's title ("# Chapter 4: DeiT — ...") is named in its box."""
    cells = json.loads((ROOT / f"{page}.ipynb").read_text(encoding="utf-8"))["cells"]
    title = next(c for c in cells if c["cell_type"] == "markdown")["source"]
    title = ("".join(title) if isinstance(title, list) else title).splitlines()[0]
    if " — " in title:  # the foundations' titles name a topic, not a variant
        variant = title.split(":", 1)[1].split(" — ")[0].strip()
        assert variant in svg_text(svg), f"{variant} is not in the diagram"


def test_every_link_in_the_diagram_goes_to_a_page_in_the_toc(svg: ET.Element) -> None:
    """Links are relative to book/intro.html, where the SVG is shown inline."""
    for link in svg.iter(f"{NS}a"):
        href = link.get("href")
        page = posixpath.normpath(posixpath.join("book", href)).removesuffix(".html")
        assert href.endswith(".html") and page in toc_files(), f"{href} is not a page of the book"


def test_intro_includes_the_diagram_inline() -> None:
    text = INTRO.read_text(encoding="utf-8")
    match = re.search(r"```\{raw\} html\n:file: (\S+)\n```", text)
    assert match, "book/intro.md does not include the learning-path SVG with {raw} html and :file:"
    assert (INTRO.parent / match.group(1)).resolve() == SVG.resolve()


@pytest.mark.parametrize("page", chapters())
def test_intro_links_every_chapter(page: str) -> None:
    """The landing page's text and table link each chapter, not only the diagram."""
    assert f"</{page}>`" in INTRO.read_text(encoding="utf-8"), (
        f"book/intro.md has no {{doc}} link to /{page}: add it to 'The learning path'"
    )
