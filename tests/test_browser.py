"""The built book in a real browser, as a reader gets it with no network.

The book (built once per session by the `html` fixture of book_build.py) is served on
127.0.0.1, and Debian's headless Chromium, driven by Playwright, opens every page of the
table of contents. A page passes when it logs no console error, asks no host but this
machine for anything (such requests are recorded and aborted), renders all its math with
the book's own MathJax, and shows all its images; a chapter must also show its figures and
link to its notebook on Colab and for download. Every internal link and #anchor of every
page must resolve, and the search page must find "attention".

Playwright never downloads a browser here: it drives /usr/bin/chromium (apt-get install
chromium), or $VITLAB_CHROMIUM. Without one these tests skip and say why; with
VITLAB_REQUIRE_BROWSER=1 (set by .ci/run) they fail instead. Screenshots of the landing
page, a chapter with math and the search results are saved in _build/screenshots/.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urljoin, urlsplit
from urllib.request import urlopen

import pytest
from book_browser import EXPLORED, SCREENSHOTS, axe, is_local

from conftest import ROOT, toc_files

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytest_plugins = ["book_build"]  # the book, built once (`html`); `site` serves it, `browser` opens it
# Slow (a strict book build, then a browser): not in `make test-fast`. Under pytest-xdist both
# modules run in one worker (conftest.XDIST_GROUPS), so the book is built once there too.
pytestmark = pytest.mark.slow

COLAB = "https://colab.research.google.com/github/vitlab-course/vit-lab/blob/main/"
VIEWPORT = {"width": 1280, "height": 900}

PAGES = toc_files()
CHAPTERS = [page for page in PAGES if page.startswith("notebooks/")]
# One chapter of each translated edition (built under ko/ and zh/ by book/_scripts/editions.py),
# checked like the English pages plus their fonts, and the pages they are checked against.
EDITION_CHAPTERS = ["ko/notebooks/02_attention", "zh/notebooks/07_t2t_vit"]
CJK_FONT = {"ko": "Noto Sans CJK KR", "zh": "Noto Sans CJK SC"}  # fonts-noto-cjk (.ci/run installs it)


def source_of(page: str) -> str:
    """The TOC entry a page is built from: "ko/notebooks/02_attention" -> "notebooks/02_attention"."""
    head, _, rest = page.partition("/")
    return rest if head in CJK_FONT else page


# Pages Sphinx adds to the TOC's: the redirect to the first page, search, and the index.
ALL_PAGES = ["index", *PAGES, "search", "genindex"]

# Resolves when MathJax has typeset the page (pages without math do not load it) and the
# fonts it asked for have arrived.
WAIT_FOR_MATH = """async () => {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
    await document.fonts.ready;
}"""

# What the tests need to know about a loaded page, read in one go.
SNAPSHOT = """() => {
    const skip = "pre, code, script, style, mjx-container, .highlight";
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    let prose = "";
    while (walker.nextNode()) {
        if (!walker.currentNode.parentElement.closest(skip)) prose += walker.currentNode.textContent;
    }
    const math = [...document.querySelectorAll(".math")];
    return {
        math: math.length,
        unrendered: math.filter((m) => !m.querySelector("mjx-container")).map((m) => m.textContent.slice(0, 80)),
        merrors: [...document.querySelectorAll("mjx-merror")]
            .map((e) => e.getAttribute("data-mjx-error") || e.textContent),
        raw_dollars: prose.includes("$$"),
        images: [...document.querySelectorAll("img")].map((img) => ({
            src: img.getAttribute("src"),
            loaded: img.complete && img.naturalWidth > 0,
            figure: img.closest(".cell_output") !== null,
        })),
        colab: [...document.querySelectorAll("a[href*='colab.research.google.com']")].map((a) => a.href),
        download: [...document.querySelectorAll("a.btn-download-source-button")].map((a) => a.href),
    };
}"""


# The layout a reader sees at one viewport width, read in one go (LAYOUT_CHECKS below).
LAYOUT = """() => {
    const wide = (e) => e.scrollWidth > e.clientWidth + 1;
    const blocks = [...document.querySelectorAll("article pre")];
    const equations = [...document.querySelectorAll("article mjx-container[display='true']")].filter((m) => {
        const inner = m.querySelector("mjx-math");
        const box = m.closest("div.math") || m.parentElement;
        return inner && inner.getBoundingClientRect().width > box.clientWidth + 1;
    });
    const title = document.querySelector("article h1");
    const cell = document.querySelector("article div.cell");
    const titleFirst = !cell || (title !== null &&
        (title.compareDocumentPosition(cell) & Node.DOCUMENT_POSITION_FOLLOWING) !== 0);
    const images = [...document.querySelectorAll("article .cell_output img")].map((img) => {
        // the size the notebook asked for (IPython's Image(width=...) becomes a style width)
        const asked = img.style.width.endsWith("px") ? parseFloat(img.style.width) : Number(img.getAttribute("width"));
        const intended = asked || img.naturalWidth;
        return {src: img.getAttribute("src"), alt: img.getAttribute("alt") || "",
                scale: intended ? img.clientWidth / intended : 1};
    });
    return {
        blocks: blocks.length,
        scrolling: blocks.filter(wide).length,
        equations: document.querySelectorAll("article mjx-container[display='true']").length,
        overflowing: equations.map((m) => (m.getAttribute("aria-label") || m.textContent).slice(0, 60)),
        page_scrolls: document.documentElement.scrollWidth > window.innerWidth + 1,
        title_first: titleFirst,
        images,
    };
}"""
PHONE = {"width": 390, "height": 844}
MAX_SCROLLING_SHARE = 0.10  # of a page's code blocks, at 1280 px
MIN_FIGURE_SCALE = 0.70  # no figure shown below 70 % of its intended size at 1280 px
# alt text a screen reader would read out as noise: a file name or a build path
NOISE_ALT = ("../_images/", ".png", ".jpg", ".svg")


@dataclass
class Visit:
    """One page load: what went wrong while loading, and the page's SNAPSHOT."""

    url: str
    errors: list[str] = field(default_factory=list)  # console errors and uncaught exceptions
    external: list[str] = field(default_factory=list)  # requests to other hosts (aborted)
    failed: list[str] = field(default_factory=list)  # local requests that failed or got >= 400
    final_url: str = ""
    snapshot: dict[str, Any] = field(default_factory=dict)
    extra: Any = None  # what `before` returned


