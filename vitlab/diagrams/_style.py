"""The book's visual language for architecture figures, on top of Graphviz.

Graphviz lays the graph out itself and ships with Colab; a figure is a PNG cell output.
One kind of block has one fill colour (tints of the colour-blind-safe Okabe-Ito palette)
and one shape in every chapter; what a variant changes against ViT gets a thick double
border and a "new:" prefix. The background is opaque white (light and dark modes alike).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

FONT = "DejaVu Sans"  # on Debian, Colab and most Linux installs; Graphviz falls back otherwise
FONT_SIZE = 15  # points at 72 dpi = CSS pixels when shown at DISPLAY_SCALE
DPI = 144  # rendered at 2x for sharp text on high-density screens
DISPLAY_SCALE = DPI / 72  # a PNG pixel is 1 / DISPLAY_SCALE CSS pixels when shown
MAX_DISPLAY_WIDTH = 560  # CSS px: fits the book's column (620-790 px) unshrunk

# kind -> (fill colour, Graphviz shape). Tints of the Okabe-Ito palette.
KINDS: dict[str, tuple[str, str]] = {
    "data": ("#f2f2f2", "box"),  # an image or a tensor that enters or leaves
    "embed": ("#cde8f6", "box"),  # patch / conv embedding, tokens, position embeddings (sky blue)
    "attention": ("#fbe3b3", "box"),  # any attention (orange)
    "mlp": ("#bfe6da", "box"),  # MLP / feed-forward (bluish green)
    "norm": ("#faf5c0", "box"),  # LayerNorm / BatchNorm (yellow)
    "conv": ("#e9d3e2", "box"),  # convolutions and pooling inside the network (reddish purple)
    "head": ("#c2d9ec", "box"),  # classifier heads (blue)
    "op": ("#ffffff", "circle"),  # +, ×, concat, split
}
CHANGED_COLOR = "#d55e00"  # Okabe-Ito vermilion: what the variant changes against ViT
INK = "#1b1b1b"
MUTED = "#555555"


def shape_label(shape: Sequence[int], *, names: str | None = None) -> str:
    """A shape without its batch dimension, ``197 × 192``, then ``(names)`` if given."""
    text = " × ".join(str(int(s)) for s in shape)
    return f"{text} ({names})" if names else text


@dataclass
class Diagram:
    """A figure being drawn: blocks (nodes), arrows labelled with shapes, and groups.

    Every text drawn is kept in :attr:`texts`, so a test can check a figure's numbers.
    """

    title: str
    direction: str = "TB"  # "TB" (top to bottom) keeps figures narrow enough for a phone
    texts: list[str] = field(default_factory=list)
    _lines: list[str] = field(default_factory=list)
    _depth: int = 0
    _clusters: int = 0

    def _add(self, line: str) -> None:
        self._lines.append("  " * (self._depth + 1) + line)

    def block(
        self, name: str, label: str, *, kind: str, changed: bool = False, after: str | None = None, along: str = ""
    ) -> str:
        """A block of ``kind`` (a key of :data:`KINDS`), ``changed`` against ViT; returns ``name``.
        With ``after``, an arrow from ``after`` to it follows, labelled ``along``."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
        fill, shape = KINDS[kind]
        if changed:
            label = f"new: {label}"
        self.texts.append(label)
        attrs = [f"label={_quote(label)}", f'fillcolor="{fill}"', f"shape={shape}"]
        if shape == "box":
            attrs.append('style="rounded,filled"')
        else:
            attrs += ['style="filled"', "width=0.45", "fixedsize=true"]
        if changed:
            attrs += [f'color="{CHANGED_COLOR}"', "penwidth=3", "peripheries=2"]
        self._add(f"{_quote(name)} [{', '.join(attrs)}];")
        if after is not None:
            self.arrow(after, name, along)
        return name

    def chain(self, *names: str) -> None:
        """Unlabelled arrows from each of ``names`` to the next."""
        for tail, head in zip(names, names[1:]):
            self.arrow(tail, head)

    def op(self, name: str, symbol: str) -> str:
        """A small circle with one symbol: ``+`` (residual add), ``×``, ``cat``."""
        self.texts.append(symbol)
        fill, _ = KINDS["op"]
        self._add(
            f"{_quote(name)} [label={_quote(symbol)}, shape=circle, style=filled, "
            f'fillcolor="{fill}", width=0.4, fixedsize=true];'
        )
        return name

    def note(self, name: str, label: str) -> str:
        """Plain text with no box (a caption inside the figure, e.g. a legend line)."""
        self.texts.append(label)
        self._add(f'{_quote(name)} [label={_quote(label)}, shape=plaintext, fontcolor="{MUTED}"];')
        return name

    def arrow(self, tail: str, head: str, label: str = "", *, dashed: bool = False, constraint: bool = True) -> None:
        """An arrow from ``tail`` to ``head``, labelled with the shape that travels on it."""
        attrs = []
        if label:
            self.texts.append(label)
            attrs.append(f"label={_quote(' ' + label + ' ')}")
        if dashed:
            attrs.append("style=dashed")
        if not constraint:
            attrs.append("constraint=false")
        self._add(f"{_quote(tail)} -> {_quote(head)}" + (f" [{', '.join(attrs)}]" if attrs else "") + ";")

    @contextmanager
    def group(self, label: str, *, changed: bool = False) -> Iterator[None]:
        """A framed group of blocks: a repeated block (``"× 12"``) or a stage."""
        self._clusters += 1
        self.texts.append(label)
        color = CHANGED_COLOR if changed else MUTED
        width = 2.5 if changed else 1.2
        self._add(f"subgraph cluster_{self._clusters} {{")
        self._depth += 1
        self._add(
            f'label={_quote(label)}; labeljust="l"; style="rounded,dashed"; '
            f'color="{color}"; penwidth={width}; fontcolor="{INK}";'
        )
        try:
            yield
        finally:
            self._depth -= 1
            self._add("}")

    @contextmanager
    def same_rank(self) -> Iterator[None]:
        """Blocks created inside are drawn side by side (e.g. two branches)."""
        self._add("{ rank=same;")
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            self._add("}")

    def source(self) -> str:
        """The Graphviz (DOT) source of the figure."""
        head = [
            "digraph G {",
            f'  graph [rankdir={self.direction}, bgcolor="white", pad=0.15, nodesep=0.3, ranksep=0.32, '
            f'fontname="{FONT}", fontsize={FONT_SIZE + 1}, label={_quote(self.title)}, labelloc=t, dpi={DPI}];',
            f'  node [fontname="{FONT}", fontsize={FONT_SIZE}, color="{INK}", fontcolor="{INK}", '
            'margin="0.14,0.06", height=0.35];',
            f'  edge [fontname="{FONT}", fontsize={FONT_SIZE - 1}, color="{MUTED}", fontcolor="{INK}", arrowsize=0.7];',
        ]
        return "\n".join(head + self._lines + ["}"])

    def png(self) -> bytes:
        """The figure as PNG bytes (needs Graphviz's ``dot`` program)."""
        import graphviz  # imported here: only the figures need it

        return graphviz.Source(self.source()).pipe(format="png")

    def show(self):  # -> IPython.display.Image
        """The figure as a notebook output, shown at :data:`DISPLAY_SCALE` (text at 15 px)."""
        from IPython.display import Image

        data = self.png()
        width = min(png_size(data)[0] / DISPLAY_SCALE, MAX_DISPLAY_WIDTH)
        return Image(data=data, format="png", width=int(round(width)))


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) in pixels, read from a PNG's header."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def numbers_in(texts: Sequence[str]) -> set[int]:
    """Every integer written on a figure (``"197 × 192"`` gives 197 and 192), for tests."""
    return {int(n.replace(",", "")) for text in texts for n in re.findall(r"\d[\d,]*", text)}


def _quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'
