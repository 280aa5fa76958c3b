"""Sphinx extension: the English, Korean and Chinese editions of the book link to each other.

``book/_scripts/editions.py`` builds one edition per language from the same sources, English
at the site root and the others under ``ko/`` and ``zh/``, and loads this extension in each
with two settings:

``vitlab_edition``
    this build's edition code (``en``, ``ko`` or ``zh``);
``vitlab_editions``
    every edition as ``[code, folder, label, html_lang]``; the folder is ``""`` for the root.

It then does three things.

1. Every page starts with a small navigation that links the same page in the other
   editions (and ``<link rel="alternate" hreflang>`` tags in the head). Links are relative,
   so the site works from any host or folder.
2. Messages that Sphinx's gettext support misses are made translatable. myst-nb turns
   notebook outputs into images, and hidden cells into toggles, only after Sphinx's own
   translation step has run: the images' alt text and the toggles' prompts ("Show the
   solution") would stay English. The gettext builder gets them as extra messages, and a
   translated build looks them up in the page's catalogue. The same lookup translates the
   table of contents' part captions, which sphinx-external-toc adds after that step too.
3. Nothing, when ``vitlab_editions`` is empty (``make book``).
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from docutils import nodes
from myst_nb.sphinx_ import HideCodeCellNode
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.builders.gettext import MessageCatalogBuilder, MsgOrigin
from sphinx.locale import init as init_locale
from sphinx.util.i18n import docname_to_domain

NAV_LABEL = {"en": "Editions", "ko": "다른 언어판", "zh": "其他语言版本"}
HIDDEN_PROMPTS = ("prompt_show", "prompt_hide")


def _late_messages(doctree: nodes.document) -> list[tuple[nodes.Element, str, str]]:
    """(node, attribute, English text) for the alt texts and toggle prompts of a page."""
    found: list[tuple[nodes.Element, str, str]] = []
    for image in doctree.findall(nodes.image):
        if image.get("alt"):
            found.append((image, "alt", image["alt"]))
    # A hidden cell's prompts sit on its container until myst-nb's HTML post-transform wraps
    # it in a HideCodeCellNode (so the gettext builder sees only the containers). Prompts with
    # "{type}" are myst-nb's defaults, translated by the nb_code_prompt_* settings instead.
    toggles = [*doctree.findall(HideCodeCellNode), *doctree.findall(nodes.container)]
    for toggle in toggles:
        for attribute in HIDDEN_PROMPTS:
            text = toggle.get(attribute)
            if text and "{type}" not in text:
                found.append((toggle, attribute, text))
    return found


def notebook_figure_texts(source: Path) -> list[str]:
    """Every figure caption and alt text a notebook's cells declare (``mystnb`` metadata).

    A cell whose stored output is hidden offline (a ``%%needs_internet`` cell) has no image
    in the offline build, but ``make book-online`` shows one: its caption and alt text must
    be in the catalogues all the same."""
    if source.suffix != ".ipynb":
        return []
    texts = []
    for cell in json.loads(source.read_text(encoding="utf-8")).get("cells", []):
        settings = cell.get("metadata", {}).get("mystnb", {})
        if not isinstance(settings, dict):
            continue
        alt = settings.get("image", {}).get("alt")
        caption = settings.get("figure", {}).get("caption")
        if alt:
            texts.append(alt)
        if caption:
            texts.append(caption.replace("\n", " ").strip())  # as Sphinx extracts a paragraph
    return texts


def translate_late_messages(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    messages = _late_messages(doctree)
    if not messages:
        return
    domain = docname_to_domain(docname, app.config.gettext_compact)
    if isinstance(app.builder, MessageCatalogBuilder):
        source = Path(app.env.doc2path(docname))
        texts = [text for _node, _attribute, text in messages] + notebook_figure_texts(source)
        for text in texts:
            app.builder.catalogs[domain].add(text, MsgOrigin(str(source), 0))
        return
    _apply(app, domain, messages)


def _apply(app: Sphinx, domain: str, messages: list[tuple[nodes.Element, str, str]]) -> None:
    """Set each (node, attribute) to the translation of its text in the page's catalogue."""
    if not app.config.language or app.config.language == "en":
        return
    directories = [str(Path(app.srcdir, d)) for d in app.config.locale_dirs]
    catalogue, has_catalogue = init_locale(directories, app.config.language, domain)
    if not has_catalogue:
        return
    for node, attribute, text in messages:
        translated = catalogue.gettext(text)
        if translated:
            node[attribute] = translated


def translate_toc_captions(app: Sphinx, doctree: nodes.document) -> None:
    """The part captions of _toc.yml ("Foundations", "Variants") in the sidebar.

    sphinx-external-toc inserts the root page's toctrees when the page has been read, after
    Sphinx's translation step, so the captions (which the gettext builder does extract) would
    stay English."""
    messages: list[tuple[nodes.Element, str, str]] = []
    for toctree in doctree.findall(addnodes.toctree):
        if toctree.get("caption"):
            messages += [(toctree, "caption", toctree["caption"]), (toctree, "rawcaption", toctree["caption"])]
    if messages:
        _apply(app, docname_to_domain(app.env.docname, app.config.gettext_compact), messages)


def _site_root(pagename: str, folder: str) -> str:
    up = "../" * pagename.count("/")
    return up + ("../" if folder else "")


def edition_links(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    editions = app.config.vitlab_editions
    if not editions or doctree is None:
        return
    here = app.config.vitlab_edition
    folder = next(e[1] for e in editions if e[0] == here)
    root = _site_root(pagename, folder)
    items, alternates = [], []
    for code, target_folder, label, lang in editions:
        href = f"{root}{target_folder + '/' if target_folder else ''}{pagename}.html"
        alternates.append(f'<link rel="alternate" hreflang="{lang}" href="{escape(href)}" />')
        if code == here:
            items.append(f'<span class="vitlab-edition-current" aria-current="page" lang="{lang}">{label}</span>')
        else:
            items.append(f'<a href="{escape(href)}" hreflang="{lang}" lang="{lang}">{label}</a>')
    nav = (
        f'<nav class="vitlab-editions" aria-label="{NAV_LABEL.get(here, "Editions")}">'
        + '<span class="vitlab-editions-sep"> · </span>'.join(items)
        + "</nav>\n"
    )
    context["body"] = nav + context.get("body", "")
    context["metatags"] = context.get("metatags", "") + "\n".join(alternates) + "\n"


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_config_value("vitlab_edition", "en", "html")
    app.add_config_value("vitlab_editions", [], "html")
    app.connect("doctree-resolved", translate_late_messages)
    # after sphinx-external-toc's own doctree-read handler (priority 500) has inserted them
    app.connect("doctree-read", translate_toc_captions, priority=900)
    app.connect("html-page-context", edition_links)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
