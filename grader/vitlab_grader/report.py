"""What the grader writes: results, gradebook, JSON, feedback and the lines it prints.

Nothing a student controls is trusted on the way out. A submission's file name, its
student id (read from the name), the function names and messages that come back from
its kernel all reach files the instructor opens, so every writer here:

- strips control characters everywhere (terminal escape sequences whole, then every C0
  and C1 control, and the invisible Unicode format characters that reorder or hide
  text), :func:`clean`;
- neutralises spreadsheet formulas in CSV cells: a cell starting with ``=``, ``+``,
  ``-``, ``@``, a tab or a carriage return gets a leading ``'`` (OWASP's CSV-injection
  rule), :func:`csv_cell`;
- escapes Markdown and HTML in Markdown feedback (student text outside code is escaped,
  :func:`md_text`; messages go into fenced blocks longer than any run of backticks in
  them, so they cannot close the fence, :func:`md_fence`), and escapes everything in
  HTML feedback.

**No score is not zero.** An exercise the grader could not grade (``score is None``, or
a status other than ``PASS``, ``FAIL`` or ``TODO``: ``ERROR``, ``TIMEOUT``...) leaves its
gradebook cell empty, and the reason goes to the ``anomalies`` column and the feedback;
so does a submission with no graded exercise. A student's total is empty when any of
their exercises has no score.
"""

from __future__ import annotations

import csv
import html
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vitlab_grader.grade import ExerciseResult, NotebookResult

GRADED = ("PASS", "FAIL", "TODO")  # the statuses that carry a score
CSV_COLUMNS = (
    "notebook", "exercise", "function", "status", "message", "points", "fraction", "score", "student", "flags",
    "late", "anomalies",
)  # fmt: skip

# Terminal escape sequences, whole: CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), the
# 8-bit CSI and OSC, and the other two-character ESC sequences.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x9b[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[P^_X][^\x1b\x9c]*(?:\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?"
)
# Every C0 and C1 control but the newline (tab and CR are turned into spaces and newlines
# first), DEL, and the format characters that reorder or hide text (bidirectional
# overrides and isolates, zero-width characters, the byte-order mark).
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb]")
_FORMULA = ("=", "+", "-", "@", "\t", "\r")
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!|~:$])")


def clean(text: object, *, lines: bool = True) -> str:
    """``text`` without control characters: escape sequences whole, tabs as spaces, CRs as newlines.

    ``lines=False``: newlines become spaces too (one line).
    """
    text = _ESCAPES.sub("", str(text))
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    text = text.replace("\u2028", "\n").replace("\u2029", "\n").replace("\x85", "\n")
    text = _CONTROLS.sub("", text)
    return text if lines else " ".join(text.split("\n"))


