"""Sphinx extension: the book's interactive figures (vitlab.explorer), drawn by Vega served offline.

A chapter's interactive figure is a notebook output with a Vega-Lite spec
(``application/vnd.vegalite.v5+json``) and its text alternative (``text/plain``, also the
spec's ``description``). myst-nb has no renderer for that type, so before it reads the
notebook this extension turns each such output into HTML: a ``div.vitlab-vega`` holding

* a still image of the figure, rendered here at build time with vl-convert (cached by the
  spec's hash in ``<source>/_build/vega_stills``, so the three editions render it once), whose
  alt text is the text alternative: what a reader without JavaScript gets;
* the spec, in a ``<script type="application/json">``.

On the pages that have one, it loads Vega, Vega-Lite and vega-embed (installed by npm,
versions pinned in package-lock.json) and book/_static/vitlab_vega.js, which draws the live
chart in place of the still; the three files are copied from node_modules into the build's
_static/vega/, so no page asks another host for anything. In the Korean and Chinese editions
the text alternative is translated through the page's catalogue (the gettext builder gets it
as an extra message, as book/_ext/translated_editions.py does for alt texts), and the
controls' labels by vitlab_vega.js. Loaded from _config.yml (``sphinx: local_extensions``).
"""

from __future__ import annotations

import hashlib
import html
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.builders.gettext import MessageCatalogBuilder, MsgOrigin
from sphinx.errors import ExtensionError
from sphinx.locale import init as init_locale
from sphinx.util.i18n import docname_to_domain
from sphinx.util.osutil import relative_uri

MIME = re.compile(r"application/vnd\.vegalite\.v\d+\+json")
SOURCE_MAP = re.compile(r"\n//# sourceMappingURL=\S+\s*$")
FILES = {"vega": "vega.min.js", "vega-lite": "vega-lite.min.js", "vega-embed": "vega-embed.min.js"}
STILL_SCALE = 2  # pixels per CSS pixel: sharp on a high-density screen


def vega_outputs(notebook: dict[str, Any]) -> list[tuple[dict[str, Any], str, str]]:
    """(output, its Vega-Lite MIME type, its text alternative) of each figure of a notebook."""
    found = []
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            mime = next((key for key in output.get("data", {}) if MIME.fullmatch(key)), None)
            if mime is not None:
                text = output["data"].get("text/plain", "")
                found.append((output, mime, "".join(text) if isinstance(text, list) else text))
    return found


def still(app: Sphinx, spec: dict[str, Any]) -> tuple[str, int]:
    """The still's file name in _images/ (written there) and its width in CSS pixels."""
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    name = f"vega-{hashlib.sha256(text.encode()).hexdigest()[:16]}.png"
    cache = Path(app.srcdir) / "_build" / "vega_stills" / name
    if not cache.exists():
        import vl_convert  # only where a page has a figure

        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_bytes(vl_convert.vegalite_to_png(spec, scale=STILL_SCALE))
    target = Path(app.outdir) / "_images" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(cache, target)
    width = int.from_bytes(cache.read_bytes()[16:20], "big")  # the PNG header's IHDR width
    return name, width // STILL_SCALE


def translator(app: Sphinx, docname: str) -> Callable[[str], str]:
    """The page's catalogue lookup in a translated edition, else the identity."""
    if not app.config.language or app.config.language == "en":
        return lambda text: text
    directories = [str(Path(app.srcdir, d)) for d in app.config.locale_dirs]
    domain = docname_to_domain(docname, app.config.gettext_compact)
    catalogue, found = init_locale(directories, app.config.language, domain)
    return (lambda text: catalogue.gettext(text) or text) if found else (lambda text: text)


def place_figures(app: Sphinx, docname: str, source: list[str]) -> None:
    """Before myst-nb reads a notebook: each figure's output becomes HTML (its still and spec).

    myst-nb renders every MIME type of an output while reading, and warns on one it has no
    renderer for, so the Vega-Lite one is replaced here, before it sees it."""
    if "application/vnd.vegalite" not in source[0]:
        return
    notebook = json.loads(source[0])
    say = translator(app, docname)
    for output, mime, text in vega_outputs(notebook):
        if app.builder.format != "html":  # the gettext builder, a LaTeX one: the text alternative
            output["data"] = {"text/plain": text}
            continue
        name, width = still(app, output["data"][mime])
        alt = say(text)
        spec = output["data"][mime] | {"description": alt}
        data = json.dumps(spec, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
        src = relative_uri(app.builder.get_target_uri(docname), f"_images/{name}")
        # Lazy: the script removes the still before a reader with JavaScript scrolls to it, so
        # only a reader without it downloads the still.
        img = f'<img src="{html.escape(src)}" alt="{html.escape(alt)}" width="{width}" loading="lazy">'
        output["data"] = {
            "text/html": f'<div class="vitlab-vega">{img}<script type="application/json">{data}</script></div>',
            "text/plain": alt,
        }
    source[0] = json.dumps(notebook, ensure_ascii=False)


def extract_texts(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """The gettext builder: each figure's text alternative is a message of its page."""
    path = Path(app.env.doc2path(docname))
    if not isinstance(app.builder, MessageCatalogBuilder) or path.suffix != ".ipynb":
        return
    domain = docname_to_domain(docname, app.config.gettext_compact)
    for _, _, text in vega_outputs(json.loads(path.read_text(encoding="utf-8"))):
        app.builder.catalogs[domain].add(text, MsgOrigin(str(path), 0))


def add_scripts(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    if 'class="vitlab-vega"' in context.get("body", ""):
        # Deferred scripts run in order once the page is parsed, so the figures exist by then.
        for name in FILES.values():
            app.add_js_file(f"vega/{name}", loading_method="defer")
        app.add_js_file("vitlab_vega.js", loading_method="defer")
        app.add_css_file("vitlab_vega.css")


def copy_vega(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    target = Path(app.outdir) / "_static" / "vega"
    target.mkdir(parents=True, exist_ok=True)
    for package, name in FILES.items():
        source = Path(app.srcdir) / "node_modules" / package
        if not (source / "build" / name).exists():
            raise ExtensionError(f"{source / 'build' / name} is missing: run `npm ci` (make mathjax does)")
        # Without its source-map comment: the map is not served, and a reader's developer tools
        # would log the missing file.
        text = (source / "build" / name).read_text(encoding="utf-8")
        (target / name).write_text(SOURCE_MAP.sub("", text), encoding="utf-8")
        shutil.copy(source / "LICENSE", target / f"{package}.LICENSE")


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("source-read", place_figures)
    app.connect("doctree-resolved", extract_texts)
    app.connect("html-page-context", add_scripts)
    app.connect("build-finished", copy_vega)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
