"""The chapter quizzes (book/_ext/quiz.py): their content, their format, and how they behave.

Fast: every chapter has one quiz, just before its exercises, whose questions each have one
right option and an explanation for every option; the parser rejects a malformed quiz and
says what it expected; each question, option and explanation is its own gettext message.
Slow (the book, then a browser, as in test_browser.py): one chapter in each edition,
answered wrong and then right, by mouse and by keyboard, at laptop and phone width.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from book_browser import SCREENSHOTS, axe, is_local

from conftest import ROOT, toc_files

sys.path.insert(0, str(ROOT / "book" / "_ext"))
from quiz import LABELS, MAX_QUESTIONS, MIN_QUESTIONS, QuizError, parse_quiz  # noqa: E402 (book/_ext is no package)

pytest_plugins = ["book_build"]  # the book, built once (`html`); `site` serves it, `browser` opens it

HEADING = "## Check your understanding"
CHAPTERS = [page for page in toc_files() if page.startswith("notebooks/")]


def _cells(page: str) -> list[dict[str, Any]]:
    return json.loads((ROOT / f"{page}.ipynb").read_text(encoding="utf-8"))["cells"]


def _text(cell: dict[str, Any]) -> str:
    return "".join(cell["source"])


def _quiz_body(source: str) -> str:
    """The text between ``:::{quiz}`` and the closing ``:::`` of a cell."""
    start = source.index(":::{quiz}") + len(":::{quiz}")
    return source[start : source.rindex(":::")]


@pytest.mark.parametrize("page", CHAPTERS)
def test_chapter_has_a_quiz_before_its_exercises(page: str) -> None:
    """One quiz cell per chapter, right before the Exercises (or, without them, the Summary)."""
    cells = _cells(page)
    quizzes = [i for i, cell in enumerate(cells) if cell["cell_type"] == "markdown" and _text(cell).startswith(HEADING)]
    assert len(quizzes) == 1, f"{page}: expected one '{HEADING}' cell, got {len(quizzes)}"
    after = _text(cells[quizzes[0] + 1])
    has_exercises = any(_text(cell).startswith("## Exercises") for cell in cells if cell["cell_type"] == "markdown")
    expected = "## Exercises" if has_exercises else "## Summary"
    assert after.startswith(expected), f"{page}: the quiz should come right before '{expected}', not {after[:40]!r}"
    assert _text(cells[quizzes[0]]).count(":::{quiz}") == 1


@pytest.mark.parametrize("page", CHAPTERS)
def test_quiz_questions_have_one_right_option_and_every_explanation(page: str) -> None:
    cell = next(_text(c) for c in _cells(page) if _text(c).startswith(HEADING))
    questions = parse_quiz(_quiz_body(cell))
    assert MIN_QUESTIONS <= len(questions) <= MAX_QUESTIONS
    for number, question in enumerate(questions, 1):
        assert sum(option.right for option in question.options) == 1, f"{page} Q{number}"
        assert all(option.explanation for option in question.options), f"{page} Q{number}"
    # A reader should not learn that "the answer is always B".
    assert len({question.answer for question in questions}) > 1, f"{page}: every right answer has the same letter"


GOOD = """
**Q{n}.** Question {n}?

- A. one
- B. two

<details><summary>Answer</summary>

- A. ✓ because
- B. ✗ because not