def csv_cell(value: object) -> str:
    """A CSV cell: ``""`` for ``None``, a number without trailing zeros, else clean text that is no formula."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return number(value)
    text = clean(value)
    return "'" + text if text.lstrip(" \n").startswith(_FORMULA) else text


def number(x: float) -> str:
    """``1``, ``0.5``, ``0.6667``: points without trailing zeros."""
    return f"{round(x, 4):g}"


def md_text(text: object) -> str:
    """Student text for Markdown, on one line: Markdown punctuation backslash-escaped, HTML escaped."""
    return html.escape(_MARKDOWN.sub(r"\\\1", clean(text, lines=False)), quote=False)


def md_code(text: object) -> str:
    """An inline code span of ``text`` that its backticks cannot close (and a table's ``|`` cannot cut)."""
    body = clean(text, lines=False).replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if body.startswith("`") or body.endswith("`") else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def md_fence(text: object, info: str = "text") -> list[str]:
    """A fenced code block of ``text`` (Markdown and HTML are shown as they are), that nothing in it closes."""
    body = clean(text)
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{info}", *body.split("\n"), fence]


def exercise_score(row: ExerciseResult) -> float | None:
    """The exercise's score, or ``None`` where it has none (not graded: the reason is its message)."""
    score = getattr(row, "score", None)
    if score is None or row.status not in GRADED:
        return None
    return float(score)


def notebook_score(result: NotebookResult) -> float | None:
    """The notebook's score, or ``None`` when it has no exercise or any exercise has no score."""
    scores = [exercise_score(row) for row in result.exercises]
    if not scores or any(s is None for s in scores):
        return None
    return round(sum(s for s in scores if s is not None), 4)


def max_score(result: NotebookResult) -> float:
    return float(sum(row.points for row in result.exercises))


def unscored(result: NotebookResult) -> list[str]:
    """Why the notebook, or which of its exercises, has no score: ``"t2t_grids: not graded: ERROR ..."``."""
    if not result.exercises:
        return [f"not graded: {result.status}: {result.error or 'no exercise graded'}"]
    return [
        f"{row.exercise}: not graded: {row.status}: {clean(row.message, lines=False)}"
        for row in result.exercises
        if exercise_score(row) is None
    ]


def anomalies(result: NotebookResult) -> list[str]:
    """What the report says about a notebook besides its scores: anomalies, flags, missing isolation."""
    flags = [f"{r.exercise}: {r.flags}" for r in result.exercises if r.flags]
    notes = list(result.anomalies) + [f"copied reference, {flag}" for flag in flags]
    return notes + ([result.isolation] if result.isolation else [])


# Who reads the anomalies and flags: "instructor" (the report, JSON and gradebook only; the
# default) or "student" (the feedback too). An anomaly is a hint for the instructor to look
# at, not a verdict, and it tells a student who tries what the grader notices.
ANOMALIES = ("instructor", "student")


def shows_anomalies(anomalies_to: str) -> bool:
    """Whether the student's feedback shows the anomalies (``anomalies_to`` is one of :data:`ANOMALIES`)."""
    if anomalies_to not in ANOMALIES:
        raise ValueError(f"anomalies go to 'instructor' or 'student', got {anomalies_to!r}")
    return anomalies_to == "student"


def notes(result: NotebookResult) -> list[str]:
    """The report's notes on a notebook: why a score is missing, then its anomalies; clean, one line each."""
    return [clean(note, lines=False) for note in unscored(result) + anomalies(result)]


def is_late(result: NotebookResult) -> bool:
    """Whether Canvas marked the submission late (``LATE`` in the downloaded file's name)."""
    from vitlab_grader.lms import canvas_late

    return canvas_late(result.notebook)


def _rows(result: NotebookResult) -> list[ExerciseResult]:
    if result.exercises:
        return list(result.exercises)
    message = result.error or "the release notebook has no check cells"
    status = result.status if result.error and result.status != "OK" else ("ERROR" if result.error else "TODO")
    return [ExerciseResult(result.notebook, "", "", status, message, 0.0, 0.0, None, result.student)]  # type: ignore[arg-type]


def _writer(handle: Any) -> Any:
    return csv.writer(handle, lineterminator="\r\n")


def write_csv(results: Iterable[NotebookResult], path: str | Path) -> None:
    """The report: one row per (notebook, exercise), columns :data:`CSV_COLUMNS`; an unscored score is empty."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = _writer(handle)
        writer.writerow(CSV_COLUMNS)
        for result in results:
            late = "LATE" if is_late(result) else ""
            noted = " | ".join(notes(result))
            for row in _rows(result):
                score = exercise_score(row) if row.exercise else None
                fraction = row.fraction if score is not None else None
                values = [row.notebook, row.exercise, row.function, row.status, row.message, row.points, fraction,
                          score, row.student, row.flags, late, noted]  # fmt: skip
                writer.writerow([csv_cell(v) for v in values])


def gradebook(
    results: Iterable[NotebookResult],
) -> tuple[list[str], list[tuple[str, dict[str, float | None]]]]:
    """``(exercise columns, [(student id, {column: score or None})])``: one row per student, ids sorted.

    A student's notebooks (of different release notebooks: ids never collide,
    :func:`vitlab_grader.ids.student_ids`) share one row. Columns are the check names
    in the order they first appear; a check that two release notebooks both assign gets a
    second column ``name (2)``. ``None``: the exercise was not graded.
    """
    columns: list[str] = []
    students: dict[str, dict[str, float | None]] = {}
    for result in results:
        row = students.setdefault(result.student, {})
        for exercise in result.exercises:
            name = exercise.exercise
            column, n = name, 1
            while column in row:
                n += 1
                column = f"{name} ({n})"
            row[column] = exercise_score(exercise)
            if column not in columns:
                columns.append(column)
    return columns, sorted(students.items())


def total(scores: dict[str, float | None], results: Sequence[NotebookResult]) -> float | None:
    """A student's total: ``None`` when nothing was graded or any exercise has no score."""
    if not scores or any(s is None for s in scores.values()) or any(not r.exercises for r in results):
        return None
    return round(sum(s for s in scores.values() if s is not None), 4)


