"""The Korean and Chinese editions' message catalogues: extract, check, count, and edit them.

The book's prose lives in English in the notebooks and ``book/*.md``. Sphinx's gettext
builder extracts every translatable message (paragraphs, headings, list items, admonition
and dropdown titles, figure captions, image alt text, table cells, glossary entries) into
one ``.pot`` template per page; ``sphinx-intl`` merges those into one ``.po`` catalogue per
page and language under ``book/locales/<language>/LC_MESSAGES/``. A translated build
(``book/_scripts/editions.py``) reads them with ``language=ko`` or ``zh_CN``.

Commands::

    python book/_scripts/translations.py extract   # re-extract; update every .po (make translations)
    python book/_scripts/translations.py status    # per language: messages, untranslated, fuzzy
    python book/_scripts/translations.py check     # every msgstr keeps its roles, links, math and code
    python book/_scripts/translations.py export book/locales/ko/LC_MESSAGES/notebooks/04_deit.po
    python book/_scripts/translations.py import book/locales/ko/LC_MESSAGES/notebooks/04_deit.po 04_deit.ko.txt

``export`` writes the catalogue's messages in a plain-text form that needs no escaping
(``=== N`` opens message N, ``EN:`` is the English, ``TR:`` the translation, which may span
lines); ``import`` reads that form back. Any PO editor (Poedit, Lokalize, Weblate) works on
the ``.po`` files directly as well.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import polib

ROOT = Path(__file__).resolve().parents[2]
LOCALES = ROOT / "book" / "locales"
LANGUAGES = ("ko", "zh_CN")
MAX_UNFINISHED = 0.02  # the share of untranslated or fuzzy messages a language may have

# --- the spans a translation must keep exactly -------------------------------------------
_ROLE = re.compile(r"\{([\w:-]+)\}`([^`]*)`")
_TARGET = re.compile(r"<([^<>]+)>\s*$")
_CODE = re.compile(r"(`+)(.+?)\1", re.S)
_DISPLAY_MATH = re.compile(r"\$\$.+?\$\$", re.S)
_INLINE_MATH = re.compile(r"(?<![\\$])\$(?!\$)(.+?)(?<![\\$])\$", re.S)
# Words in a formula (\text{row}) are prose: a translation may change them, nothing else.
_MATH_TEXT = re.compile(r"\\text\{[^{}]*\}")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_AUTOLINK = re.compile(r"<(https?://[^>]+)>")
# Roles whose text is shown to the reader, so a translation may change it; only the target
# after "<" must stay. {term} without a target points at the English glossary term.
_TITLED_ROLES = {"doc", "ref", "term", "numref", "download"}


@dataclass(frozen=True)
class Spans:
    roles: Counter[tuple[str, str]]
    code: Counter[str]
    math: Counter[str]
    links: Counter[str]
    prose: str  # the message without its roles, code and math (bold marks, English words)


def spans(text: str) -> Spans:
    """The roles (with their targets), code spans, math and link targets of one message."""
    roles: Counter[tuple[str, str]] = Counter()
    for name, content in _ROLE.findall(text):
        target = _TARGET.search(content)
        key = target.group(1).strip() if (target and name in _TITLED_ROLES) else content.strip()
        roles[(name, key)] += 1
    rest = _ROLE.sub(" ", text)
    code = Counter(m.group(2) for m in _CODE.finditer(rest))
    rest = _CODE.sub(" ", rest)
    math = Counter(_MATH_TEXT.sub(r"\\text{}", m.group(0)) for m in _DISPLAY_MATH.finditer(rest))
    rest = _DISPLAY_MATH.sub(" ", rest)
    math.update(_MATH_TEXT.sub(r"\\text{}", m.group(0)) for m in _INLINE_MATH.finditer(rest))
    links = Counter(_LINK.findall(rest)) + Counter(_AUTOLINK.findall(rest))
    return Spans(roles, code, math, links, _INLINE_MATH.sub(" ", rest))


def span_problems(msgid: str, msgstr: str) -> list[str]:
    """What a translation lost or added among the spans it must keep (empty: none)."""
    want, got = spans(msgid), spans(msgstr)
    problems = []
    for kind in ("roles", "code", "math", "links"):
        a, b = getattr(want, kind), getattr(got, kind)
        if a != b:
            missing, extra = sorted((a - b).elements()), sorted((b - a).elements())
            problems.append(f"{kind}: missing {missing}, extra {extra}")
    if got.prose.count("**") % 2:  # bold marks, not Python's power operator inside code
        problems.append("unbalanced **")
    return problems


def needs_no_translation(msgid: str) -> bool:
    """True for messages with no English words outside code, math and role targets."""
    rest = re.sub(r"https?://\S+", " ", spans(msgid).prose)
    return not re.search(r"[A-Za-z]{2,}", rest)


def catalogues(language: str) -> list[Path]:
    return sorted((LOCALES / language / "LC_MESSAGES").rglob("*.po"))


# --- extract ---------------------------------------------------------------------------------
def extract_templates(out: Path) -> Path:
    """Run the gettext builder over the book into ``out``; the folder of its ``.pot`` files."""
    sys.path.insert(0, str(Path(__file__).parent))
    import editions  # the generated configuration lives there

    shutil.rmtree(out, ignore_errors=True)
    config = editions.write_config(ROOT, None, extract=True)
    gettext = ["--builder", "custom", "--custom-builder", "gettext"]
    editions.run_jupyter_book(ROOT, config, out, gettext, strict=False)
    return out / "_build" / "gettext"


def extract(languages: tuple[str, ...] = LANGUAGES) -> None:
    """Re-extract the book's messages and merge them into every .po file (sphinx-intl)."""
    templates = extract_templates(ROOT / "_build" / "gettext-src")
    intl = Path(sys.executable).with_name("sphinx-intl")
    command = [str(intl if intl.exists() else "sphinx-intl"), "update", "-p", str(templates), "-d", str(LOCALES)]
    command += ["--line-width", "0"]  # one line per message: diffs show the message that changed
    for language in languages:
        command += ["-l", language]
    subprocess.run(command, check=True)
    # Messages that are only code, math or numbers are "translated" as themselves. Messages
    # the book no longer has (kept by sphinx-intl as obsolete) are dropped: their
    # translations have already served as the fuzzy suggestions for the changed ones.
    for language in languages:
        for path in catalogues(language):
            po = polib.pofile(str(path), wrapwidth=0)
            changed = False
            for entry in list(po):
                if entry.obsolete:
                    po.remove(entry)
                    changed = True
                elif not entry.msgstr and needs_no_translation(entry.msgid):
                    entry.msgstr = entry.msgid
                    changed = True
            if changed:
                po.save()
    print(f"translations: templates in {templates}; catalogues updated in {LOCALES}")


