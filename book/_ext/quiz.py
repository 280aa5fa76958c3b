"""Sphinx extension: self-check quizzes that need no kernel (the ``quiz`` directive).

A quiz is written so that its source reads as a plain question list where the directive is
not understood (a notebook opened in Colab or on GitHub), with the answers folded away in an
HTML ``<details>`` block::

    :::{quiz}

    **Q1.** What shape comes out?

    - A. `(2, 196, 768)`
    - B. `(2, 768, 196)`

    <details><summary>Answer</summary>

    - A. ✓ Why A is right.
    - B. ✗ Why B is wrong.

    </details>

    (**Q2.** and so on: 3 to 6 questions.)
    :::

Every question has 2 to 5 options, lettered A, B, C, ... in order, and one explanation per
option, in the same order, marked ✓ (right) or ✗ (wrong); exactly one option is right.
``parse_quiz`` checks all of this and raises ``QuizError`` naming what it expected and what
it found. Each question, option and explanation becomes a node of its own that Sphinx's
gettext builder extracts as one message (the letters and marks are not part of it), so the
Korean and Chinese editions translate them through the same catalogues as the prose.

In the HTML each question is a radio group with a Check button (``book/_static/quiz.js``):
the reader picks an option and presses Check, and a live region says whether it is right and
shows that option's explanation. All explanations also sit in a ``<details>`` block, so the
quiz still works without JavaScript. The few words the page itself adds ("Check", "Right.")
come from ``LABELS`` in the edition's language. Loaded from _config.yml (``sphinx:
local_extensions``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html import escape
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

MIN_QUESTIONS, MAX_QUESTIONS = 3, 6
MIN_OPTIONS, MAX_OPTIONS = 2, 5
RIGHT, WRONG = "✓", "✗"
OPEN_ANSWERS = "<details><summary>Answer</summary>"
CLOSE_ANSWERS = "</details>"
_QUESTION = re.compile(r"\*\*Q(\d+)\.\*\*\s+(.*)")
_ITEM = re.compile(r"- ([A-Z])\.\s+(.*)")

# The words the quiz's HTML adds, per edition (Sphinx's ``language`` setting).
LABELS = {
    "en": {"check": "Check", "right": "Right.", "wrong": "Not quite.", "pick": "Pick an answer first.",
           "answers": "All answers explained"},
    "ko": {"check": "확인", "right": "정답입니다.", "wrong": "아쉽지만 아닙니다.", "pick": "먼저 답을 고르세요.",
           "answers": "모든 답의 설명"},
    "zh_CN": {"check": "检查", "right": "正确。", "wrong": "不太对。", "pick": "请先选择一个答案。",
              "answers": "所有选项的解释"},
}  # fmt: skip


class QuizError(ValueError):
    """A quiz that does not follow the format above; the message says where and what."""


@dataclass
class Option:
    text: str
    line: int  # 0-based, in the directive's body
    explanation: str = ""
    explanation_line: int = 0
    right: bool = False


@dataclass
class Question:
    text: str
    line: int
    options: list[Option] = field(default_factory=list)

    @property
    def answer(self) -> int:
        return next(i for i, option in enumerate(self.options) if option.right)


def _blocks(lines: list[str]) -> list[tuple[int, list[str]]]:
    """The body's blank-line separated blocks: (first line's index, lines)."""
    blocks: list[tuple[int, list[str]]] = []
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        if blocks and index > 0 and lines[index - 1].strip():
            blocks[-1][1].append(line)
        else:
            blocks.append((index, [line]))
    return blocks


def _items(start: int, block: list[str], what: str) -> list[tuple[str, str, int]]:
    """A block of ``- A. text`` items (continuation lines indented): (letter, text, line)."""
    items: list[tuple[str, str, int]] = []
    for offset, line in enumerate(block):
        match = _ITEM.fullmatch(line.rstrip())
        if match:
            items.append((match.group(1), match.group(2), start + offset))
        elif items and line.startswith("  "):
            letter, text, where = items[-1]
            items[-1] = (letter, f"{text} {line.strip()}", where)
        else:
            raise QuizError(f"line {start + offset + 1}: expected {what} '- A. ...', got {line.strip()!r}")
    return items


def parse_quiz(text: str) -> list[Question]:
    """Read a quiz's body (format in the module docstring); raise QuizError if it is malformed."""
    blocks = _blocks(text.splitlines())
    questions: list[Question] = []
    i = 0
    while i < len(blocks):
        start, block = blocks[i]
        number = len(questions) + 1
        match = _QUESTION.fullmatch(" ".join(line.strip() for line in block))
        if not match or int(match.group(1)) != number:
            raise QuizError(f"line {start + 1}: expected question '**Q{number}.** ...', got {block[0].strip()!r}")
        question = Question(match.group(2), start)
        if i + 3 >= len(blocks):
            raise QuizError(
                f"question {number}: expected options, '{OPEN_ANSWERS}', explanations and '{CLOSE_ANSWERS}'"
            )
        options = _items(*blocks[i + 1], "an option")
        letters = [chr(ord("A") + k) for k in range(len(options))]
        if [letter for letter, _, _ in options] != letters or not MIN_OPTIONS <= len(options) <= MAX_OPTIONS:
            raise QuizError(
                f"question {number}: expected {MIN_OPTIONS} to {MAX_OPTIONS} options lettered A, B, C, ... in order, "
                f"got {[letter for letter, _, _ in options]}"
            )
        question.options = [Option(text, line) for _, text, line in options]
        opening = blocks[i + 2]
        if [line.strip() for line in opening[1]] != [OPEN_ANSWERS]:
            raise QuizError(f"line {opening[0] + 1}: expected {OPEN_ANSWERS!r}, got {opening[1][0].strip()!r}")
        explanations = _items(*blocks[i + 3], "an explanation")
        if [letter for letter, _, _ in explanations] != letters:
            raise QuizError(
                f"question {number}: expected one explanation per option, {letters}, "
                f"got {[letter for letter, _, _ in explanations]}"
            )
        for option, (letter, body, line) in zip(question.options, explanations, strict=True):
            mark, _, rest = body.partition(" ")
            if mark not in (RIGHT, WRONG) or not rest.strip():
                raise QuizError(
                    f"line {line + 1}: expected '- {letter}. {RIGHT} ...' or '- {letter}. {WRONG} ...', got {body!r}"
                )
            option.right, option.explanation, option.explanation_line = mark == RIGHT, rest.strip(), line
        rights = sum(option.right for option in question.options)
        if rights != 1:
            raise QuizError(f"question {number}: expected exactly one {RIGHT} explanation, got {rights}")
        closing = blocks[i + 4] if i + 4 < len(blocks) else (len(text.splitlines()), ["(the end)"])
        if [line.strip() for line in closing[1]] != [CLOSE_ANSWERS]:
            raise QuizError(f"line {closing[0] + 1}: expected {CLOSE_ANSWERS!r}, got {closing[1][0].strip()!r}")
        questions.append(question)
        i += 5
    if not MIN_QUESTIONS <= len(questions) <= MAX_QUESTIONS:
        raise QuizError(f"expected {MIN_QUESTIONS} to {MAX_QUESTIONS} questions, got {len(questions)}")
    return questions