def visit(
    browser: Browser,
    url: str,
    screenshot: str | None = None,
    before: Callable | None = None,
    redirect: str | None = None,
    viewport: dict[str, int] | None = None,
) -> Visit:
    """Load `url` (which sends the browser on to `redirect`, if given) in a fresh context, wait
    for its math, run `before(page)`, read the page, and optionally save a screenshot."""
    result = Visit(url)
    context = browser.new_context(viewport=viewport or VIEWPORT)

    def block(route: Any) -> None:
        result.external.append(route.request.url)
        route.abort()

    def on_failed(request: Any) -> None:
        if is_local(request.url):
            result.failed.append(f"{request.url}: {request.failure}")

    context.route(lambda url: not is_local(url), block)
    page = context.new_page()
    page.on("console", lambda m: m.type == "error" and result.errors.append(f"console: {m.text} ({m.location['url']})"))
    page.on("pageerror", lambda error: result.errors.append(f"uncaught: {error}"))
    page.on("requestfailed", on_failed)
    page.on("response", lambda r: r.status >= 400 and result.failed.append(f"{r.url}: HTTP {r.status}"))
    try:
        if redirect is None:
            page.goto(url, wait_until="load")
        else:
            with page.expect_navigation(url=redirect, wait_until="load"):
                page.goto(url, wait_until="commit")
        page.evaluate(WAIT_FOR_MATH)
        if before is not None:
            result.extra = before(page)
        result.final_url = page.url
        result.snapshot = page.evaluate(SNAPSHOT)
        if screenshot is not None:
            _screenshot(page, screenshot)
    finally:
        context.close()
    return result


def _scroll_to_display_math(tab: Any) -> None:
    tab.locator("div.math").first.evaluate("(e) => e.scrollIntoView({block: 'center'})")


def _screenshot(tab: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=SCREENSHOTS / name)


@pytest.fixture(scope="module")
def math_chapter(html: Path) -> str:
    """The first chapter with display math: its screenshot shows rendered equations."""
    page = next((p for p in CHAPTERS if '<div class="math' in (html / f"{p}.html").read_text("utf-8")), None)
    assert page is not None, "no chapter has display math"
    return page


