"""Draw book/_static/learning_path.svg, the learning-path diagram of the landing page.

Run it from anywhere after changing a chapter, its one-line summary, or _toc.yml:

    .venv/bin/python book/_scripts/make_learning_path.py

tests/test_landing.py fails when the committed SVG is not what this script draws.

The SVG is plain text, written here by hand rather than by matplotlib, so that it stays
small, its text is real text (crisp at any zoom, found by the browser's search) and each
box can be a link. The landing page includes it inline (```{raw} html``` with ``:file:``),
so the links are relative to book/intro.html. A chapter that is not in _toc.yml yet is
drawn dashed, marked "in preparation", and is not a link.

Lines are broken by hand below. ``overflowing_lines`` measures them with DejaVu Sans,
wider than the other fonts in ``FONT``, so they fit whichever font the reader's browser picks.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SVG_PATH = ROOT / "book" / "_static" / "learning_path.svg"
HREF_BASE = "../"  # the SVG is shown inline on book/intro.html
FONT = "'Segoe UI', Roboto, 'Helvetica Neue', Arial, 'Liberation Sans', 'DejaVu Sans', sans-serif"

# The book's text column is 620 to 790 px wide on a desktop: drawn 720 wide and shown
# between those widths, 13 px text stays between 11 and 14 px.
WIDTH = 720
MARGIN = 8
GAP = 8  # between the four columns of variants
PAD = 7  # inside a panel, and between a box's edge and its text
ARROW = 30  # room for an arrow between two boxes in a row
NAME_SIZE, TEXT_SIZE, HEAD_SIZE, SMALL_SIZE = 14, 13, 14, 12
LINE = 16  # distance between the baselines of two lines of 13 px text
INK, MUTED = "#1b1b1b", "#444444"


@dataclass(frozen=True)
class Chapter:
    number: int
    name: str
    change: tuple[str, ...]  # what it adds or changes, one string per line


@dataclass(frozen=True)
class Group:
    title: str
    subtitle: str
    colour: str  # Okabe-Ito colours: told apart with every common colour-vision deficiency
    tint: str  # the same hue, light, behind dark text
    chapters: tuple[Chapter, ...]


FOUNDATIONS = Group("Foundations", "read in order", "#666666", "#f1f1f1", (
    Chapter(1, "Patches", ("an image becomes a", "sequence of patch tokens")),
    Chapter(2, "Attention", ("multi-head self-attention,", "one tensor at a time")),
    Chapter(3, "The ViT encoder", ("pre-norm blocks, class token,", "position embeddings")),
))  # fmt: skip
VARIANTS = (
    Group("Training", "how it learns", "#E69F00", "#fcf0d5", (
        Chapter(4, "DeiT", ("a distillation token", "learns from a teacher")),
    )),
    Group("Depth", "going deeper", "#009E73", "#d5efe7", (
        Chapter(5, "DeepViT", ("re-attention: heads", "mix their attention", "maps")),
        Chapter(6, "CaiT", ("LayerScale, and", "class-attention at", "the end")),
    )),
    Group("Tokenization", "how tokens are made", "#CC79A7", "#f6e6ef", (
        Chapter(7, "T2T-ViT", ("soft split: overlapping", "neighbours merged", "step by step")),
        Chapter(11, "CvT", ("convolutional token", "embedding and q/k/v", "projections")),
    )),
    Group("Multi-scale", "a hierarchy of scales", "#0072B2", "#dcebf5", (
        Chapter(8, "CrossViT", ("two branches at two", "patch sizes, joined by", "cross-attention")),
        Chapter(9, "PiT", ("pooling between", "stages: fewer, wider", "tokens")),
        Chapter(10, "LeViT", ("conv stem, attention", "bias, shrink attention")),
    )),
)  # fmt: skip
CLOSING = Group("Putting it together", "after the variants", "#D55E00", "#f9e0d2", (
    Chapter(12, "Training a ViT", ("a tiny ViT trained on", "digits; attention rollout")),
    Chapter(13, "The family side by side", ("every variant compared", "on the same footing")),
))  # fmt: skip
HUB = ("ViT: the encoder every variant changes",
       "patch embedding  →  class token + positions  →  L × (attention + MLP)  →  head")  # fmt: skip
GROUPS = (FOUNDATIONS, *VARIANTS, CLOSING)
COL_W = (WIDTH - 2 * MARGIN - (len(VARIANTS) - 1) * GAP) / len(VARIANTS)
ROW_BOX_W = {  # the boxes of the two full-width rows
    FOUNDATIONS.title: (WIDTH - 2 * MARGIN - 2 * PAD - 2 * ARROW) / 3,
    CLOSING.title: (WIDTH - 2 * MARGIN - 2 * PAD - 2 * ARROW) / 2.5,
}


def chapter_pages(toc: list[str]) -> dict[int, str]:
    """Chapter number -> its page in the TOC, e.g. {4: "notebooks/04_deit"}."""
    pages = {}
    for page in toc:
        folder, _, stem = page.partition("/")
        if folder == "notebooks" and stem[:2].isdigit():
            pages[int(stem[:2])] = page
    return pages


def read_toc() -> list[str]:
    """Every ``file:`` of _toc.yml without suffix, like ``toc_files()`` in tests/test_repository.py."""
    import yaml

    def walk(node: object) -> list[str]:
        if isinstance(node, dict):
            return ([node["file"]] if "file" in node else []) + [f for v in node.values() for f in walk(v)]
        if isinstance(node, list):
            return [f for item in node for f in walk(item)]
        return []

    return [str(Path(f).with_suffix("")) for f in walk(yaml.safe_load((ROOT / "_toc.yml").read_text()))]


def box_height(chapter: Chapter) -> int:
    return PAD + NAME_SIZE + 4 + LINE * len(chapter.change) + PAD + 1  # + 1: room for descenders


def text(x: float, y: float, lines: tuple[str, ...] | list[str], size: int, **attrs: str) -> str:
    extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items())
    spans = "".join(
        f'<tspan x="{x:g}" dy="{0 if i == 0 else LINE}">{escape(line)}</tspan>' for i, line in enumerate(lines)
    )
    return f'<text x="{x:g}" y="{y:g}" font-size="{size}"{extra}>{spans}</text>'


def draw_box(chapter: Chapter, group: Group, x: float, y: float, w: float, pages: dict[int, str]) -> str:
    page = pages.get(chapter.number)
    h = box_height(chapter)
    dash = "" if page else ' stroke-dasharray="5 4"'
    change = chapter.change if page else (*chapter.change, "(in preparation)")
    h += 0 if page else LINE
    label = f"{chapter.number:02d} {chapter.name}"
    body = (
        f'<rect class="box" x="{x:g}" y="{y:g}" width="{w:g}" height="{h}" rx="6" fill="#ffffff" '
        f'stroke="{group.colour}" stroke-width="2"{dash}/>'
        + text(x + PAD, y + PAD + NAME_SIZE, [label], NAME_SIZE, font_weight="bold", fill=INK)
        + text(x + PAD, y + PAD + NAME_SIZE + 4 + LINE, change, TEXT_SIZE, fill=INK)
    )
    if not page:
        return f"<g>{body}</g>"
    title = f"Chapter {chapter.number}: {chapter.name}. Open the chapter."
    return f'<a href="{HREF_BASE}{page}.html"><title>{escape(title)}</title>{body}</a>'


def draw_panel(group: Group, x: float, y: float, w: float, h: float) -> str:
    """A tinted panel with a coloured bar on top, the group's title and subtitle."""
    return (
        f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="8" fill="{group.tint}"/>'
        f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="6" rx="3" fill="{group.colour}"/>'
        + text(x + PAD, y + 6 + PAD + HEAD_SIZE - 2, [group.title], HEAD_SIZE, font_weight="bold", fill=INK)
        + text(x + PAD, y + 6 + PAD + HEAD_SIZE + LINE - 2, [group.subtitle], SMALL_SIZE, fill=MUTED)
    )