# --- the doctree --------------------------------------------------------------------------------
class quiz(nodes.General, nodes.Element):  # noqa: N801 (docutils names nodes in lower case)
    """The whole quiz; ``ids`` gives each question's radio group its name."""


class quiz_question(nodes.General, nodes.Element):  # noqa: N801
    pass


class quiz_options(nodes.General, nodes.Element):  # noqa: N801
    pass


class quiz_answers(nodes.General, nodes.Element):  # noqa: N801
    pass


# The three kinds of text are TextElements with a source, so Sphinx translates each as a message.
class quiz_prompt(nodes.Part, nodes.TextElement):  # noqa: N801
    pass


class quiz_option(nodes.Part, nodes.TextElement):  # noqa: N801
    pass


class quiz_explanation(nodes.Part, nodes.TextElement):  # noqa: N801
    pass


class QuizDirective(SphinxDirective):
    has_content = True

    def _text(self, cls: type[nodes.TextElement], text: str, line: int, **attributes: Any) -> nodes.TextElement:
        lineno = self.content_offset + line + 1
        children, messages = self.state.inline_text(text, lineno)
        node = cls(text, "", *children, *messages, **attributes)
        node.source, node.line = self.get_source_info()[0], lineno
        return node

    def run(self) -> list[nodes.Node]:
        try:
            questions = parse_quiz("\n".join(self.content))
        except QuizError as error:
            raise self.error(f"quiz: {error}") from None
        serial = self.env.new_serialno("quiz")
        root = quiz(ids=[f"quiz-{serial}"])
        self.set_source_info(root)
        for number, question in enumerate(questions, 1):
            item = quiz_question(ids=[f"quiz-{serial}-q{number}"], number=number, answer=question.answer)
            item += self._text(quiz_prompt, question.text, question.line)
            options, answers = quiz_options(), quiz_answers()
            for k, option in enumerate(question.options):
                letter = chr(ord("A") + k)
                options += self._text(quiz_option, option.text, option.line, letter=letter, index=k)
                answers += self._text(
                    quiz_explanation,
                    option.explanation,
                    option.explanation_line,
                    letter=letter,
                    index=k,
                    right=option.right,
                )
            item += [options, answers]
            root += item
        return [root]


