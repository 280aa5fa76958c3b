"""The Korean and Chinese editions' catalogues (book/locales): complete, current and intact.

The translated builds themselves run with ``-W -n`` in the book build (book_build.py), so a
translation that drops a reference or breaks a role fails there. Here, without a build:
every page has a catalogue in each language; no language leaves more than 2 % of its
messages untranslated or fuzzy; no translation loses or changes a role target, a link, a
math span or a code span (a changed formula or identifier would build without a warning).
The slow test extracts the book's messages afresh, so a chapter edited without
``make translations`` counts against its language.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import polib
import pytest

from conftest import ROOT, toc_files

sys.path.insert(0, str(ROOT / "book" / "_scripts"))
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import translations  # noqa: E402 (book/_scripts is not a package)
from translated_editions import notebook_figure_texts  # noqa: E402 (nor is book/_ext)

LANGUAGES = translations.LANGUAGES


# --- the span check itself ------------------------------------------------------------------
def test_a_faithful_translation_passes() -> None:
    english = "The {doc}`next chapter <03_vit_encoder>` adds $x_{cls}$ to `tokens` ([timm](https://x.y/z))."
    korean = "{doc}`다음 장 <03_vit_encoder>`에서는 `tokens`에 $x_{cls}$를 더합니다([timm](https://x.y/z))."
    assert translations.span_problems(english, korean) == []


@pytest.mark.parametrize(
    ("translated", "lost"),
    [
        ("{doc}`다음 장 <04_deit>`에서는 `tokens`에 $x_{cls}$를 더합니다([timm](https://x.y/z)).", "roles"),
        ("{doc}`다음 장 <03_vit_encoder>`에서는 `token`에 $x_{cls}$를 더합니다([timm](https://x.y/z)).", "code"),
        ("{doc}`다음 장 <03_vit_encoder>`에서는 `tokens`에 $x_{CLS}$를 더합니다([timm](https://x.y/z)).", "math"),
        ("{doc}`다음 장 <03_vit_encoder>`에서는 `tokens`에 $x_{cls}$를 더합니다([timm](https://x.y)).", "links"),
        ("다음 장에서는 `tokens`에 $x_{cls}$를 더합니다([timm](https://x.y/z)).", "roles"),
    ],
)
def test_a_changed_span_is_named(translated: str, lost: str) -> None:
    english = "The {doc}`next chapter <03_vit_encoder>` adds $x_{cls}$ to `tokens` ([timm](https://x.y/z))."
    problems = translations.span_problems(english, translated)
    assert [p.split(":")[0] for p in problems] == [lost], problems


def test_a_term_keeps_its_english_target() -> None:
    english = "Each {term}`attention map` is a distribution."
    assert translations.span_problems(english, "각 {term}`어텐션 맵 <attention map>`은 분포입니다.") == []
    assert translations.span_problems(english, "각 {term}`어텐션 맵`은 분포입니다.") != []


def test_messages_without_words_need_no_translation() -> None:
    assert translations.needs_no_translation("`vit_tiny_patch16_224`: $N = 196$, 86.5")
    assert not translations.needs_no_translation("`vit_tiny_patch16_224` has 196 patches")


def test_export_and_import_round_trip(tmp_path: Path) -> None:
    po = polib.POFile()
    po.append(polib.POEntry(msgid="Hello `x`", msgstr=""))
    po.append(polib.POEntry(msgid="Line $a$", msgstr="", flags=["fuzzy"]))
    path = tmp_path / "page.po"
    po.save(str(path))
    text = translations.export(path, only_untranslated=True)
    filled = text.replace("TR: \n", "TR: 안녕 `x`\n", 1).replace("TR: \n", "TR: 줄 $a$\n", 1)
    assert translations.import_(path, filled) == 0
    entries = list(polib.pofile(str(path)))
    assert [e.msgstr for e in entries] == ["안녕 `x`", "줄 $a$"]
    assert all("fuzzy" not in e.flags for e in entries)
    broken = translations.export(path, only_untranslated=False).replace("줄 $a$", "줄 $b$")
    assert translations.import_(path, broken) == 1  # reported, so the translator fixes it


# --- the catalogues in the repository ---------------------------------------------------------
@pytest.mark.parametrize("language", LANGUAGES)
@pytest.mark.parametrize("page", toc_files())
def test_every_page_has_a_catalogue(language: str, page: str) -> None:
    path = translations.LOCALES / language / "LC_MESSAGES" / f"{page}.po"
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing: run `make translations`"


@pytest.mark.parametrize("language", LANGUAGES)
def test_catalogues_are_nearly_complete(language: str) -> None:
    tally = translations.tally(translations.catalogues(language))
    assert tally.messages > 2000, tally
    assert tally.unfinished <= translations.MAX_UNFINISHED, (
        f"{language}: {tally.untranslated} untranslated and {tally.fuzzy} fuzzy of {tally.messages} messages "
        f"({tally.unfinished:.1%}); the limit is {translations.MAX_UNFINISHED:.0%} "
        "(python book/_scripts/translations.py status lists them)"
    )


@pytest.mark.parametrize("language", LANGUAGES)
def test_translations_keep_roles_links_math_and_code(language: str) -> None:
    problems = [p for path in translations.catalogues(language) for p in translations.problems_in(path)]
    assert not problems, "\n".join(problems[:20])


@pytest.mark.parametrize("language", LANGUAGES)
def test_translations_are_in_their_language(language: str) -> None:
    """A msgstr copied from English, or written in the other language, is not a translation.

    Some messages are rightly kept as they are (a model name in a table cell, a formula that
    is a message of its own), so at most 10 % of the messages with English words may be
    identical to the English; of the others, 90 % of each page's must be in the language's
    script, and none may be in the other language's script (unless the English has it)."""
    script = {"ko": "[\uac00-\ud7af]", "zh_CN": "[\u4e00-\u9fff]"}[language]
    other = {"ko": "[\u4e00-\u9fff]", "zh_CN": "[\uac00-\ud7af]"}[language]
    kept = words = 0
    problems = []
    for path in translations.catalogues(language):
        entries = [
            e
            for e in polib.pofile(str(path))
            if e.msgstr and not e.obsolete and not translations.needs_no_translation(e.msgid)
        ]
        changed = [e for e in entries if e.msgstr != e.msgid]
        words += len(entries)
        kept += len(entries) - len(changed)
        wrong = [e for e in changed if re.search(other, e.msgstr) and not re.search(other, e.msgid)]
        problems += [f"{path.name}: in the other language: {e.msgstr[:60]!r}" for e in wrong]
        if changed:
            share = sum(bool(re.search(script, e.msgstr)) for e in changed) / len(changed)
            if share < 0.9:
                problems.append(f"{path.name}: only {share:.0%} of its translations are in {language}'s script")
    assert kept / words <= 0.10, f"{language}: {kept} of {words} messages are the English unchanged"
    assert not problems, "\n".join(problems[:20])