def by_student(results: Iterable[NotebookResult]) -> dict[str, list[NotebookResult]]:
    grouped: dict[str, list[NotebookResult]] = {}
    for result in results:
        grouped.setdefault(result.student, []).append(result)
    return grouped


def write_gradebook(results: list[NotebookResult], path: str | Path, id_column: str = "student_id") -> None:
    """The gradebook CSV: column ``id_column``, one column per exercise, ``total``, then ``anomalies``.

    ``anomalies`` lists, joined by `` | ``, why a cell is empty (an exercise not graded,
    with the reason), what differs from the release (edited or extra check cells, changed
    points...), the copied references flagged and a run without file isolation; none of
    them changes a score. An exercise not graded, or not handed in, is empty, and so is
    the total of a student with such an exercise: never 0.

    For an LMS that imports a plain id column and score columns, name ``id_column``
    after the field it matches students by; for Canvas and Moodle use
    :mod:`vitlab_grader.lms`, whose files import as they are.
    """
    columns, rows = gradebook(results)
    grouped = by_student(results)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = _writer(handle)
        writer.writerow([csv_cell(id_column), *map(csv_cell, columns), "total", "anomalies"])
        for student, scores in rows:
            noted = [note for r in grouped[student] for note in notes(r)]
            cells = [scores.get(c) for c in columns]
            values = (student, *cells, total(scores, grouped[student]), " | ".join(noted))
            writer.writerow([csv_cell(v) for v in values])


def write_json(results: list[NotebookResult], path: str | Path, timeout: float, **settings: Any) -> None:
    """Every notebook with its status, errors, run time, score and exercises; ``settings`` are recorded too.

    The text is cleaned of control characters; ``score`` is ``null`` where nothing was graded.
    """

    def tidy(value: Any) -> Any:
        if isinstance(value, str):
            return clean(value)
        if isinstance(value, list):
            return [tidy(v) for v in value]
        if isinstance(value, dict):
            return {k: tidy(v) for k, v in value.items()}
        return value

    notebooks = [
        {**asdict(r), "passed": r.passed, "total": r.total, "score": notebook_score(r), "max_score": max_score(r),
         "late": is_late(r), "flags": [f"{e.exercise}: {e.flags}" for e in r.exercises if e.flags],
         "unscored": unscored(r), "exercises": [asdict(e) for e in _rows(r)]}
        for r in results
    ]  # fmt: skip
    document = {"timeout": timeout, **settings, "notebooks": notebooks}
    Path(path).write_text(json.dumps(tidy(document), indent=1) + "\n", encoding="utf-8")


def _feedback_name(result: NotebookResult, used: set[str], suffix: str) -> str:
    stem = clean(Path(result.notebook).name, lines=False).removesuffix(".ipynb")
    stem = re.sub(r"[^\w.+-]+", "_", stem).lstrip(".") or "notebook"
    name, n = f"{stem}{suffix}", 1
    while name in used:
        n += 1
        name = f"{stem}-{n}{suffix}"
    used.add(name)
    return name