@pytest.fixture(scope="module")
def visits(browser: Browser, site: str, math_chapter: str) -> Callable[[str], Visit]:
    """Each page loaded once at 1280 px for the module, however many tests look at it. A page
    of the TOC is also measured there (LAYOUT) and checked by axe-core, in the same load, its
    ``extra`` being ``{"layout": ..., "axe": ...}``. The landing page (index.html, which
    redirects to the first TOC page), the first chapters, the edition chapters and the math
    chapter (scrolled to its first equation) are screenshot."""
    shutil.rmtree(SCREENSHOTS, ignore_errors=True)  # no stale screenshot passes for a new one

    def measure(page: str) -> Callable[[Any], dict[str, Any]]:
        def before(tab: Any) -> dict[str, Any]:
            found = {"layout": _layout(tab)}
            if page in CHAPTERS[:3] or page in EDITION_CHAPTERS:
                _screenshot(tab, f"laptop_{page.replace('/', '_')}.png")
            found["axe"] = axe(tab)
            if page == math_chapter:
                _scroll_to_display_math(tab)
                _screenshot(tab, "chapter_math.png")
            return found

        return before

    @functools.cache
    def load(page: str) -> Visit:
        if page == "index":
            return visit(browser, site, screenshot="landing.png", redirect=f"{site}{PAGES[0]}.html")
        if page in PAGES or page in EDITION_CHAPTERS:
            return visit(browser, f"{site}{page}.html", before=measure(page))
        return visit(browser, f"{site}{page}.html")

    return load


@pytest.mark.parametrize("page", ALL_PAGES + EDITION_CHAPTERS)
def test_page_loads_with_no_console_errors(visits: Callable[[str], Visit], page: str) -> None:
    loaded = visits(page)
    assert not loaded.errors, f"{page}.html logged errors:\n" + "\n".join(loaded.errors)
    assert not loaded.failed, f"{page}.html could not load:\n" + "\n".join(loaded.failed)


@pytest.mark.parametrize("page", ALL_PAGES + EDITION_CHAPTERS)
def test_page_needs_no_other_host(visits: Callable[[str], Visit], page: str) -> None:
    """Links to Colab or GitHub are fine (a reader follows them); requests are not: offline they fail."""
    external = visits(page).external
    assert not external, f"{page}.html requested other hosts (it must work offline):\n" + "\n".join(external)


@pytest.mark.parametrize("page", ALL_PAGES + EDITION_CHAPTERS)
def test_math_is_rendered(visits: Callable[[str], Visit], page: str) -> None:
    snapshot = visits(page).snapshot
    assert not snapshot["unrendered"], f"{page}.html has math MathJax did not render: {snapshot['unrendered'][:5]}"
    assert not snapshot["merrors"], f"{page}.html has TeX errors: {snapshot['merrors'][:5]}"
    assert not snapshot["raw_dollars"], f"{page}.html shows a raw $$ outside code (math MyST did not parse)"


@pytest.mark.parametrize("page", ALL_PAGES + EDITION_CHAPTERS)
def test_images_load(visits: Callable[[str], Visit], page: str) -> None:
    broken = [image["src"] for image in visits(page).snapshot["images"] if not image["loaded"]]
    assert not broken, f"{page}.html has images that did not load: {broken}"


def _image_outputs(notebook: Path) -> int:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    outputs = [output for cell in cells for output in cell.get("outputs", [])]
    return sum(any(kind.startswith("image/") for kind in output.get("data", {})) for output in outputs)


@pytest.mark.parametrize("page", CHAPTERS + EDITION_CHAPTERS)
def test_chapter_shows_its_figures(visits: Callable[[str], Visit], page: str) -> None:
    expected = _image_outputs(ROOT / f"{source_of(page)}.ipynb")
    figures = [image for image in visits(page).snapshot["images"] if image["figure"] and image["loaded"]]
    assert expected >= 1, f"{page}.ipynb has no figure"
    assert len(figures) == expected, f"{page}.html shows {len(figures)} figures, its notebook has {expected}"


@pytest.mark.parametrize("page", CHAPTERS + EDITION_CHAPTERS)
def test_chapter_opens_its_notebook_in_colab(visits: Callable[[str], Visit], page: str) -> None:
    """A translated chapter opens the same (English) notebook as the English one."""
    links = set(visits(page).snapshot["colab"])
    assert links == {f"{COLAB}{source_of(page)}.ipynb"}, f"{page}.html links to Colab as {sorted(links)}"
    assert (ROOT / f"{source_of(page)}.ipynb").exists()