@pytest.mark.slow
@pytest.mark.parametrize("language", LANGUAGES)
def test_catalogues_cover_the_current_book(tmp_path_factory: pytest.TempPathFactory, language: str) -> None:
    """Extract the book's messages now; at most 2 % of them may lack a finished translation."""
    templates = _templates(tmp_path_factory)
    tally, missing = translations.coverage(templates, language)
    assert tally.unfinished <= translations.MAX_UNFINISHED, (
        f"{language}: {tally.untranslated} of the book's {tally.messages} messages have no translation and "
        f"{tally.fuzzy} are fuzzy ({tally.unfinished:.1%}): run `make translations` and translate them. "
        "First ones:\n" + "\n".join(missing)
    )


_TEMPLATES: dict[str, Path] = {}


def _templates(factory: pytest.TempPathFactory) -> Path:
    if "path" not in _TEMPLATES:
        _TEMPLATES["path"] = translations.extract_templates(factory.mktemp("gettext"))
    return _TEMPLATES["path"]


@pytest.mark.parametrize("language", LANGUAGES)
def test_every_declared_figure_text_is_translated(language: str) -> None:
    """Each notebook cell's caption and alt text (``mystnb`` metadata) has a translation, the
    internet cells' included: offline their figures are hidden, but the published book
    (``make book-online``) shows them in every edition."""
    missing = []
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        path = translations.LOCALES / language / "LC_MESSAGES" / "notebooks" / f"{notebook.stem}.po"
        done = {e.msgid for e in polib.pofile(str(path)) if e.msgstr and "fuzzy" not in e.flags}
        # the texts the gettext build extracts from the notebook (book/_ext/translated_editions.py)
        missing += [f"{notebook.name}: {t[:70]!r}" for t in notebook_figure_texts(notebook) if t not in done]
    assert not missing, "\n".join(missing)