def arrow(x1: float, y1: float, x2: float, y2: float, head: bool = True) -> str:
    end = ' marker-end="url(#lp-arrow)"' if head else ""
    return f'<line x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" stroke="{MUTED}" stroke-width="1.5"{end}/>'


def draw_row(group: Group, y: float, pages: dict[int, str], box_w: float) -> tuple[list[str], float]:
    """A full-width panel with its chapters side by side, left to right, arrows between them."""
    head = 6 + PAD + HEAD_SIZE + LINE + 4
    n = len(group.chapters)
    h = head + max(box_height(c) + (0 if c.number in pages else LINE) for c in group.chapters) + PAD
    parts = [draw_panel(group, MARGIN, y, WIDTH - 2 * MARGIN, h)]
    step = (WIDTH - 2 * MARGIN - 2 * PAD - box_w) / max(n - 1, 1)
    left = MARGIN + PAD if n > 1 else (WIDTH - box_w) / 2
    for i, chapter in enumerate(group.chapters):
        parts.append(draw_box(chapter, group, left + i * step, y + head, box_w, pages))
        if i:
            mid = y + head + box_height(chapter) / 2
            parts.append(arrow(left + (i - 1) * step + box_w + 2, mid, left + i * step - 3, mid))
    return parts, y + h


def render(toc: list[str]) -> str:
    """The SVG document, given the TOC's pages (``tests/test_repository.toc_files()``)."""
    pages = chapter_pages(toc)
    parts: list[str] = []
    y = MARGIN
    row, y = draw_row(FOUNDATIONS, y, pages, ROW_BOX_W[FOUNDATIONS.title])
    parts += row

    hub_w, hub_h = WIDTH - 2 * MARGIN - 2 * ARROW, 50
    parts.append(arrow(WIDTH / 2, y, WIDTH / 2, y + 22))
    y += 24
    parts.append(
        f'<rect x="{(WIDTH - hub_w) / 2:g}" y="{y:g}" width="{hub_w}" height="{hub_h}" rx="8" '
        f'fill="#ffffff" stroke="{INK}" stroke-width="2.5"/>'
        + text(WIDTH / 2, y + 21, [HUB[0]], HEAD_SIZE, font_weight="bold", fill=INK, text_anchor="middle")
        + text(WIDTH / 2, y + 21 + LINE + 2, [HUB[1]], SMALL_SIZE, fill=INK, text_anchor="middle")
    )
    y += hub_h

    col_w = COL_W
    centres = [MARGIN + i * (col_w + GAP) + col_w / 2 for i in range(len(VARIANTS))]
    bus = y + 14
    parts.append(arrow(WIDTH / 2, y, WIDTH / 2, bus, head=False))
    parts.append(arrow(centres[0], bus, centres[-1], bus, head=False))
    parts += [arrow(c, bus, c, bus + 14) for c in centres]
    y = bus + 16

    head = 6 + PAD + HEAD_SIZE + LINE + 4
    panel_h = head + max(sum(box_height(c) + PAD for c in g.chapters) for g in VARIANTS)
    for group, centre in zip(VARIANTS, centres):
        x = centre - col_w / 2
        parts.append(draw_panel(group, x, y, col_w, panel_h))
        top = y + head
        for chapter in group.chapters:
            parts.append(draw_box(chapter, group, x + PAD, top, col_w - 2 * PAD, pages))
            top += box_height(chapter) + PAD
    y += panel_h

    bus = y + 14
    parts += [arrow(c, y, c, bus, head=False) for c in centres]
    parts.append(arrow(centres[0], bus, centres[-1], bus, head=False))
    parts.append(arrow(WIDTH / 2, bus, WIDTH / 2, bus + 14))
    row, y = draw_row(CLOSING, bus + 16, pages, ROW_BOX_W[CLOSING.title])
    parts += row
    height = y + MARGIN

    everything = [c for g in GROUPS for c in g.chapters]
    desc = (
        "Chapters 1 to 3 (Foundations) build the ViT encoder in order: "
        + "; ".join(f"{c.number} {c.name}" for c in FOUNDATIONS.chapters)
        + ". Each variant then changes one part of ViT. "
        + " ".join(
            f"{g.title} ({g.subtitle}): "
            + "; ".join(
                f"{c.number} {c.name}, {' '.join(c.change)}" + ("" if c.number in pages else " (in preparation)")
                for c in g.chapters
            )
            + "."
            for g in (*VARIANTS, CLOSING)
        )
    )
    head_svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" id="vitlab-learning-path" viewBox="0 0 {WIDTH} {height:g}" '
        f'width="100%" style="max-width: 800px; height: auto" font-family="{FONT}" '
        f'aria-labelledby="lp-title lp-desc">\n'
        f'<title id="lp-title">The ViT Lab learning path: {len(everything)} chapters</title>\n'
        f'<desc id="lp-desc">{escape(desc)}</desc>\n'
        "<style>#vitlab-learning-path a { text-decoration: none; } "
        "#vitlab-learning-path a:hover .box, #vitlab-learning-path a:focus .box { stroke-width: 4; }</style>\n"
        '<defs><marker id="lp-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        f'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="{MUTED}"/></marker></defs>\n'
        f'<rect width="{WIDTH}" height="{height:g}" rx="10" fill="#ffffff"/>\n'
    )
    return head_svg + "\n".join(parts) + "\n</svg>\n"