def coverage(templates: Path, language: str) -> tuple[Tally, list[str]]:
    """How many of the book's current messages (``templates``) the language's catalogues
    translate: a message missing from its catalogue counts as untranslated, so a chapter
    edited without ``make translations`` shows up here. Also the first missing messages."""
    messages = untranslated = fuzzy = 0
    missing: list[str] = []
    for template in sorted(templates.rglob("*.pot")):
        page = template.relative_to(templates).with_suffix(".po")
        path = LOCALES / language / "LC_MESSAGES" / page
        known = {e.msgid: e for e in polib.pofile(str(path)) if not e.obsolete} if path.exists() else {}
        for message in polib.pofile(str(template)):
            messages += 1
            entry = known.get(message.msgid)
            if entry is not None and "fuzzy" in entry.flags:
                fuzzy += 1
            elif entry is None or not entry.msgstr:
                untranslated += 1
                if len(missing) < 10:
                    missing.append(f"{page}: {message.msgid[:70]!r}")
    return Tally(messages, untranslated, fuzzy), missing


# --- status and check ------------------------------------------------------------------------
@dataclass(frozen=True)
class Tally:
    messages: int
    untranslated: int
    fuzzy: int

    @property
    def unfinished(self) -> float:
        return (self.untranslated + self.fuzzy) / max(self.messages, 1)


def tally(paths: list[Path]) -> Tally:
    messages = untranslated = fuzzy = 0
    for path in paths:
        for entry in polib.pofile(str(path)):
            if entry.obsolete:
                continue
            messages += 1
            if "fuzzy" in entry.flags:
                fuzzy += 1
            elif not entry.msgstr:
                untranslated += 1
    return Tally(messages, untranslated, fuzzy)


def problems_in(path: Path) -> list[str]:
    found = []
    for entry in polib.pofile(str(path)):
        if entry.obsolete or not entry.msgstr or "fuzzy" in entry.flags:
            continue
        for problem in span_problems(entry.msgid, entry.msgstr):
            found.append(f"{path.relative_to(ROOT)}: {entry.msgid[:60]!r}: {problem}")
    return found