@pytest.mark.parametrize("page", CHAPTERS + EDITION_CHAPTERS)
def test_chapter_downloads_its_notebook(visits: Callable[[str], Visit], page: str) -> None:
    links = visits(page).snapshot["download"]
    assert len(links) == 1, f"{page}.html has {len(links)} download buttons for its source"
    assert urlsplit(links[0]).path.endswith(f"/_sources/{source_of(page)}.ipynb"), links[0]
    with urlopen(links[0], timeout=10) as response:  # noqa: S310 (our own server on 127.0.0.1)
        downloaded = response.read()
    source = (ROOT / f"{source_of(page)}.ipynb").read_bytes()
    assert downloaded == source, f"the download of {page}.html is not its notebook"


def test_landing_page(visits: Callable[[str], Visit], site: str) -> None:
    """The site's root sends the reader to the first page of the TOC (screenshot: landing.png)."""
    assert visits("index").final_url == f"{site}{PAGES[0]}.html"
    assert (SCREENSHOTS / "landing.png").exists()


def test_chapter_math_screenshot(visits: Callable[[str], Visit], math_chapter: str) -> None:
    """The math chapter, scrolled to its first equation (screenshot: chapter_math.png)."""
    snapshot = visits(math_chapter).snapshot
    assert snapshot["math"] > 0 and not snapshot["unrendered"]
    assert (SCREENSHOTS / "chapter_math.png").exists()


def test_search_finds_attention(browser: Browser, site: str, html: Path) -> None:
    """search.html?q=attention lists results whose pages exist; screenshot search.png."""
    results = "#search-results ul.search li"

    def listed(tab: Any) -> list[dict[str, str]]:
        tab.wait_for_selector(results, timeout=20_000)
        return tab.locator(results).evaluate_all(
            "(items) => items.map((li) => ({text: li.innerText, href: li.querySelector('a').getAttribute('href')}))"
        )

    loaded = visit(browser, f"{site}search.html?q=attention", screenshot="search.png", before=listed)
    assert not loaded.errors and not loaded.failed and not loaded.external, loaded
    items = loaded.extra
    assert items, "searching for 'attention' listed nothing"
    assert any("attention" in item["text"].lower() for item in items), items[:3]
    for item in items:
        target = html / urlsplit(item["href"]).path
        assert target.is_file(), f"search result {item['href']} does not exist"


class _Anchors(HTMLParser):
    """The ids a page defines and the URLs it refers to (href and src)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.refs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"])
        if tag == "a" and values.get("name"):
            self.ids.add(values["name"])
        self.refs += [values[key] for key in ("href", "src") if values.get(key)]


@functools.cache
def _parse(path: Path) -> _Anchors:
    parser = _Anchors()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


@pytest.mark.parametrize("page", ALL_PAGES + EDITION_CHAPTERS)
def test_internal_links_resolve(html: Path, page: str) -> None:
    """Every link, image and script of the page that stays in the book names a file that exists,
    and its #fragment an id in that file."""
    base = "http://book.invalid/"
    problems = []
    for ref in _parse(html / f"{page}.html").refs:
        parts = urlsplit(urljoin(f"{base}{page}.html", ref))
        if parts.scheme not in ("http", "https") or parts.netloc != "book.invalid":
            continue  # another site, mailto:, javascript:, data:
        target = html / unquote(parts.path.lstrip("/"))
        if parts.path.endswith("/"):
            target = target / "index.html"
        if not target.is_file():
            problems.append(f"{ref}: no file {target.relative_to(html)}")
        elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in _parse(target).ids:
            problems.append(f"{ref}: no id {parts.fragment!r} in {target.relative_to(html)}")
    assert not problems, f"{page}.html has broken links:\n" + "\n".join(problems)


# --- Layout: what the page looks like at a laptop's and a phone's width -------------------


def _layout(page: Any) -> dict[str, Any]:
    return page.evaluate(LAYOUT)


def laptop(visits: Callable[[str], Visit], page: str) -> dict[str, Any]:
    """The page's LAYOUT at 1280 px (measured in its one load by ``visits``)."""
    return visits(page).extra["layout"]