# --- HTML ---------------------------------------------------------------------------------------
def _labels(translator: Any) -> dict[str, str]:
    return LABELS.get(translator.builder.config.language or "en", LABELS["en"])


def visit_quiz(self: Any, node: quiz) -> None:
    labels = _labels(self)
    data = " ".join(f'data-label-{key}="{escape(labels[key])}"' for key in ("right", "wrong", "pick"))
    self.body.append(f'<div class="vl-quiz" id="{node["ids"][0]}" {data}>\n')


def visit_quiz_question(self: Any, node: quiz_question) -> None:
    self.body.append(f'<div class="vl-quiz-question" id="{node["ids"][0]}" data-answer="{node["answer"]}">\n')


def visit_quiz_prompt(self: Any, node: quiz_prompt) -> None:
    question = node.parent
    self.body.append(
        f'<p class="vl-quiz-prompt" id="{question["ids"][0]}-prompt">'
        f'<span class="vl-quiz-number">{question["number"]}.</span> '
    )


def visit_quiz_options(self: Any, node: quiz_options) -> None:
    self.body.append(
        f'<div class="vl-quiz-options" role="radiogroup" aria-labelledby="{node.parent["ids"][0]}-prompt">\n'
    )


def depart_quiz_options(self: Any, node: quiz_options) -> None:
    labels = _labels(self)
    self.body.append(
        "</div>\n"
        f'<button type="button" class="vl-quiz-check" hidden>{escape(labels["check"])}</button>\n'
        '<div class="vl-quiz-feedback" role="status" aria-live="polite"></div>\n'
    )


def visit_quiz_option(self: Any, node: quiz_option) -> None:
    name = node.parent.parent["ids"][0]
    self.body.append(
        f'<label class="vl-quiz-option"><input type="radio" name="{name}" value="{node["index"]}"> '
        f'<span class="vl-quiz-letter">{node["letter"]}.</span> <span class="vl-quiz-text">'
    )


def depart_quiz_option(self: Any, node: quiz_option) -> None:
    self.body.append("</span></label>\n")


def visit_quiz_answers(self: Any, node: quiz_answers) -> None:
    self.body.append(f'<details class="vl-quiz-answers"><summary>{escape(_labels(self)["answers"])}</summary>\n<ul>\n')


def visit_quiz_explanation(self: Any, node: quiz_explanation) -> None:
    mark = RIGHT if node["right"] else WRONG
    self.body.append(
        f'<li class="vl-quiz-explanation" data-option="{node["index"]}" data-right="{str(node["right"]).lower()}">'
        f'<span class="vl-quiz-letter">{node["letter"]}. {mark}</span> <span class="vl-quiz-text">'
    )


def _close(markup: str) -> Any:
    def depart(self: Any, node: nodes.Element) -> None:
        self.body.append(markup)

    return depart


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("quiz", QuizDirective)
    app.add_node(quiz, html=(visit_quiz, _close("</div>\n")))
    app.add_node(quiz_question, html=(visit_quiz_question, _close("</div>\n")))
    app.add_node(quiz_prompt, html=(visit_quiz_prompt, _close("</p>\n")))
    app.add_node(quiz_options, html=(visit_quiz_options, depart_quiz_options))
    app.add_node(quiz_option, html=(visit_quiz_option, depart_quiz_option))
    app.add_node(quiz_answers, html=(visit_quiz_answers, _close("</ul>\n</details>\n")))
    app.add_node(quiz_explanation, html=(visit_quiz_explanation, _close("</span></li>\n")))
    # The quiz's behaviour and look; both are in book/_static (html_static_path).
    app.add_js_file("quiz.js", loading_method="defer")
    app.add_css_file("quiz.css")
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
