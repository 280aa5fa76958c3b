"""Gradebooks that Canvas and Moodle import as they are, and feedback files for Moodle's bulk upload.

Usage (``python -m vitlab_grader grade ... --gradebook FILE --lms canvas|moodle``)::

    from vitlab_grader.lms import write_canvas, write_moodle, write_moodle_feedback

    notes = write_canvas(results, "canvas.csv", assignment="Chapter 7", points=10, roster="export.csv")
    notes = write_moodle(results, "worksheet.csv", points=100, worksheet="Grades-ch7.csv")
    write_moodle_feedback(results, "feedback/")  # zip the folder's contents, upload

The student ids must be the LMS's own: the grader reads them from the export's names
(:mod:`vitlab_grader.ids`): Canvas's user id (``ID``, the first number in a downloaded
name, not the SIS id), Moodle's participant id.

**Canvas** (Gradebook, Import). The file has Canvas's roster columns ``Student, ID, SIS
User ID, SIS Login ID, Section``, then one score column named after the assignment, and
Canvas's ``Points Possible`` row under the header, as in Canvas's own gradebook export.
Canvas matches a row by ``ID``; a column it does not know becomes a new assignment, so
the file has exactly one. With ``roster`` (Canvas's gradebook export, Gradebook, Export)
the names, SIS ids and sections are copied from it, every enrolled student has a row (a
student with no submission gets an empty score, which Canvas leaves unchanged) and the
assignment column takes the export's header (``Chapter 7 (12345)``, which names the
assignment by its Canvas id).

**Moodle** (assignment, View all submissions, Grading action "Upload grading
worksheet"; enable "Offline grading worksheet" in the assignment's feedback types). The
file is the offline grading worksheet: ``Identifier`` (``Participant 123456``), ``Full
name``, ``Email address``, ``Status``, ``Grade``, ``Maximum Grade``, ``Grade can be
changed``, ``Last modified (submission)``, ``Last modified (grade)``, ``Feedback
comments``. Moodle's importer needs ``Identifier``, ``Grade`` and ``Last modified
(grade)`` (``assignfeedback_offline_grade_importer::init``) and reads ``Feedback
comments`` as HTML. With ``worksheet`` (the worksheet downloaded from the same page,
"Download grading worksheet") every column and row is kept, only ``Grade`` and
``Feedback comments`` of the graded students are filled; without it, Moodle refuses to
overwrite a grade changed since "Last modified (grade)" unless "Allow updating records
that have been modified more recently in Moodle than in the spreadsheet" is ticked.

Moodle's feedback files (Grading action "Upload multiple feedback files in a zip") are
matched by folder: ``<Full name>_<participant id>_assignsubmission_file_/<file>``, the
folder names of "Download all submissions" (``assignfeedback_file_zip_importer::
is_valid_filename_for_import`` reads the id after the first ``_``).

A score is scaled to ``points`` (the score times ``points`` over the release's total) or
left as the sum of the exercises' points; it is empty, never 0, for a student with an
exercise the grader could not grade (the report says why).
"""

from __future__ import annotations

import csv
import html
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vitlab_grader.grade import NotebookResult
from vitlab_grader.ids import _CANVAS, _MOODLE
from vitlab_grader.report import (
    anomalies,
    by_student,
    clean,
    csv_cell,
    exercise_score,
    feedback_text,
    gradebook,
    is_late,
    number,
    shows_anomalies,
    total,
    unscored,
)

LMS = ("canvas", "moodle")
CANVAS_COLUMNS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
POINTS_POSSIBLE = "    Points Possible"  # Canvas's export writes the row's label so
MOODLE_COLUMNS = (
    "Identifier", "Full name", "Email address", "Status", "Grade", "Maximum Grade", "Grade can be changed",
    "Last modified (submission)", "Last modified (grade)", "Feedback comments",
)  # fmt: skip


@dataclass(frozen=True)
class CanvasName:
    """A Canvas download name, ``<name>_[LATE_]<user id>_<attachment id>_<file name>``."""

    name: str  # the sortable name, lower-cased, letters and digits only ("" when anonymous)
    late: bool
    user_id: str  # Canvas's user id (the gradebook's "ID"), or "anon_<id>"
    attachment: str
    file: str


def canvas_name(path: str | Path) -> CanvasName | None:
    """The parts of a Canvas download name (the rule of :mod:`vitlab_grader.ids`), or ``None``."""
    name = Path(path).name
    match = _CANVAS.match(name)
    if match is None:
        return None
    late = name[: match.start("id")].endswith("LATE_")
    parts = match.group("id", "attachment", "rest")
    return CanvasName(match.group("name") or "", late, *parts)