@pytest.fixture(scope="module")
def phone(browser: Browser, site: str) -> Callable[[str], Visit]:
    """Each page's LAYOUT at 390 px, loaded as a phone loads it (a page resized from a laptop's
    width keeps the theme's sidebar), once each; the first chapters and the edition chapters
    are screenshot."""

    @functools.cache
    def load(page: str) -> Visit:
        shown = page in CHAPTERS[:3] or page in EDITION_CHAPTERS
        shot = f"phone_{page.replace('/', '_')}.png" if shown else None
        return visit(browser, f"{site}{page}.html", before=_layout, viewport=PHONE, screenshot=shot)

    return load


@pytest.mark.parametrize("page", PAGES + EDITION_CHAPTERS)
def test_code_blocks_fit_the_column(visits: Callable[[str], Visit], page: str) -> None:
    layout = laptop(visits, page)
    allowed = int(MAX_SCROLLING_SHARE * layout["blocks"])
    assert layout["scrolling"] <= allowed, (
        f"{page}.html: {layout['scrolling']} of {layout['blocks']} code blocks scroll sideways at 1280 px "
        f"(at most {allowed})"
    )


@pytest.mark.parametrize("page", PAGES + EDITION_CHAPTERS)
def test_display_equations_fit_the_column(visits: Callable[[str], Visit], page: str) -> None:
    overflowing = laptop(visits, page)["overflowing"]
    assert not overflowing, f"{page}.html: display equations wider than the column: {overflowing}"


# The pages with a figure are loaded at 390 px, and checked so, by test_browser_explorer.py.
@pytest.mark.parametrize("page", [page for page in PAGES + EDITION_CHAPTERS if page not in EXPLORED])
def test_page_does_not_scroll_sideways_on_a_phone(phone: Callable[[str], Visit], page: str) -> None:
    assert not phone(page).extra["page_scrolls"], f"{page}.html scrolls sideways at 390 px"


@pytest.mark.parametrize("page", CHAPTERS + EDITION_CHAPTERS)
def test_title_comes_before_any_cell(visits: Callable[[str], Visit], page: str) -> None:
    assert laptop(visits, page)["title_first"], f"{page}.html shows a code cell above its title"


@pytest.mark.parametrize("page", CHAPTERS + EDITION_CHAPTERS)
def test_figures_have_alt_text_and_are_not_shrunk(visits: Callable[[str], Visit], page: str) -> None:
    images = laptop(visits, page)["images"]
    noisy = [image["src"] for image in images if not image["alt"] or any(n in image["alt"] for n in NOISE_ALT)]
    assert not noisy, f"{page}.html: images whose alt text is a file name or empty: {noisy}"
    shrunk = [f"{image['src']} at {image['scale']:.0%}" for image in images if image["scale"] < MIN_FIGURE_SCALE]
    assert not shrunk, f"{page}.html: figures shown below {MIN_FIGURE_SCALE:.0%} of their size: {shrunk}"


# --- Accessibility: axe-core (WCAG 2.1 A and AA) over every page ---------------------------

# Violations that come from the theme or from Sphinx, not from the course's pages: (rule id,
# a fragment of the offending node's selector or markup). Each appears on every page, the
# ones with no course content included, and none can be changed from the book's sources.
THEME_VIOLATIONS: set[tuple[str, str]] = {
    # pydata-sphinx-theme 0.16: the search buttons are named "Search" but show "Search Ctrl+K",
    # and the colour-mode button's name "Color mode" is not its visible text.
    ("label-content-name-mismatch", "search-button__button"),
    ("label-content-name-mismatch", "theme-switch-button"),
    # Sphinx 7.4's HTML writer marks up a bibliography as role="list" with children of the
    # deprecated DPUB role "doc-biblioentry" (the references page only).
    ("aria-deprecated-role", 'role="doc-biblioentry"'),
    ("aria-required-children", "citation-list"),
}


def _from_theme(violation: str) -> bool:
    """Whether an axe line (``rule (impact): target  html``) is one of the theme's known violations."""
    return any(violation.startswith(f"{rule} (") and fragment in violation for rule, fragment in THEME_VIOLATIONS)


@pytest.mark.parametrize("page", PAGES + EDITION_CHAPTERS)
def test_accessibility(visits: Callable[[str], Visit], page: str) -> None:
    ours = [violation for violation in visits(page).extra["axe"] if not _from_theme(violation)]
    assert not ours, f"{page}.html has accessibility violations (WCAG 2.1 A/AA):\n" + "\n".join(ours[:15])


