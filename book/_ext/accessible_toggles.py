"""Sphinx extension: hidden-cell toggles whose accessible name is the text they show.

myst-nb 1.x writes ``<summary aria-label="Toggle hidden content">`` above a hidden cell
while the summary shows "Show the solution": the name a screen reader announces differs
from the visible label (WCAG 2.5.3, axe's ``label-content-name-mismatch``), and a voice
user saying "show the solution" cannot activate it. This writes the same markup without
the ``aria-label``, so the visible prompt is the name. Loaded from _config.yml
(``sphinx: local_extensions``).
"""

from __future__ import annotations

from html import escape
from typing import Any

from myst_nb.sphinx_ import HideCodeCellNode, depart_HideCellInput
from sphinx.application import Sphinx


def visit_hide_cell_input(self: Any, node: HideCodeCellNode) -> None:
    classes = " ".join(node["classes"])
    self.body.append(f'<details class="admonition hide {classes}">\n')
    self.body.append("<summary>\n")
    self.body.append(f'<p class="collapsed admonition-title">{escape(node["prompt_show"])}</p>\n')
    self.body.append(f'<p class="expanded admonition-title">{escape(node["prompt_hide"])}</p>\n')
    self.body.append("</summary>\n")


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_node(HideCodeCellNode, override=True, html=(visit_hide_cell_input, depart_HideCellInput))
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
