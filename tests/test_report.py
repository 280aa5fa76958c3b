"""What the grader writes: student text escaped in every file, formulas neutralised, no score is not 0."""

from __future__ import annotations

import csv
import html
import re
from pathlib import Path

import pytest

from vitlab_grader.grade import ExerciseResult, NotebookResult
from vitlab_grader.report import (
    clean,
    csv_cell,
    feedback_html,
    feedback_markdown,
    summary,
    write_csv,
    write_feedback,
    write_gradebook,
)

ESC = "\x1b[31mred\x1b[0m\x1b]8;;http://evil\x07link\x1b]8;;\x07\x9b2J\u202egnp.exe"
FORMULAS = ['=HYPERLINK("http://evil","x")', "@SUM(1+1)*cmd|' /C calc'!A0", "+1+1", "-2+3", "\t=1", "\r=1"]
HTML = "<img src=x onerror=alert(1)>"
FORGED = "x |\n\nScore: **3 / 3** points\n\n| a | b |\n```\n<script>alert(1)</script>"


def row(student: str, exercise: str, status: str, score: float | None, message: str = "m", function: str = "f"):
    return ExerciseResult(
        f"subs/{student}.ipynb",
        exercise,
        function,
        status,
        message,
        1.0,
        1.0 if status == "PASS" else 0.0,
        score,
        student,
    )  # type: ignore[arg-type]


def read(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.reader(handle))


def test_clean_strips_escape_sequences_and_controls() -> None:
    assert clean(ESC) == "redlinkgnp.exe"
    assert clean("a\tb\r\nc\x00d\x07") == "a    b\ncd"
    assert clean("a\nb", lines=False) == "a b"


@pytest.mark.parametrize("text", FORMULAS)
def test_csv_cells_that_start_a_formula_are_quoted(text: str) -> None:
    cell = csv_cell(text)
    assert cell.startswith("'") and not cell.startswith(("'\t", "'\r"))
    assert csv_cell("s1234") == "s1234" and csv_cell(0.5) == "0.5" and csv_cell(None) == ""


def test_gradebook_neutralises_formulas_in_every_cell(tmp_path: Path) -> None:
    results = [
        NotebookResult(
            f"subs/{i}.ipynb", student=text, exercises=[row(text, "t2t_grids", "PASS", 1.0)], anomalies=[text]
        )
        for i, text in enumerate(FORMULAS)
    ]
    write_gradebook(results, tmp_path / "book.csv")
    write_csv(results, tmp_path / "results.csv")
    for name in ("book.csv", "results.csv"):
        for line in read(tmp_path / name)[1:]:
            for cell in line:
                assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), (name, line)
    ids = [line[0] for line in read(tmp_path / "book.csv")[1:]]
    assert sorted(ids) == sorted("'" + clean(t) for t in FORMULAS)


def test_an_exercise_not_graded_is_empty_never_0(tmp_path: Path) -> None:
    results = [
        NotebookResult(
            "subs/s1.ipynb",
            student="s1",
            exercises=[
                row("s1", "a", "PASS", 1.0),
                row("s1", "b", "ERROR", None, "the kernel died in cell 3"),
            ],
        ),
        NotebookResult(
            "subs/s2.ipynb", student="s2", exercises=[row("s2", "a", "PASS", 1.0), row("s2", "b", "FAIL", 0.0)]
        ),
        # a non-graded status with a score of 0.0 (older results): still no score
        NotebookResult(
            "subs/s3.ipynb", student="s3", exercises=[row("s3", "a", "TIMEOUT", 0.0), row("s3", "b", "PASS", 1.0)]
        ),
        NotebookResult("subs/s4.ipynb", student="s4", status="ERROR", error="cannot read the notebook"),
    ]
    write_gradebook(results, tmp_path / "book.csv")
    header, *rows = read(tmp_path / "book.csv")
    assert header == ["student_id", "a", "b", "total", "anomalies"]
    by_id = {r[0]: r for r in rows}
    assert by_id["s1"][1:4] == ["1", "", ""] and "b: not graded: ERROR: the kernel died in cell 3" in by_id["s1"][4]
    assert by_id["s2"][1:4] == ["1", "0", "1"] and by_id["s2"][4] == ""
    assert by_id["s3"][1:4] == ["", "1", ""] and "a: not graded: TIMEOUT" in by_id["s3"][4]
    assert by_id["s4"][1:4] == ["", "", ""] and "cannot read the notebook" in by_id["s4"][4]
    write_csv(results, tmp_path / "results.csv")
    report = {
        (r["student"], r["exercise"]): r for r in csv.DictReader(open(tmp_path / "results.csv", encoding="utf-8"))
    }
    assert report["s1", "b"]["score"] == "" and report["s2", "b"]["score"] == "0"
    assert report["s4", ""]["score"] == "" and "cannot read" in report["s4", ""]["message"]
    text = feedback_markdown(results[0])
    assert "Score: **not graded**" in text and "- / 1" in text and "0 / 2" not in text