def status() -> int:
    worst = 0.0
    for language in LANGUAGES:
        paths = catalogues(language)
        t = tally(paths)
        worst = max(worst, t.unfinished)
        print(
            f"{language}: {len(paths)} catalogues, {t.messages} messages, {t.untranslated} untranslated, "
            f"{t.fuzzy} fuzzy ({100 * t.unfinished:.1f} % unfinished; the limit is {100 * MAX_UNFINISHED:.0f} %)"
        )
        for path in paths:
            one = tally([path])
            if one.untranslated or one.fuzzy:
                print(
                    f"    {path.relative_to(LOCALES / language / 'LC_MESSAGES')}: "
                    f"{one.untranslated} untranslated, {one.fuzzy} fuzzy of {one.messages}"
                )
    return 0 if worst <= MAX_UNFINISHED else 1


def check(paths: list[Path] | None = None) -> int:
    paths = paths or [p for language in LANGUAGES for p in catalogues(language)]
    found = [problem for path in paths for problem in problems_in(path)]
    print("\n".join(found) or f"check: {len(paths)} catalogues keep every role, link, math and code span")
    return 1 if found else 0


# --- export and import (a plain-text form for translators) -----------------------------------
def export(path: Path, only_untranslated: bool) -> str:
    blocks = []
    for number, entry in enumerate(polib.pofile(str(path))):
        if entry.obsolete or (only_untranslated and entry.msgstr and "fuzzy" not in entry.flags):
            continue
        blocks.append(f"=== {number}\nEN: {entry.msgid}\nTR: {entry.msgstr}\n")
    return "\n".join(blocks)


def parse_export(text: str) -> dict[int, tuple[str, str]]:
    found: dict[int, tuple[str, str]] = {}
    parts = re.split(r"^=== (\d+)[ \t]*\n", text, flags=re.M)
    for number, body in zip(parts[1::2], parts[2::2], strict=True):
        match = re.match(r"EN: (.*?)\nTR:[ \t]?(.*)", body, flags=re.S)
        if not match:
            raise ValueError(f"message {number}: expected 'EN: ...' then 'TR: ...', got {body[:80]!r}")
        found[int(number)] = (match.group(1), match.group(2).rstrip())
    return found


def import_(path: Path, text: str) -> int:
    po = polib.pofile(str(path), wrapwidth=0)
    entries = list(po)
    by_msgid = {entry.msgid: entry for entry in entries}
    bad = []
    for number, (msgid, msgstr) in parse_export(text).items():
        # The number is where the message was when exported; `make translations` may have
        # moved it since, so the English text decides.
        entry = entries[number] if number < len(entries) and entries[number].msgid == msgid else by_msgid.get(msgid)
        if entry is None:
            bad.append(f"message {number}: no message in the catalogue has this EN text")
            continue
        if not msgstr:
            continue
        for problem in span_problems(msgid, msgstr):
            bad.append(f"message {number}: {problem}")
        entry.msgstr = msgstr
        if "fuzzy" in entry.flags:
            entry.flags.remove("fuzzy")
    po.save()
    print("\n".join(bad) or f"imported into {path}")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("extract", help="re-extract the messages and update every .po file")
    sub.add_parser("status", help="untranslated and fuzzy messages per language (exit 1 above the limit)")
    p_check = sub.add_parser("check", help="every translation keeps its roles, links, math and code")
    p_check.add_argument("po", nargs="*", type=Path)
    p_export = sub.add_parser("export", help="one catalogue as plain text for a translator")
    p_export.add_argument("po", type=Path)
    p_export.add_argument("--untranslated", action="store_true", help="only messages still to do")
    p_import = sub.add_parser("import", help="read an exported text back into its catalogue")
    p_import.add_argument("po", type=Path)
    p_import.add_argument("text", type=Path)
    args = parser.parse_args(argv)
    if args.command == "extract":
        extract()
        return 0
    if args.command == "status":
        return status()
    if args.command == "check":
        return check([p.resolve() for p in args.po] or None)
    if args.command == "export":
        print(export(args.po, args.untranslated))
        return 0
    return import_(args.po, args.text.read_text(encoding="utf-8"))


if __name__ == "__main__":
    sys.exit(main())