</details>
"""


def _quiz(count: int = 3) -> str:
    return "".join(GOOD.format(n=n) for n in range(1, count + 1))


def test_parser_reads_a_good_quiz() -> None:
    questions = parse_quiz(_quiz())
    assert [q.text for q in questions] == ["Question 1?", "Question 2?", "Question 3?"]
    assert [(o.text, o.right, o.explanation) for o in questions[0].options] == [
        ("one", True, "because"),
        ("two", False, "because not"),
    ]


MALFORMED = {  # what breaks the quiz: (the broken text, what the error must say)
    "no right": (("- A. ✓ because\n", "- A. ✗ because\n"), "expected exactly one ✓ explanation, got 0"),
    "two right": (("- B. ✗ because not\n", "- B. ✓ because not\n"), "expected exactly one ✓ explanation, got 2"),
    "missing explanation": (("- B. ✗ because not\n", ""), "expected one explanation per option, ['A', 'B'], got ['A']"),
    "letters": (("- B. two\n", "- C. two\n"), "lettered A, B, C, ... in order, got ['A', 'C']"),
    "no mark": (("- A. ✓ because\n", "- A. because\n"), "expected '- A. ✓ ...' or '- A. ✗ ...', got 'because'"),
    "no summary": (("<summary>Answer</summary>", ""), "expected '<details><summary>Answer</summary>', got '<details>'"),
    "numbering": (("**Q2.**", "**Q3.**"), "expected question '**Q2.** ...', got '**Q3.** Question 2?'"),
}


@pytest.mark.parametrize(
    ("broken", "message"),
    [(_quiz().replace(*edit, 1), message) for edit, message in MALFORMED.values()]
    + [
        (_quiz(2), "expected 3 to 6 questions, got 2"),
        (_quiz(7), "expected 3 to 6 questions, got 7"),
        (_quiz().rstrip().removesuffix("</details>"), "expected '</details>', got '(the end)'"),
    ],
    ids=[*MALFORMED, "too few", "too many", "unclosed"],
)
def test_parser_rejects_a_malformed_quiz(broken: str, message: str) -> None:
    with pytest.raises(QuizError) as caught:
        parse_quiz(broken)
    assert message in str(caught.value)


def test_each_question_option_and_explanation_is_a_message(tmp_path: Path) -> None:
    """The gettext builder extracts every text of a chapter's quiz as a message of its own, without
    the letters and marks, so the editions translate them through the page's catalogue."""
    sphinx = pytest.importorskip("sphinx.cmd.build")
    page = CHAPTERS[0]
    cell = next(_text(c) for c in _cells(page) if _text(c).startswith(HEADING))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / 'book' / '_ext')!r})\n"
        "extensions = ['myst_parser', 'quiz']\nmyst_enable_extensions = ['colon_fence', 'dollarmath']\n"
    )
    (tmp_path / "src" / "index.md").write_text(f"# Quiz\n\n{cell}\n", encoding="utf-8")
    out = tmp_path / "pot"
    assert sphinx.build_main(["-q", "-b", "gettext", str(tmp_path / "src"), str(out)]) == 0
    import polib

    messages = {entry.msgid for entry in polib.pofile(str(out / "index.pot"))}
    for question in parse_quiz(_quiz_body(cell)):
        texts = [question.text, *(o.text for o in question.options), *(o.explanation for o in question.options)]
        missing = [text for text in texts if text not in messages]
        assert not missing, f"not extracted as messages: {missing}"


# --- In a browser: one chapter per edition, wrong then right ------------------------------------

PAGE = "notebooks/14_speed_memory"  # the lightest chapter page, so the test stays short
EDITIONS = {"en": "", "ko": "ko/", "zh_CN": "zh/"}
WIDTHS = {"laptop": {"width": 1280, "height": 900}, "phone": {"width": 390, "height": 844}}

# The state a reader sees after pressing Check, read from the DOM.
FEEDBACK = """(question) => {
    const feedback = question.querySelector(".vl-quiz-feedback");
    return {
        verdict: feedback.querySelector("strong") ? feedback.querySelector("strong").textContent : "",
        text: feedback.textContent,
        state: feedback.className,
        live: feedback.getAttribute("role") + "/" + feedback.getAttribute("aria-live"),
        marked: [...question.querySelectorAll(".vl-quiz-option")]
            .map((o) => o.className.replace("vl-quiz-option", "").trim()),
    };
}"""


