"""The attention explorers of the built book, used in a real browser, offline.

Each chapter's explorer (vitlab.explorer; drawn by Vega from the book's own files,
book/_ext/vega_figures.py and book/_static/vitlab_vega.js) is opened in Debian's Chromium at a
laptop's width in every edition and chapter that has one, and at a phone's width in English and
in the first chapter of the translated editions (test_browser.py checks every other page at a
phone's width). The reader points at one patch with the mouse (a tap on the phone) and at others
with the keyboard (the slider's arrow keys), and picks a head from its menu with the keyboard;
each time, the chart must show that token's row of the attention map: read from the Vega
view's own state (window.vitlabViews, the scene graph's items), compared with the rows in the
figure's data, not from pixels. The figure must also be axe-clean (WCAG 2.1 A/AA), log no
error, ask no other host for anything, keep its text alternative, fit a phone's width, and in
the translated editions label its controls in the page's language. Screenshots of each figure
are saved in _build/screenshots/explorer/ (look at them after a change to the figures).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from book_browser import FIGURES, FIRST_EXPLORER, SCREENSHOTS, axe, is_local

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytest_plugins = ["book_build"]  # the book, built once (`html`); `site` serves it, `browser` opens it
pytestmark = pytest.mark.slow

WIDTHS = {"laptop": {"width": 1280, "height": 900}, "phone": {"width": 390, "height": 844}}  # in this order
CJK = re.compile("[\\u1100-\\u11ff\\u3130-\\u318f\\uac00-\\ud7af\\u4e00-\\u9fff]")
ENGLISH = re.compile(r"^[A-Za-z][A-Za-z -]*[a-z]$")  # a menu option's part in English words (not a path, not a number)
KEPT = {"zh": {"talking heads"}}  # the Chinese edition keeps this term in English, as its text does
CHAPTERS = {page: figures for page, (figures, _) in FIGURES.items() if figures}
# Every chapter in every edition; at a phone's width every chapter in English and the first
# with an explorer in Korean and Chinese (book_browser's EXPLORED). axe-core (about 2 s a page)
# runs on the figures of that chapter in each edition: the others are the same markup with
# other data, and test_browser.py runs it over every whole page.
FIRST = FIRST_EXPLORER
CASES = [(edition, page) for edition in ("en", "ko", "zh") for page in CHAPTERS]


# The state of figure `index`: its controls' signals, the slider, and the items the "keys"
# mark draws (one per key of the row shown: its datum is that row's l, h, q and one value v).
STATE = """async (index) => {
    const view = await window.vitlabViews[index];
    await view.runAsync();
    const marks = [];
    const walk = (node) => {
        if (node.marktype && node.name) marks.push(node);
        (node.items || []).forEach((item) => (item.items || []).forEach(walk));
    };
    walk(view.scenegraph().root);
    const keys = marks.find((m) => m.name === "keys_marks");
    const box = document.querySelectorAll("div.vitlab-vega")[index];
    const slider = box.querySelector("input[type=range]");
    return {
        patch: view.signal("patch_p"), layer: view.signal("layer"), head: view.signal("head"),
        slider: Number(slider.value), patches: Number(slider.max) + 1,
        shown: keys.items.map((i) => ({l: i.datum.l, h: i.datum.h, n: i.datum.n, q: i.datum.q, k: i.datum.k,
                                      v: i.datum.v, qs: i.datum.qs, qe: i.datum.qe})),
    };
}"""

# The attention rows of figure `index`, from the spec in the page (its datasets or inline data).
ROWS = """(index) => {
    const box = document.querySelectorAll("div.vitlab-vega")[index];
    const spec = JSON.parse(box.querySelector('script[type="application/json"]').textContent);
    const found = [];
    const walk = (node) => {
        if (Array.isArray(node)) {
            const first = node.length ? node[0] : null;
            if (first && typeof first === "object" && "q" in first && "v" in first) found.push(...node);
            else node.forEach(walk);
        } else if (node && typeof node === "object") Object.values(node).forEach(walk);
    };
    walk(spec);
    return found.map((r) => ({key: [r.l, r.h, r.q].join(","), v: r.v}));
}"""

# The centre (page coordinates, scrolled into view) of the patch `p` a reader can click.
PATCH = """([index, p]) => {
    const box = document.querySelectorAll("div.vitlab-vega")[index];
    const group = box.querySelector("svg g.role-mark[class*='patches']");
    const view = window.vitlabViewsResolved[index];
    const marks = [];
    const walk = (node) => {
        if (node.marktype && node.name) marks.push(node);
        (node.items || []).forEach((item) => (item.items || []).forEach(walk));
    };
    walk(view.scenegraph().root);
    const mark = marks.find((m) => /^patches.*_marks$/.test(m.name));
    const at = mark.items.findIndex((item) => item.datum.p === p);
    const shape = group.children[at];
    shape.scrollIntoView({block: "center"});
    const r = shape.getBoundingClientRect();
    const x = r.left + r.width / 2, y = r.top + r.height / 2;
    const on = document.elementFromPoint(x, y);
    return {x, y, covered: box.contains(on) ? null : (on ? on.outerHTML.slice(0, 120) : "nothing")};
}"""

# What a reader without sight or without the chart gets, and whether it fits the column.
LOOK = """(index) => {
    const box = document.querySelectorAll("div.vitlab-vega")[index];
    const chart = box.querySelector("[role=graphics-document]");
    const svg = box.querySelector("svg").getBoundingClientRect();
    const column = box.closest("article, main, body").getBoundingClientRect();
    return {
        still: box.querySelectorAll("img").length,
        label: chart ? chart.getAttribute("aria-label") : null,
        labels: [...box.querySelectorAll(".vega-bind-name")].map((e) => e.textContent),
        options: [...box.querySelectorAll("select option")].map((e) => e.textContent),
        titles: [...box.querySelectorAll("svg .role-title-text")].map((e) => e.textContent),
        fits: svg.right <= column.right + 1 && svg.left >= column.left - 1,
        page_scrolls: document.documentElement.scrollWidth > window.innerWidth + 1,
    };
}"""


def token_row(p: int, side: int, qs: int, qe: int) -> int:
    """The query token whose patch covers patch ``p`` of the figure's ``side`` x ``side`` grid,
    in a layer whose queries are ``qe`` extra tokens then a ``qs`` x ``qs`` grid (p = -1, -2: the first
    and second extra token, [cls] and DeiT's [dist]). A layer with a single query (class-attention) always shows it."""
    if qs * qs + qe == 1:
        return 0
    if p < 0:  # -1: [cls], -2: DeiT's distillation token
        return -p - 1 if -p <= qe else -1
    r, c = divmod(p, side)
    return qe + (r * qs // side) * qs + c * qs // side


def check_row(state: dict[str, Any], rows: dict[str, list[float]], p: int, how: str) -> None:
    """The chart shows the row of the token at patch ``p``, for the chosen layer and head."""
    assert state["patch"] == p, f"{how}: the figure's patch is {state['patch']}, not {p}"
    assert state["slider"] == p, f"{how}: the slider shows {state['slider']}, not patch {p}"
    shown = sorted(state["shown"], key=lambda item: item["k"])
    assert shown, f"{how}: patch {p} shows no attention"
    first = shown[0]
    side = math.isqrt(state["patches"])
    q = token_row(p, side, first["qs"], first["qe"])
    assert {(i["l"], i["h"], i["q"]) for i in shown} == {(state["layer"], first["h"], q)}, (
        f"{how}: patch {p} shows rows {sorted({(i['l'], i['h'], i['q']) for i in shown})}, "
        f"not layer {state['layer']}'s query {q}"
    )
    assert first["h"] == state["head"] or first["n"] == 1, f"{how}: head {first['h']} shown, {state['head']} chosen"
    assert [i["v"] for i in shown] == rows[f"{state['layer']},{first['h']},{q}"], (
        f"{how}: the values shown for patch {p} are not row {q} of the attention map"
    )


def open_page(
    browser: Browser, url: str, width: str = "laptop", problems: dict[str, list[str]] | None = None
) -> tuple[Any, Page, dict[str, list[str]]]:
    """A fresh context (a touch screen as well as a mouse), the page loaded at ``width`` with its
    figures drawn, and what goes wrong on it (errors, failed loads, other hosts; added to
    ``problems`` when given)."""
    problems = problems if problems is not None else {"errors": [], "external": [], "failed": []}
    context = browser.new_context(viewport=WIDTHS[width], has_touch=True)

    def block(route: Any) -> None:
        problems["external"].append(route.request.url)
        route.abort()

    context.route(lambda url: not is_local(url), block)
    page = context.new_page()
    page.on("console", lambda m: m.type == "error" and problems["errors"].append(f"console: {m.text}"))
    page.on("pageerror", lambda error: problems["errors"].append(f"uncaught: {error}"))
    page.on("requestfailed", lambda r: is_local(r.url) and problems["failed"].append(f"{r.url}: {r.failure}"))
    page.on("response", lambda r: r.status >= 400 and problems["failed"].append(f"{r.url}: HTTP {r.status}"))
    page.goto(url, wait_until="load")
    page.evaluate("async () => { window.vitlabViewsResolved = await Promise.all(window.vitlabViews || []); }")
    return context, page, problems


def point_and_press(page: Page, index: int, width: str) -> None:
    """Explorer ``index``: a patch by the mouse (a tap on the phone), others by the keyboard."""
    rows = {row["key"]: row["v"] for row in page.evaluate(ROWS, index)}
    side = math.isqrt(page.evaluate(STATE, index)["patches"])
    # The laptop's mouse: row 1, column 1 (one before the last on a 2 x 2 grid), so that the arrow
    # keys have a patch on either side; the phone's tap: the first patch (the keys left 1).
    clicked = min(side + 1, side * side - 2) if width == "laptop" else 0
    point = page.evaluate(PATCH, [index, clicked])
    assert point["covered"] is None, f"{width}: patch {clicked} is under {point['covered']}"
    if width == "phone":
        page.touchscreen.tap(point["x"], point["y"])
    else:
        page.mouse.click(point["x"], point["y"])
    check_row(page.evaluate(STATE, index), rows, clicked, f"{width}: a {'tap' if width == 'phone' else 'click'}")
    if width == "phone":
        return
    # Tab reaches the slider (Shift+Tab from the next control), its arrow keys move the patch.
    box = page.locator("div.vitlab-vega").nth(index)
    slider = box.locator("input[type=range]")
    slider.focus()
    page.keyboard.press("Tab")
    page.keyboard.press("Shift+Tab")
    assert slider.evaluate("(e) => e === document.activeElement"), "Shift+Tab does not come back to the slider"
    page.keyboard.press("ArrowRight")
    check_row(page.evaluate(STATE, index), rows, clicked + 1, "ArrowRight")
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("ArrowLeft")
    check_row(page.evaluate(STATE, index), rows, clicked - 1, "ArrowLeft twice")
    # A menu, by the keyboard: the head after the current one (the mean is first).
    heads = box.locator("select[name=head]")
    if heads.locator("option").count() > 1:
        before = page.evaluate(STATE, index)["head"]
        heads.focus()
        page.keyboard.press("ArrowDown")
        after = page.evaluate(STATE, index)
        assert after["head"] != before, "ArrowDown on the head menu did not change the head"
        check_row(after, rows, clicked - 1, "the head menu")
    if slider.get_attribute("min") == "-2":  # DeiT's distillation token is the patch -2
        slider.focus()
        page.keyboard.press("Home")
        check_row(page.evaluate(STATE, index), rows, -2, "Home: the distillation token")


def step(page: Page, index: int) -> None:
    """Another figure (the shape stepper): ArrowRight on its slider, then its next and previous
    buttons (by the keyboard too), each move its step by one; the marked row follows."""
    box = page.locator("div.vitlab-vega").nth(index)
    slider = box.locator("input[type=range]").first
    name, start = slider.get_attribute("name"), float(slider.input_value())
    previous, following = box.locator(".vitlab-step-buttons button").all()

    def now() -> tuple[float, float]:
        """The slider's signal, and the step the chart marks (its selection's stored row)."""
        return tuple(page.evaluate(
            "async ([i, n]) => { const v = window.vitlabViewsResolved[i]; await v.runAsync(); "
            "return [v.signal(n), v.data('step_store')[0].values[0]]; }", [index, name]))  # fmt: skip

    slider.focus()
    page.keyboard.press("ArrowRight")
    assert now() == (start + 1, start + 1), f"ArrowRight: {name} from {start} to {now()}"
    following.click()
    assert now() == (start + 2, start + 2), f"the next button: {name} from {start} to {now()}"
    previous.focus()
    page.keyboard.press("Enter")
    assert now() == (start + 1, start + 1), f"the previous button, by the keyboard: {name} at {now()}"
    assert float(slider.input_value()) == start + 1, "the slider did not follow the buttons"


@pytest.mark.parametrize(("edition", "chapter"), CASES)
def test_explorer(browser: Browser, site: str, edition: str, chapter: str) -> None:
    """At 1280 px, then (CASES' comment) at 390 px (the page loaded again, as a phone loads it: a
    page resized from a laptop's width keeps the theme's sidebar over the figure): point, press,
    look; axe once."""
    folder = "" if edition == "en" else f"{edition}/"
    url = f"{site}{folder}{chapter}.html"
    context, page, problems = open_page(browser, url)
    try:
        count = page.evaluate("() => window.vitlabViewsResolved.length")
        assert count == CHAPTERS[chapter], f"{chapter}: {count} live figures, its notebook has {CHAPTERS[chapter]}"
        explorers = page.evaluate("() => window.vitlabViewsResolved.map((v) => 'patch_p' in v.getState().signals)")
        violations = axe(page, "div.vitlab-vega") if chapter == FIRST else []
        assert not violations, "the figures have accessibility violations:\n" + "\n".join(violations)
        for width in WIDTHS if edition == "en" or chapter == FIRST else ["laptop"]:
            if width != "laptop":
                context.close()
                context, page, problems = open_page(browser, url, width, problems)
            for index in range(count):
                if explorers[index]:
                    point_and_press(page, index, width)
                elif width == "laptop":
                    step(page, index)
                look = page.evaluate(LOOK, index)
                assert look["still"] == 0, "the still image is still shown beside the live chart"
                assert look["label"], "the live chart has no text alternative (its aria-label)"
                assert look["fits"] and not look["page_scrolls"], f"the figure is wider than the page at {width}"
                if edition != "en":
                    untranslated = [t for t in look["labels"] + look["titles"] if not CJK.search(t)]
                    parts = {part.strip() for option in look["options"] for part in re.split(r" · |, |\(|\)", option)}
                    untranslated += sorted(p for p in parts if ENGLISH.match(p) and p not in KEPT.get(edition, ()))
                    assert not untranslated, f"labels not in the page's language: {untranslated}"
                page.locator("div.vitlab-vega").nth(index).scroll_into_view_if_needed()
                (SCREENSHOTS / "explorer").mkdir(parents=True, exist_ok=True)
                name = f"{edition}_{chapter.split('/')[-1]}_{index}_{width}.png"
                page.screenshot(path=SCREENSHOTS / "explorer" / name)
    finally:
        context.close()
    assert not problems["errors"], "\n".join(problems["errors"])
    assert not problems["failed"], "\n".join(problems["failed"])
    assert not problems["external"], "requests to other hosts:\n" + "\n".join(problems["external"])


@pytest.mark.parametrize("edition", ["en", "ko", "zh"])
def test_without_javascript_the_still_and_its_alt_text(browser: Browser, site: str, edition: str) -> None:
    """A reader without JavaScript gets each figure's still image and its text alternative."""
    folder = "" if edition == "en" else f"{edition}/"
    context = browser.new_context(viewport=WIDTHS["phone"], java_script_enabled=False)
    try:
        page = context.new_page()
        page.goto(f"{site}{folder}{FIRST}.html", wait_until="load")
        stills = page.locator("div.vitlab-vega img")
        stills.last.scroll_into_view_if_needed()
        page.wait_for_function("() => [...document.querySelectorAll('div.vitlab-vega img')].every((i) => i.complete)")
        seen = stills.evaluate_all(
            """(images) => images.map((i) => ({alt: i.alt, width: i.naturalWidth, shown: i.clientWidth,
                                                column: i.closest("article").clientWidth}))"""
        )
    finally:
        context.close()
    assert len(seen) == CHAPTERS[FIRST], f"{FIRST}: {len(seen)} stills for {CHAPTERS[FIRST]} figures"
    for image in seen:
        assert image["width"] > 0 and image["alt"].strip(), f"a still that did not load, or has no alt text: {image}"
        assert image["shown"] <= image["column"], f"a still wider than a phone's column: {image}"


def test_every_page_with_a_figure_is_tested(html: Path) -> None:
    """A figure the book shows, wherever it is, is one of the cases above (found from the notebooks)."""
    pages = {
        str(path.relative_to(html).with_suffix(""))
        for path in html.glob("**/*.html")
        if 'class="vitlab-vega"' in path.read_text(encoding="utf-8") and not path.is_relative_to(html / "_sources")
    }
    english = {page for page in pages if not page.startswith(("ko/", "zh/"))}
    assert english == set(CHAPTERS), f"pages with figures {sorted(english)}, tested {sorted(CHAPTERS)}"