def overflowing_lines() -> list[str]:
    """Lines of a chapter box that are wider than the box in DejaVu Sans (needs matplotlib)."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    measure = TextToPath()

    def width(s: str, size: int, bold: bool = False) -> float:
        font = FontProperties(family="DejaVu Sans", weight="bold" if bold else "normal", size=size)
        return measure.get_text_width_height_descent(s, font, ismath=False)[0]  # in font units = px

    col_w = COL_W
    problems = []
    if width(HUB[1], SMALL_SIZE) > WIDTH - 2 * MARGIN - 2 * ARROW - 2 * PAD:
        problems.append("the second line of the ViT box is too wide")
    for group in GROUPS:
        room = ROW_BOX_W.get(group.title, col_w - 2 * PAD) - 2 * PAD
        for c in group.chapters:
            lines = [(f"{c.number:02d} {c.name}", NAME_SIZE, True)] + [(s, TEXT_SIZE, False) for s in c.change]
            problems += [f"{s!r} is {width(s, z, b):.0f} px, the box has {room:.0f}" for s, z, b in lines
                         if width(s, z, b) > room]  # fmt: skip
        if width(group.title, HEAD_SIZE, True) > col_w - 2 * PAD or width(group.subtitle, SMALL_SIZE) > col_w - 2 * PAD:
            problems.append(f"the title or subtitle of {group.title!r} is wider than its panel")
    return problems


def main() -> None:
    problems = overflowing_lines()
    if problems:
        raise SystemExit("lines too long for their boxes:\n" + "\n".join(problems))
    SVG_PATH.write_text(render(read_toc()), encoding="utf-8")


if __name__ == "__main__":
    main()