def canvas_late(path: str | Path) -> bool:
    """Whether Canvas marked the submission late: ``LATE`` before the user id in its download name."""
    found = canvas_name(path)
    return found is not None and found.late


def moodle_folder(path: str | Path) -> tuple[str, str, str] | None:
    """``(full name, participant id, folder)`` of a Moodle export path, nearest part first, or ``None``.

    ``folder`` is the export's per-student folder name (``Jane Doe_123456_assignsubmission_file_``),
    rebuilt from the file name's prefix where the export was flat.
    """
    for part in reversed(Path(path).parts):
        match = _MOODLE.match(part)
        if match is not None:
            name, participant = match.group("name"), match.group("id")
            return name, participant, f"{name}_{participant}_assignsubmission_{match.group('plugin')}_"
    return None


def _release_points(results: Iterable[NotebookResult]) -> dict[str, float]:
    """Each gradebook column's points, from whichever submission graded it."""
    points: dict[str, float] = {}
    for result in results:
        seen: dict[str, int] = {}
        for row in result.exercises:
            seen[row.exercise] = seen.get(row.exercise, 0) + 1
            column = row.exercise if seen[row.exercise] == 1 else f"{row.exercise} ({seen[row.exercise]})"
            points.setdefault(column, float(row.points))
    return points


def _scores(results: list[NotebookResult], points: float | None) -> tuple[dict[str, float | None], float, list[str]]:
    """``({student: score or None}, the most a student can score, notes)``; scores scaled to ``points``."""
    columns, rows = gradebook(results)
    worth = _release_points(results)
    best = sum(worth.values())
    grouped = by_student(results)
    scores: dict[str, float | None] = {}
    notes: list[str] = []
    for student, row in rows:
        got = total(row, grouped[student])
        missing = [c for c in columns if c not in row]
        if missing and got is not None:
            notes.append(f"{clean(student, lines=False)}: did not hand in {', '.join(missing)} (0 points)")
        if got is not None and points is not None:
            got = round(got * points / best, 4) if best else 0.0
        scores[student] = got
        if got is None:
            why = [n for r in grouped[student] for n in unscored(r)]
            notes.append(f"{clean(student, lines=False)}: no score: {' | '.join(why)}")
    return scores, (points if points is not None else best), notes