# --- The Korean and Chinese editions ---------------------------------------------------------

HANGUL_OR_HAN = "[\\u1100-\\u11ff\\u3130-\\u318f\\uac00-\\ud7af\\u4e00-\\u9fff]"
# The fonts Chromium drew an element's text with (DevTools' CSS.getPlatformFontsForNode).
_FONT_TARGETS = ("article h1", "article section p")


def _fonts(page: Any) -> dict[str, list[dict[str, Any]]]:
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument", {"depth": 0})["root"]["nodeId"]
    found = {}
    for selector in _FONT_TARGETS:
        node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
        text = page.locator(selector).first.inner_text()
        fonts = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
        found[selector] = [{"family": f["familyName"], "glyphs": f["glyphCount"], "text": text[:40]} for f in fonts]
    return found


@pytest.mark.parametrize("page", EDITION_CHAPTERS)
def test_edition_text_renders_in_a_cjk_font(browser: Browser, site: str, page: str) -> None:
    """The title and a paragraph are drawn with the edition's CJK font, not as empty boxes.

    A glyph no installed font has is drawn from a fallback as an empty box; the fonts Chromium
    reports for the text must include the Noto CJK face of the edition's language (the Korean
    or the simplified-Chinese one, which the stylesheet asks for by language)."""
    fonts = visit(browser, f"{site}{page}.html", before=_fonts).extra
    want = CJK_FONT[page.split("/")[0]]
    for selector, used in fonts.items():
        families = {f["family"]: f["glyphs"] for f in used}
        assert families.get(want, 0) > 0, (
            f"{page}.html: {selector} ({used[0]['text'] if used else ''!r}) is drawn with {families}, not {want}"
        )


@pytest.mark.parametrize("page", EDITION_CHAPTERS)
def test_edition_page_is_translated_and_links_the_other_editions(
    visits: Callable[[str], Visit], browser: Browser, site: str, page: str
) -> None:
    """Its title and figure descriptions are in its language, and it links the same page in
    English and in the other translation."""

    def read(tab: Any) -> dict[str, Any]:
        return tab.evaluate(
            """() => ({
                title: document.querySelector("article h1").innerText,
                lang: document.documentElement.lang,
                editions: [...document.querySelectorAll("nav.vitlab-editions a")].map((a) => a.href),
            })"""
        )

    seen = visit(browser, f"{site}{page}.html", before=read).extra
    edition, chapter = page.split("/", 1)
    assert re.search(HANGUL_OR_HAN, seen["title"]), f"{page}.html's title is not translated: {seen['title']!r}"
    assert seen["lang"] == {"ko": "ko", "zh": "zh-CN"}[edition]
    other = "zh" if edition == "ko" else "ko"
    assert sorted(seen["editions"]) == sorted([f"{site}{chapter}.html", f"{site}{other}/{chapter}.html"])
    alts = [image["alt"] for image in laptop(visits, page)["images"]]
    assert alts and all(re.search(HANGUL_OR_HAN, alt) for alt in alts), f"{page}.html: untranslated alt texts {alts}"


@pytest.mark.parametrize(("edition", "term"), [("ko", "어텐션"), ("zh", "注意力")])
def test_edition_search_finds_a_term_in_its_language(
    browser: Browser, site: str, html: Path, edition: str, term: str
) -> None:
    """Each edition has its own search index: a Korean (Chinese) word finds its pages there."""
    results = "#search-results ul.search li"

    def listed(tab: Any) -> list[str]:
        tab.wait_for_selector(results, timeout=20_000)
        return tab.locator(results).evaluate_all(
            "(items) => items.map((li) => li.querySelector('a').getAttribute('href'))"
        )

    loaded = visit(browser, f"{site}{edition}/search.html?q={term}", screenshot=f"search_{edition}.png", before=listed)
    assert not loaded.errors and not loaded.failed and not loaded.external, loaded
    hrefs = loaded.extra
    assert len(hrefs) >= 3, f"searching the {edition} edition for {term!r} listed {hrefs}"
    for href in hrefs:
        assert (html / edition / urlsplit(href).path).is_file(), (
            f"search result {href} is not a page of the {edition} edition"
        )