def _cases(row: ExerciseResult) -> str:
    return f"{row.fraction:.0%} of the cases" if exercise_score(row) is not None else "not graded"


def _points(row: ExerciseResult) -> str:
    score = exercise_score(row)
    return f"{number(score) if score is not None else '-'} / {number(row.points)}"


def _score_line(result: NotebookResult) -> tuple[str, str]:
    """``(score, what)``: ``("2.9 / 3", "1 of 2 exercises passed")`` or ``("not graded", why)``."""
    score = notebook_score(result)
    passed = f"{result.passed} of {result.total} exercises passed"
    if score is None:
        return "not graded", f"{passed}; not graded: {len(unscored(result))}"
    return f"{number(score)} / {number(max_score(result))}", passed


def feedback_markdown(result: NotebookResult, anomalies_to: str = "instructor") -> str:
    """A submission's feedback as Markdown: score, notebook problems, each exercise's status, points and message.

    Student text is escaped, or shown in fenced blocks it cannot close. The anomalies and
    flags are the instructor's (the report, the JSON, the gradebook) unless ``anomalies_to``
    is ``"student"`` (:data:`ANOMALIES`).
    """
    name = md_text(Path(result.notebook).name)
    lines = [f"# Feedback on {name}", ""]
    if result.student:
        lines += [f"Student: {md_text(result.student)}", ""]
    score, what = _score_line(result)
    unit = " points" if score != "not graded" else ""
    lines += [f"Score: **{score}**{unit} ({what}).", ""]
    if result.error:
        lines += [f"The notebook: {md_text(result.status)}:", "", *md_fence(result.error), ""]
    if result.first_error and result.first_error != result.error:
        lines += ["First error outside the checks:", "", *md_fence(result.first_error), ""]
    if unscored(result):
        lines += ["Not graded (the score is left empty, not 0):", ""]
        lines += [f"- {md_text(note)}" for note in unscored(result)] + [""]
    if anomalies(result) and shows_anomalies(anomalies_to):
        lines += ["Noted for your instructor (no effect on the score):", ""]
        lines += [f"- {md_text(note)}" for note in anomalies(result)] + [""]
    lines += ["| Exercise | Your function | Status | Cases | Points |", "|---|---|---|---|---|"]
    for row in _rows(result):
        function = md_code(row.function) if row.function else "-"
        exercise = md_code(row.exercise or "-")
        lines.append(f"| {exercise} | {function} | {md_text(row.status)} | {_cases(row)} | {_points(row)} |")
    lines.append("")
    for row in _rows(result):
        lines += [f"## {md_text(row.exercise or 'The notebook')}", "", *md_fence(row.message), ""]
    return "\n".join(lines)


_STYLE = (
    "<style>body{font-family:sans-serif;max-width:50em;margin:2em auto}"
    "td,th{border:1px solid #ccc;padding:.3em .6em}table{border-collapse:collapse}"
    "pre{background:#f6f6f6;padding:.6em;white-space:pre-wrap}</style>"
)


