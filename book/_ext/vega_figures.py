"""Sphinx extension: serve Vega offline and load it on the pages with interactive figures.

A chapter's interactive figure (vitlab.explorer) is a still PNG plus its Vega-Lite spec in a
``div.vitlab-vega``. On the pages that have one, this adds Vega, Vega-Lite and vega-embed
(installed by npm, versions pinned in package-lock.json) and book/_static/vitlab_vega.js,
which draws the live chart in place of the still. The three files are copied from
node_modules into the build's _static/vega/, so no page asks another host for anything.
Loaded from _config.yml (``sphinx: local_extensions``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.errors import ExtensionError

FILES = {"vega": "vega.min.js", "vega-lite": "vega-lite.min.js", "vega-embed": "vega-embed.min.js"}


def add_scripts(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    if 'class="vitlab-vega"' in context.get("body", ""):
        for name in FILES.values():
            app.add_js_file(f"vega/{name}")
        app.add_js_file("vitlab_vega.js")


def copy_vega(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    target = Path(app.outdir) / "_static" / "vega"
    target.mkdir(parents=True, exist_ok=True)
    for package, name in FILES.items():
        source = Path(app.srcdir) / "node_modules" / package
        if not (source / "build" / name).exists():
            raise ExtensionError(f"{source / 'build' / name} is missing: run `npm ci` (make mathjax does)")
        shutil.copy(source / "build" / name, target / name)
        shutil.copy(source / "LICENSE", target / f"{package}.LICENSE")


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("html-page-context", add_scripts)
    app.connect("build-finished", copy_vega)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
