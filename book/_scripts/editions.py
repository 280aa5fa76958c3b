"""Build the book in English, Korean and Chinese: one site, three editions (``make book-all``).

Jupyter Book 1.x has no language setting of its own, but it passes ``sphinx: config:`` from
its ``_config.yml`` straight to Sphinx, and Sphinx translates a page while reading it when
``language`` is set and ``locale_dirs`` holds ``.po`` catalogues for it. So each edition is
the same ``jupyter-book build`` as ``make book`` (same extensions, same ``-W -n``), run with a
generated copy of ``_config.yml`` that adds:

* ``language`` (``ko`` or ``zh_CN``), ``locale_dirs: [book/locales]`` and
  ``gettext_compact: false`` (one catalogue per page, as ``make translations`` writes them);
* the ``translated_editions`` extension (``book/_ext/translated_editions.py``): the links between editions, and
  the alt texts and hidden-cell prompts that myst-nb creates after Sphinx's translation step.

The generated configurations go to ``_build/editions/``; the English edition is written to
``<out>/_build/html`` and the others to ``<out>/_build/html/ko`` and ``.../zh``. Sphinx's
search index is per build, so each edition searches its own language (Chinese words are
segmented with jieba, which Sphinx uses when it is installed).

Usage::

    python book/_scripts/editions.py                  # all three into _build/html
    python book/_scripts/editions.py --only ko        # one translated edition (quicker)
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXTENSIONS = Path(__file__).resolve().parents[1] / "_ext"  # book/_ext, where translated_editions.py lives


@dataclass(frozen=True)
class Edition:
    code: str  # the edition's name here and in vitlab_edition
    language: str  # Sphinx's language setting
    folder: str  # where it lives in the site ("" is the root)
    label: str  # its name in its own language
    html_lang: str  # the <html lang> value Sphinx writes for it


EDITIONS = (
    Edition("en", "en", "", "English", "en"),
    Edition("ko", "ko", "ko", "한국어", "ko"),
    Edition("zh", "zh_CN", "zh", "中文", "zh-CN"),
)
BY_CODE = {e.code: e for e in EDITIONS}

# What myst-nb prints on a hidden code cell that sets no prompt of its own.
CODE_PROMPTS = {
    "ko": ("코드 셀 {type} 보기", "코드 셀 {type} 숨기기"),
    "zh": ("显示代码单元{type}", "隐藏代码单元{type}"),
}


class BuildError(RuntimeError):
    pass


def write_config(source: Path, edition: Edition | None, *, extract: bool = False) -> Path:
    """A copy of ``source/_config.yml`` set up for one edition (None: English)."""
    config: dict[str, Any] = yaml.safe_load((source / "_config.yml").read_text(encoding="utf-8"))
    sphinx = config.setdefault("sphinx", {})
    # jupyter-book resolves local extensions against the configuration file's folder.
    extensions = {name: str((source / path).resolve()) for name, path in sphinx.get("local_extensions", {}).items()}
    extensions["translated_editions"] = str(EXTENSIONS)  # this checkout's, whatever book is built
    sphinx["local_extensions"] = extensions
    settings = sphinx.setdefault("config", {})
    settings.update(locale_dirs=["book/locales"], gettext_compact=False)
    if extract:
        settings.update(gettext_location=False, gettext_uuid=False, vitlab_editions=[], project=config["title"])
        # myst-nb's gettext priority list has only text outputs; with images first, their alt
        # texts reach the catalogues.
        settings["nb_mime_priority_overrides"] = [
            ["gettext", mime, rank] for rank, mime in enumerate(("image/svg+xml", "image/png", "image/jpeg"), 1)
        ]
    else:
        current = edition or BY_CODE["en"]
        settings["vitlab_edition"] = current.code
        settings["vitlab_editions"] = [[e.code, e.folder, e.label, e.html_lang] for e in EDITIONS]
        if current.code != "en":
            settings["language"] = current.language
            show, hide = CODE_PROMPTS[current.code]
            settings.update(nb_code_prompt_show=show, nb_code_prompt_hide=hide)
    name = "extract" if extract else (edition or BY_CODE["en"]).code
    out = source / "_build" / "editions" / f"_config_{name}.yml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(config, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return out


def jupyter_book() -> str:
    beside = Path(sys.executable).with_name("jupyter-book")
    found = str(beside) if beside.exists() else shutil.which("jupyter-book")
    if not found:
        raise BuildError("jupyter-book is not installed (pip install -r requirements.txt)")
    return found


def run_jupyter_book(source: Path, config: Path, out: Path, extra: list[str], *, strict: bool = True) -> None:
    command = [jupyter_book(), "build", str(source), "--config", str(config), "--path-output", str(out), *extra]
    if strict:
        command += ["-W", "-n", "--keep-going"]
    if subprocess.run(command).returncode != 0:
        raise BuildError(f"jupyter-book build failed for {config.name} (its log above names the warnings)")


def build_edition(source: Path, edition: Edition, scratch: Path) -> Path:
    """Build one edition into ``scratch/<code>``; return its html folder."""
    config = write_config(source, edition)
    out = scratch / edition.code
    run_jupyter_book(source, config, out, [])
    return out / "_build" / "html"


def build_all(source: Path, out: Path, only: list[str] | None = None) -> Path:
    """English into ``out/_build/html``, then each translation into its folder below it."""
    html = out / "_build" / "html"
    scratch = out / "_build" / "editions"
    for edition in EDITIONS:
        if only and edition.code not in only:
            continue
        if edition.code == "en":
            run_jupyter_book(source, write_config(source, edition), out, [])
            continue
        built = build_edition(source, edition, scratch)
        target = html / edition.folder
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(built, target)
    return html


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=ROOT, help="the book's sources (default: this checkout)")
    parser.add_argument("--out", type=Path, default=None, help="where _build/html goes (default: --root)")
    parser.add_argument("--only", action="append", choices=sorted(BY_CODE), help="build only these editions")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    try:
        html = build_all(root, (args.out or root).resolve(), args.only)
    except BuildError as error:
        print(f"book-all: {error}", file=sys.stderr)
        return 1
    built = [e for e in EDITIONS if not args.only or e.code in args.only]
    print("book-all: built " + ", ".join(f"{html / e.folder} ({e.label})" for e in built))
    return 0


if __name__ == "__main__":
    sys.exit(main())