def feedback_html(result: NotebookResult, anomalies_to: str = "instructor") -> str:
    """The same content as :func:`feedback_markdown`, as a standalone HTML page; everything escaped."""

    def e(text: object) -> str:
        return html.escape(clean(text), quote=True)

    name = Path(result.notebook).name
    parts = [
        "<!DOCTYPE html>", '<html lang="en">', '<head><meta charset="utf-8">',
        f"<title>Feedback on {e(name)}</title>",
        _STYLE,
        "</head>", "<body>", f"<h1>Feedback on {e(name)}</h1>",
    ]  # fmt: skip
    if result.student:
        parts.append(f"<p>Student: {e(result.student)}</p>")
    score, what = _score_line(result)
    unit = " points" if score != "not graded" else ""
    parts.append(f"<p>Score: <strong>{e(score)}</strong>{unit} ({e(what)}).</p>")
    if result.error:
        parts.append(f"<p>The notebook: {e(result.status)}:</p><pre>{e(result.error)}</pre>")
    if result.first_error and result.first_error != result.error:
        parts.append(f"<p>First error outside the checks:</p><pre>{e(result.first_error)}</pre>")
    if unscored(result):
        parts.append("<p>Not graded (the score is left empty, not 0):</p><ul>")
        parts += [f"<li>{e(note)}</li>" for note in unscored(result)] + ["</ul>"]
    if anomalies(result) and shows_anomalies(anomalies_to):
        parts.append("<p>Noted for your instructor (no effect on the score):</p><ul>")
        parts += [f"<li>{e(note)}</li>" for note in anomalies(result)] + ["</ul>"]
    parts.append("<table><tr><th>Exercise</th><th>Your function</th><th>Status</th><th>Cases</th><th>Points</th></tr>")
    for row in _rows(result):
        parts.append(
            f"<tr><td><code>{e(row.exercise or '-')}</code></td><td><code>{e(row.function or '-')}</code></td>"
            f"<td>{e(row.status)}</td><td>{e(_cases(row))}</td><td>{e(_points(row))}</td></tr>"
        )
    parts.append("</table>")
    for row in _rows(result):
        parts += [f"<h2>{e(row.exercise or 'The notebook')}</h2>", f"<pre>{e(row.message)}</pre>"]
    parts += ["</body>", "</html>", ""]
    return "\n".join(parts)


def feedback_text(result: NotebookResult, fmt: str, anomalies_to: str = "instructor") -> str:
    if fmt not in ("md", "html"):
        raise ValueError(f"feedback format must be 'md' or 'html', got {fmt!r}")
    shows_anomalies(anomalies_to)
    return feedback_markdown(result, anomalies_to) if fmt == "md" else feedback_html(result, anomalies_to)


def write_feedback(
    results: list[NotebookResult], folder: str | Path, fmt: str = "md", anomalies_to: str = "instructor"
) -> list[Path]:
    """One feedback file per submission in ``folder`` (``<notebook name>.md`` or ``.html``); the paths written.

    The names are the submissions' names with anything but letters, digits and ``.+-_``
    replaced by ``_`` (a file name cannot leave ``folder``). ``anomalies_to``: :data:`ANOMALIES`.
    """
    feedback_text(NotebookResult(""), fmt, anomalies_to)  # the format, before any file is written
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    used: set[str] = set()
    written = []
    for result in results:
        target = folder / _feedback_name(result, used, f".{fmt}")
        target.write_text(feedback_text(result, fmt, anomalies_to), encoding="utf-8")
        written.append(target)
    return written


def summary(result: NotebookResult, width: int = 100) -> str:
    """A notebook's score line, then one line per exercise: status, check, points, message; no control characters."""
    score, what = _score_line(result)
    head = f"{clean(result.notebook, lines=False)}: {result.passed}/{result.total} passed, "
    head += f"{score.replace(' / ', '/')}{' points' if score != 'not graded' else ''} ({result.seconds:.1f} s)"
    if result.error:
        head += f", {clean(result.status, lines=False)}: {clean(result.error, lines=False)}"
    lines = [head] + [f"  anomaly: {clean(note, lines=False)}" for note in anomalies(result)]
    for row in _rows(result):
        message = "" if row.status == "PASS" else clean(row.message, lines=False)
        if row.exercise:  # "FAIL name [case 1/9: label]: what" -> "case 1/9: what"
            message = re.sub(rf"^(FAIL|TODO) {re.escape(row.exercise)}\b:?\s*", "", message)
            message = re.sub(r"^\[case (\d+/\d+)[^\]]*\]:\s*", r"case \1: ", message)
        worth = _points(row).replace(" / ", "/")
        status, exercise = clean(row.status, lines=False), clean(row.exercise or "-", lines=False)
        text = f"  {status:<8} {exercise:<30} {worth:>7}  {message}".rstrip()
        lines.append(text if len(text) <= width else text[: width - 3] + "...")
    return "\n".join(lines)