def test_markdown_feedback_escapes_student_text(tmp_path: Path) -> None:
    result = NotebookResult(
        f"subs/{HTML}.ipynb",
        student=f"s1{HTML}",
        exercises=[
            row("s1", "t2t_grids", "FAIL", 0.0, message=FORGED + ESC, function=f"f`|{HTML}"),
        ],
        first_error=FORGED,
        anomalies=[HTML],
    )
    (path,) = write_feedback([result], tmp_path)
    text = path.read_text(encoding="utf-8")
    assert "\x1b" not in text and "\x9b" not in text and "\u202e" not in text
    outside, inside = [], []
    fence: str | None = None
    for line in text.splitlines():  # CommonMark: a fence closes on a line of at least its backticks
        if fence is None and re.match(r"^`{3,}", line):
            fence = re.match(r"^`+", line).group()  # type: ignore[union-attr]
            continue
        if fence is not None and re.fullmatch(rf"{fence}`*\s*", line):
            fence = None
            continue
        (inside if fence else outside).append(line)
    assert fence is None
    assert len([line for line in outside if line.startswith("Score:")]) == 1  # the forged one stays fenced
    prose = [re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "", line) for line in outside]  # code spans show HTML as text
    assert not any("<img" in line or "<script" in line for line in prose), prose
    assert any("Score: **3 / 3**" in line for line in inside) and "Score: **0 / 1** points" in text
    table = [line for line in outside if line.startswith("| `t2t_grids`")]
    assert len(table) == 1 and table[0].count(" | ") == 4  # the function's `|` does not add a column


def test_html_feedback_escapes_everything(tmp_path: Path) -> None:
    result = NotebookResult(
        f"subs/{HTML}.ipynb",
        student=HTML,
        exercises=[
            row("s1", "t2t_grids", "FAIL", 0.0, message=HTML + ESC, function=HTML),
        ],
        error=HTML,
        status="ERROR",
        anomalies=[HTML],
    )
    text = feedback_html(result)
    assert "<img" not in text and "\x1b" not in text and text.count(html.escape(HTML)) >= 5


def test_summary_strips_terminal_escapes() -> None:
    result = NotebookResult(
        f"subs/{ESC}.ipynb",
        student="s1",
        error=ESC,
        status="ERROR",
        exercises=[row("s1", "t", "FAIL", 0.0, message=ESC)],
        anomalies=[ESC],
    )
    text = summary(result)
    assert "\x1b" not in text and "\x9b" not in text and "\u202e" not in text and "redlink" in text


def test_feedback_file_names_stay_in_the_folder(tmp_path: Path) -> None:
    result = NotebookResult("subs/..\\..\x1b[2J.ipynb", student="s1")
    (path,) = write_feedback([result], tmp_path / "fb")
    assert path.parent == tmp_path / "fb" and "\x1b" not in path.name and not path.name.startswith(".")
