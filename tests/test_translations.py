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

import csv
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


def test_the_words_of_a_formula_may_be_translated_and_nothing_else() -> None:
    english = "The index is $100 \\cdot \\text{channel} + \\text{row}$."
    assert translations.span_problems(english, "색인은 $100 \\cdot \\text{채널} + \\text{행}$입니다.") == []
    assert translations.span_problems(english, "색인은 $10 \\cdot \\text{채널} + \\text{행}$입니다.") != []


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


# --- one word per idea: the term sheets, the translation memory, numbers ----------------------
# Each language keeps a term sheet, book/locales/<language>/terms.tsv (UTF-8, tab-separated,
# a header line): `english`, a case-insensitive regular expression for the English term;
# `target` (or the language's name, `korean`/`chinese`), the one form a translation of a
# message with that term must contain; `avoid`, comma-separated forms it must not contain;
# `note`, for the translator. Terms inside code, math, role targets, italics (titles,
# emphasis) and quotations the translation keeps in English are not checked, nor are the
# messages whose English itself quotes Korean or Chinese (the glossary's names).
_ITALIC = re.compile(r"(?<![*\w])\*(?!\*)[^*\n]+\*")
_QUOTED = re.compile(r'"[^"\n]+"')
_CJK = re.compile(r"[\uac00-\ud7af\u4e00-\u9fff]")
_SHOWN = re.compile(r"\{(?:doc|ref|term|numref)\}`([^`<]+?)\s*<[^`]*>`")


def term_sheet(language: str) -> list[dict[str, str]]:
    path = translations.LOCALES / language / "terms.tsv"
    with path.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    for row in rows:
        row["target"] = row.get("target") or row.get("korean") or row.get("chinese") or ""
        assert row["english"] and row["target"], f"{path.name}: a row needs `english` and a target: {row}"
        re.compile(row["english"])
    return rows


def term_problems(sheet: list[dict[str, str]], msgid: str, msgstr: str) -> list[str]:
    """The sheet's rules that a translation breaks (empty: none)."""
    english = _ITALIC.sub(" ", translations.spans(msgid).prose)
    shown = " ".join(_SHOWN.findall(msgstr))  # the text a reader sees of a titled role
    translated = translations.spans(msgstr).prose + " " + shown
    english = _QUOTED.sub(lambda m: " " if m.group(0) in translated else m.group(0), english)
    matched = [row for row in sheet if re.search(row["english"], english, re.I)]
    targets = [row["target"] for row in matched]
    problems = []
    for row in matched:
        if row["target"] not in translated:
            problems.append(f"{row['english']!r} wants {row['target']!r}")
        for avoid in filter(None, (a.strip() for a in row.get("avoid", "").split(","))):
            # an avoided form may still be part of another matched term's own form
            if avoid in translated and not any(avoid in target for target in targets):
                problems.append(f"{row['english']!r} avoids {avoid!r}")
    return problems


def test_term_problems_name_the_broken_rule() -> None:
    sheet = [
        {"english": r"\bfused\b", "target": "퓨즈드", "avoid": "융합"},
        {"english": r"\bfusion\b", "target": "융합", "avoid": "퓨즈드"},
    ]
    assert term_problems(sheet, "The `fused` path.", "`fused` 경로.") == []  # code is not prose
    assert term_problems(sheet, "The fused path.", "퓨즈드 경로.") == []
    assert term_problems(sheet, "The fused path.", "융합 경로.") == [
        "'\\\\bfused\\\\b' wants '퓨즈드'",
        "'\\\\bfused\\\\b' avoids '융합'",
    ]
    assert term_problems(sheet, "A fused kernel, then the fusion.", "퓨즈드 커널, 그다음 융합.") == []
    assert term_problems(sheet, "*Fused Attention* (a title).", "*Fused Attention*(제목).") == []


@pytest.mark.parametrize("language", LANGUAGES)
def test_translations_follow_the_term_sheet(language: str) -> None:
    sheet = term_sheet(language)
    problems = []
    for path in translations.catalogues(language):
        for entry in polib.pofile(str(path)):
            if not entry.msgstr or "fuzzy" in entry.flags or entry.msgstr == entry.msgid:
                continue
            if _CJK.search(entry.msgid):
                continue
            problems += [
                f"{path.name}: {p}: {entry.msgstr[:70]!r}" for p in term_problems(sheet, entry.msgid, entry.msgstr)
            ]
    assert not problems, f"{len(problems)} messages break book/locales/{language}/terms.tsv:\n" + "\n".join(
        problems[:30]
    )


