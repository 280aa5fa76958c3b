"""How long each chapter's main path takes to read: prose at 150 words a minute plus visible code at 12 lines a minute.

The main path is what a reader sees from the chapter's title to its end, except

* a section headed "Going further" (from that heading to the next heading of the same or
  a higher level): side topics a reader may skip;
* cells the book hides or removes (tags ``hide-input``, ``hide-cell``, ``remove-cell``,
  ``remove-input``) and the hidden solutions (tag ``solution``); the answers to the
  questions (tag ``answer``, a dropdown) count: a student doing the exercises reads them;
* outputs (a reader glances at them; they are part of the steps they follow).

Prose is the words of markdown cells outside code fences and display math; the lines
inside a code fence (```` ```python ````, ```` ```text ````, a fence with no language) count
as code. MyST directives (```` ```{note} ```` and ``:::``) count as prose. Code lines are
the non-blank lines of visible code cells.

    python benchmarks/reading_time.py                  # every chapter
    python benchmarks/reading_time.py notebooks/05_deepvit.ipynb

The 50-minute budget per chapter is the course's target (book/instructors.md lists the
measured minutes). This is a measurement, not a test.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

WORDS_PER_MINUTE = 150
CODE_LINES_PER_MINUTE = 12
HIDDEN_TAGS = {"hide-input", "hide-cell", "remove-cell", "remove-input", "solution"}
SKIPPED_SECTION = re.compile(r"^(#+)\s+Going further\b", re.IGNORECASE)
_HEADING = re.compile(r"^(#+)\s")
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*(\{?)")
_WORD = re.compile(r"\S+")  # a word is what whitespace separates: symbols and inline code count


@dataclass(frozen=True)
class ReadingTime:
    """Words of prose and lines of code on a chapter's main path, and the minutes they take."""

    words: int
    code_lines: int

    @property
    def minutes(self) -> float:
        return self.words / WORDS_PER_MINUTE + self.code_lines / CODE_LINES_PER_MINUTE


def _markdown(text: str) -> tuple[int, int]:
    """``(words, code lines)`` of one markdown cell."""
    words = code = 0
    fence: str | None = None
    fence_is_code = False
    in_math = False
    for line in text.splitlines():
        match = _FENCE.match(line)
        if fence is None and match:
            fence, fence_is_code = match.group(1), match.group(2) != "{"
            continue
        if fence is not None and line.strip().startswith(fence[0] * len(fence)) and line.strip(fence[0]) == "":
            fence = None
            continue
        if line.strip().startswith("$$"):
            in_math = not in_math if line.strip() == "$$" or line.strip().count("$$") == 1 else in_math
            continue
        if fence is not None and fence_is_code:
            code += bool(line.strip())
        elif not in_math:
            words += len(_WORD.findall(re.sub(r"\$[^$]*\$", " x ", line)))
    return words, code


def reading_time(path: Path) -> ReadingTime:
    """The main path's words and code lines of one notebook."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    words = code = 0
    skipping_level: int | None = None
    for cell in cells:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            heading = _HEADING.match(text.lstrip())
            if heading and skipping_level is not None and len(heading.group(1)) <= skipping_level:
                skipping_level = None
            going_further = SKIPPED_SECTION.match(text.lstrip())
            if going_further:
                skipping_level = len(going_further.group(1))
        if skipping_level is not None:
            continue
        if HIDDEN_TAGS & set(cell.get("metadata", {}).get("tags", [])):
            continue
        if cell["cell_type"] == "markdown":
            w, c = _markdown(text)
            words, code = words + w, code + c
        elif cell["cell_type"] == "code":
            code += sum(bool(line.strip()) for line in text.splitlines())
    return ReadingTime(words, code)


def main(argv: list[str]) -> int:
    paths = [Path(p) for p in argv] or sorted(Path(__file__).resolve().parents[1].glob("notebooks/[0-9]*.ipynb"))
    print(f"{'notebook':<28} {'words':>6} {'code lines':>10} {'minutes':>8}")
    for path in paths:
        t = reading_time(path)
        print(f"{path.name:<28} {t.words:>6} {t.code_lines:>10} {t.minutes:>8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
