"""Sphinx extension: write each inline <script> of a page once.

Sphinx 7.4 registers a script added after the builder starts twice, once as file name None
and once as "" (``Sphinx.add_js_file`` and ``StandaloneHTMLBuilder.prepare_writing``), so
an extension's inline script appears twice in every page. sphinx-thebe's one declares
``const THEBE_JS_URL``, and the second copy throws "Identifier 'THEBE_JS_URL' has already
been declared" in the browser console (tests/test_browser.py fails on console errors).
Loaded from _config.yml (``sphinx: local_extensions``).
"""

from __future__ import annotations

from typing import Any

from sphinx.application import Sphinx


def drop_repeated_scripts(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    """Keep the first of every script that has the same file, priority and attributes."""
    scripts = context.get("script_files")
    if not isinstance(scripts, list):
        return
    seen: set[tuple] = set()
    unique = []
    for script in scripts:
        attributes = getattr(script, "attributes", {})
        key = (
            getattr(script, "filename", script) or "",
            getattr(script, "priority", 500),
            tuple(sorted((name, str(value)) for name, value in attributes.items())),
        )
        if key not in seen:
            seen.add(key)
            unique.append(script)
    scripts[:] = unique  # in place: the builder renders this very list after the event


def setup(app: Sphinx) -> dict[str, Any]:
    # After every other handler (sphinx.ext.mathjax adds its script at the default 500).
    app.connect("html-page-context", drop_repeated_scripts, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