def _answer(page: Any, question: Any, option: int, *, keyboard: bool) -> dict[str, Any]:
    """Choose an option and press Check, by keyboard (focus the group, arrow keys choose, Enter
    on the button) or by mouse or touch (click the option's label); return the FEEDBACK."""
    if keyboard:
        radios = question.locator("input[type=radio]")
        checked = radios.evaluate_all("(rs) => rs.findIndex((r) => r.checked)")
        if checked < 0:
            radios.first.focus()
            page.keyboard.press("Space")
            checked = 0
        else:
            radios.nth(checked).focus()
        for _ in range(abs(option - checked)):
            page.keyboard.press("ArrowDown" if option > checked else "ArrowUp")
        for _ in range(10):  # past any math in the options (MathJax makes formulas focusable)
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.className") == "vl-quiz-check":
                break
        else:
            pytest.fail("Tab from the options never reaches the Check button")
        page.keyboard.press("Enter")
    else:
        question.locator(".vl-quiz-option").nth(option).click()
        question.locator(".vl-quiz-check").click()
    return question.evaluate(FEEDBACK)


def _wrong_then_right(page: Any, question: Any, labels: dict[str, str], *, keyboard: bool) -> None:
    question.scroll_into_view_if_needed()
    button = question.locator(".vl-quiz-check")
    assert button.is_visible() and button.text_content() == labels["check"]
    button.click()  # nothing chosen yet
    assert question.evaluate(FEEDBACK)["text"] == labels["pick"]

    answer = int(question.get_attribute("data-answer") or "")
    wrong = next(i for i in range(question.locator("input[type=radio]").count()) if i != answer)
    shown = _answer(page, question, wrong, keyboard=keyboard)
    why = question.locator(f".vl-quiz-explanation[data-option='{wrong}'] .vl-quiz-text").text_content() or ""
    assert shown["verdict"] == labels["wrong"] and "is-wrong" in shown["state"], shown
    assert why.strip() and why.strip() in shown["text"], "the feedback shows the chosen option's explanation"
    assert shown["marked"][wrong] == "is-wrong" and shown["live"] == "status/polite"

    shown = _answer(page, question, answer, keyboard=keyboard)
    assert shown["verdict"] == labels["right"] and "is-right" in shown["state"], shown
    assert shown["marked"][answer] == "is-right", shown
    assert "is-wrong" not in shown["marked"], "a new choice clears the old verdict"


@pytest.mark.slow
@pytest.mark.parametrize("language", EDITIONS)
def test_quiz_answered_wrong_then_right(browser: Any, site: str, language: str) -> None:
    """At laptop width the first question is answered by keyboard, then at phone width the
    second by touch (the same page, resized); axe checks the answered quiz once, in English."""
    labels = LABELS[language]
    context = browser.new_context(viewport=WIDTHS["laptop"])
    errors: list[str] = []
    external: list[str] = []

    def block(route: Any) -> None:
        external.append(route.request.url)
        route.abort()

    context.route(lambda url: not is_local(url), block)
    page = context.new_page()
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        page.goto(f"{site}{EDITIONS[language]}{PAGE}.html", wait_until="load")
        questions = page.locator(".vl-quiz-question")
        for width, number in (("laptop", 0), ("phone", 1)):
            page.set_viewport_size(WIDTHS[width])
            _wrong_then_right(page, questions.nth(number), labels, keyboard=width == "laptop")
            sideways = page.evaluate("document.documentElement.scrollWidth > window.innerWidth + 1")
            assert not sideways, f"the page scrolls sideways at {width} width"
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            questions.nth(number).screenshot(path=SCREENSHOTS / f"quiz_{language}_{width}.png")
        if language == "en":
            violations = axe(page, ".vl-quiz")
            assert not violations, f"the answered quiz has accessibility violations: {violations}"
    finally:
        context.close()
    assert not errors, f"console errors: {errors}"
    assert not external, f"requests to other hosts: {external}"