def _read_csv(path: str | Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def _cell(row: dict[str, str], column: str) -> str:
    return (row.get(column) or "").strip()


def canvas_column(header: Sequence[str], assignment: str) -> str:
    """The roster's column for ``assignment``: its exact header, ``<assignment> (<Canvas id>)``, else ``assignment``."""
    for column in header:
        if column == assignment or re.fullmatch(rf"{re.escape(assignment)} \(\d+\)", column):
            return column
    return assignment


def write_canvas(
    results: list[NotebookResult],
    path: str | Path,
    *,
    assignment: str,
    points: float | None = None,
    roster: str | Path | None = None,
) -> list[str]:
    """Canvas's grade-import CSV (the module's docstring); the notes for the instructor (no score, no submission).

    A submission's id is matched to the roster's ``ID`` (then ``SIS User ID``, ``SIS
    Login ID``); without a roster the row has the id and the name from the download name.
    """
    scores, best, notes = _scores(results, points)
    column = assignment
    rows: list[list[object]] = []
    done: set[str] = set()
    if roster is not None:
        header, entries = _read_csv(roster)
        absent = [c for c in ("Student", "ID") if c not in header]
        if absent:
            raise ValueError(f"{roster} is not a Canvas gradebook export: no column {', '.join(absent)}")
        column = canvas_column(header, assignment)
        for entry in entries:
            if not _cell(entry, "ID").isdigit():  # "Points Possible", "Manual Posting" and other label rows
                continue
            keys = [_cell(entry, c) for c in ("ID", "SIS User ID", "SIS Login ID")]
            student = next((k for k in keys if k and k in scores), None)
            if student is None:
                notes.append(f"no submission: {clean(_cell(entry, 'Student'), lines=False)} (ID {keys[0]})")
                score = None
            else:
                done.add(student)
                score = scores[student]
            rows.append([*(_cell(entry, c) for c in CANVAS_COLUMNS), score])
    names = {r.student: canvas_name(r.notebook) for r in results}
    for student in sorted(set(scores) - done):
        if roster is not None:
            notes.append(f"{clean(student, lines=False)}: not in the roster (graded, not imported by ID)")
        found = names.get(student)
        rows.append([found.name if found else "", student, "", "", "", scores[student]])
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\r\n")
        writer.writerow([*CANVAS_COLUMNS, csv_cell(column)])
        writer.writerow([POINTS_POSSIBLE, "", "", "", "", number(best)])
        writer.writerows([csv_cell(v) for v in row] for row in rows)
    return notes


def _comment(results: list[NotebookResult], anomalies_to: str = "instructor") -> str:
    """Moodle's ``Feedback comments`` (HTML, the student sees it): each exercise's status and points, why a
    score is missing, and (``anomalies_to="student"``) the anomalies; all escaped."""
    parts = []
    for result in results:
        late = " (late)" if is_late(result) else ""
        parts.append(f"{html.escape(clean(Path(result.notebook).name, lines=False))}{late}:")
        for row in result.exercises:
            score = exercise_score(row)
            worth = f"{number(score) if score is not None else '-'} / {number(row.points)}"
            parts.append(f"{html.escape(clean(row.exercise, lines=False))}: {html.escape(row.status)} {worth}")
        for note in unscored(result) + (anomalies(result) if shows_anomalies(anomalies_to) else []):
            parts.append(html.escape(clean(note, lines=False)))
    return "<br>".join(parts)


def write_moodle(
    results: list[NotebookResult],
    path: str | Path,
    *,
    points: float | None = None,
    worksheet: str | Path | None = None,
    anomalies_to: str = "instructor",
) -> list[str]:
    """Moodle's offline grading worksheet (the module's docstring); the notes for the instructor.

    The student ids must be participant ids (Moodle's "Download all submissions" names).
    """
    scores, best, notes = _scores(results, points)
    grouped = by_student(results)
    participants = {r.student: moodle_folder(r.notebook) for r in results}
    header = list(MOODLE_COLUMNS)
    rows: list[dict[str, object]] = []
    done: set[str] = set()
    if worksheet is not None:
        header, entries = _read_csv(worksheet)
        absent = [c for c in ("Identifier", "Grade", "Last modified (grade)") if c not in header]
        if absent:
            raise ValueError(f"{worksheet} is not a Moodle grading worksheet: no column {', '.join(absent)}")
        header += [] if "Feedback comments" in header else ["Feedback comments"]
        for entry in entries:
            row: dict[str, object] = dict(entry)
            student = _cell(entry, "Identifier").removeprefix("Participant ").strip()
            if student in scores:
                done.add(student)
                if scores[student] is not None:  # no score: the worksheet's grade stays
                    row["Grade"] = scores[student]
                row["Feedback comments"] = _comment(grouped[student], anomalies_to)
            else:
                notes.append(f"no submission: {clean(_cell(entry, 'Full name'), lines=False)} ({student})")
            rows.append(row)
    for student in sorted(set(scores) - done):
        found = participants.get(student)
        if found is None or found[1] != student:
            notes.append(f"{clean(student, lines=False)}: not a Moodle participant id (not in the worksheet)")
            continue
        if worksheet is not None:
            notes.append(f"{clean(student, lines=False)}: not in the worksheet (graded, not imported)")
            continue
        rows.append({
            "Identifier": f"Participant {student}", "Full name": found[0], "Status": "Submitted for grading",
            "Grade": scores[student], "Maximum Grade": best, "Grade can be changed": "Yes",
            "Feedback comments": _comment(grouped[student], anomalies_to),
        })  # fmt: skip
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\r\n")
        writer.writerow([csv_cell(c) for c in header])
        writer.writerows([csv_cell(row.get(c)) for c in header] for row in rows)
    return notes


def write_moodle_feedback(
    results: list[NotebookResult], folder: str | Path, fmt: str = "md", anomalies_to: str = "instructor"
) -> list[Path]:
    """One feedback file per submission, ``<folder>/<Full name>_<id>_assignsubmission_file_/feedback-<name>.<fmt>``.

    Zip the folder's contents (not the folder) and upload them with "Upload multiple
    feedback files in a zip". A submission without a Moodle participant id gets no file.
    """
    feedback_text(NotebookResult(""), fmt, anomalies_to)  # the format, before any file is written
    folder = Path(folder)
    written = []
    for result in results:
        found = moodle_folder(result.notebook)
        if found is None:
            continue
        name = re.sub(r"[^\w.+-]+", "_", clean(Path(result.notebook).name, lines=False)).lstrip(".")
        target = folder / _safe_part(found[2]) / f"feedback-{name.removesuffix('.ipynb')}.{fmt}"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(feedback_text(result, fmt, anomalies_to), encoding="utf-8")
        written.append(target)
    return written


def _safe_part(part: str) -> str:
    """A folder name from the export, as one safe path part (no separators, no leading dot, no controls)."""
    part = clean(part, lines=False).replace("/", " ").replace("\\", " ").replace("\x00", "")
    return part.lstrip(".") or "participant"