@pytest.mark.parametrize("language", LANGUAGES)
def test_one_english_message_has_one_translation(language: str) -> None:
    """Translation memory: an English message on several pages (exercise instructions,
    "Show the figure's code", table headers) reads the same on each. The glossary, which
    names each English term with its translation beside it, is left out."""
    seen: dict[str, dict[str, list[str]]] = {}
    for path in translations.catalogues(language):
        if path.stem == "glossary":
            continue
        for entry in polib.pofile(str(path)):
            if entry.msgstr and "fuzzy" not in entry.flags and not entry.obsolete:
                seen.setdefault(entry.msgid, {}).setdefault(entry.msgstr, []).append(path.stem)
    split = {msgid: found for msgid, found in seen.items() if len(found) > 1}
    report = [
        f"{msgid[:60]!r}: " + " | ".join(f"{pages}: {text[:40]!r}" for text, pages in found.items())
        for msgid, found in split.items()
    ]
    assert not split, f"{len(split)} English messages have several {language} translations:\n" + "\n".join(report[:20])


# Numbers as Korean and Chinese write them: 만/万 and 억/亿 for large counts (2,894만, 8,600 万),
# not the English 28.9M, "million" or 28,940,000 (a round number of five digits or more).
# Exact counts (86,567,656) and sums written out (… + 769,000 = …) keep their digits; 수백만
# and 数百万 are words of the language, and so is 百万 as the name of torchinfo's unit.


def _english_numbers(units: str, own_words: str) -> re.Pattern[str]:
    """English-style numbers in a translation; ``units``: the language's 10^4 and 10^8 (after
    a round ,000 they make it right: 769,000만 is not English); ``own_words``: its words for a
    million and a billion, and G written as a count (1.3 G 次 is 13 亿次)."""
    return re.compile(
        r"(?<![A-Za-z0-9_.\-])\d+(?:\.\d+)? ?[MB](?![A-Za-z0-9_\-])"  # 28.9M, 9.4B (not JFT-300M)
        rf"|{own_words}|\b(?:million|billion)\b"
        rf"|(?<![\d,.])(?<![+=·×] )(?:\d{{2,3}}|\d{{1,3}}(?:,\d{{3}})+),000(?![\d,])(?! ?[+=·×{units}])"
    )


_ENGLISH_NUMBERS = {
    "ko": _english_numbers("만억", r"(?<!수)백만|십억|\d ?G ?(?:번|회)"),
    "zh_CN": _english_numbers("万亿", r"(?<![数几是为])百万|十亿|\d ?G ?次"),
}
NUMBER_EXAMPLES = {
    "ko": (
        ("파라미터 28.9M개", "28,940,000회", "0.59백만", "이미지 50,000장", "9.4B FLOPs", "1.3 G 번의 곱셈"),
        (
            "2,894만 회",
            "파라미터 86,567,656개",
            "1,536 + 769,000 = 86,567,656",
            "JFT-300M",
            "수백만 개",
            "2,000장",
            "13억 번",
        ),
    ),
    "zh_CN": (
        ("参数 28.9M", "28,940,000 次", "0.59 百万", "50,000 张图像", "9.4B FLOPs", "1.3 G 次乘加运算"),
        (
            "2,894 万次",
            "86,567,656 个参数",
            "1,536 + 769,000 = 86,567,656",
            "JFT-300M",
            "数百万个",
            "单位为百万",
            "13 亿次乘加运算",
        ),
    ),
}


@pytest.mark.parametrize("language", LANGUAGES)
def test_large_numbers_are_written_the_languages_way(language: str) -> None:
    pattern, (wrongs, rights) = _ENGLISH_NUMBERS[language], NUMBER_EXAMPLES[language]
    for wrong in wrongs:
        assert pattern.search(wrong), wrong
    for right in rights:
        assert not pattern.search(right), right
    problems = []
    for path in translations.catalogues(language):
        for entry in polib.pofile(str(path)):
            if not entry.msgstr or "fuzzy" in entry.flags:
                continue
            prose = re.sub(r"https?://\S+", " ", translations.spans(entry.msgstr).prose)
            problems += [f"{path.name}: {m.group(0)!r} in {entry.msgstr[:60]!r}" for m in pattern.finditer(prose)]
    assert not problems, "\n".join(problems[:20])
