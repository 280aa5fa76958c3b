"""Canvas and Moodle files that import as they are, from exports in each LMS's real layout."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from vitlab_grader.grade import ExerciseResult, NotebookResult
from vitlab_grader.ids import student_ids
from vitlab_grader.lms import (
    CANVAS_COLUMNS,
    MOODLE_COLUMNS,
    canvas_late,
    canvas_name,
    write_canvas,
    write_moodle,
    write_moodle_feedback,
)
from vitlab_grader.report import write_csv

# Canvas's gradebook export (Gradebook, Export): the header, the "Points Possible" row, a student per row.
CANVAS_ROSTER = """Student,ID,SIS User ID,SIS Login ID,Section,Chapter 9 (4321),Current Score,Final Score
    Points Possible,,,,,10.00,(read only),(read only)
"Doe, Jane",12345,S001,jdoe,Section A,,,
"Smith, Bob",23456,S002,bsmith,Section A,,,
"Lee, Ann",34567,S003,alee,Section B,,,
"Roe, Rick",45678,S004,rroe,Section B,,,
"""
# Moodle's offline grading worksheet, as "Download grading worksheet" writes it.
MOODLE_WORKSHEET = """Identifier,Full name,Email address,Status,Grade,Maximum Grade,Grade can be changed,\
Last modified (submission),Last modified (grade),Feedback comments
Participant 123456,Jane Doe,jane@example.org,Submitted for grading,,100.00,Yes,"Monday, 2 June 2025, 10:00 AM",-,
Participant 234567,Bob Smith,bob@example.org,Submitted for grading,,100.00,Yes,"Monday, 2 June 2025, 11:00 AM",-,
Participant 345678,Ann Lee,ann@example.org,No submission,55.00,100.00,Yes,-,"Monday, 2 June 2025, 9:00 AM",
"""


def rows(notebook: str, student: str, statuses: list[tuple[str, float | None]]) -> NotebookResult:
    exercises = [
        ExerciseResult(notebook, f"ex{i}", "f", status, f"{status} ex{i}", 2.0, (score or 0) / 2, score, student)  # type: ignore[arg-type]
        for i, (status, score) in enumerate(statuses)
    ]
    return NotebookResult(notebook, student=student, exercises=exercises)


def canvas_results(folder: Path) -> list[NotebookResult]:
    names = [
        "doejane_LATE_12345_67890_09_pit.ipynb",
        "smithbob_23456_67891_09_pit.ipynb",
        "leeann_34567_67892_09_pit.ipynb",
        "newstudent_99999_67893_09_pit.ipynb",
    ]
    paths = [folder / name for name in names]
    ids = student_ids(paths, root=folder)
    assert list(ids.values()) == ["12345", "23456", "34567", "99999"]  # Canvas's user id, not the SIS id
    return [
        rows(str(paths[0]), ids[paths[0]], [("PASS", 2.0), ("FAIL", 1.0)]),
        rows(str(paths[1]), ids[paths[1]], [("PASS", 2.0), ("PASS", 2.0)]),
        rows(str(paths[2]), ids[paths[2]], [("PASS", 2.0), ("ERROR", None)]),  # not graded: empty, never 0
        rows(str(paths[3]), ids[paths[3]], [("FAIL", 0.0), ("FAIL", 0.0)]),
    ]


def read(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.reader(handle))


def test_canvas_names_keep_the_late_marker() -> None:
    found = canvas_name("subs/doejane_LATE_12345_67890_09_pit.ipynb")
    assert found is not None and (found.name, found.late, found.user_id, found.attachment, found.file) == (
        "doejane",
        True,
        "12345",
        "67890",
        "09_pit.ipynb",
    )
    assert canvas_late("doejane_LATE_12345_67890_09_pit.ipynb") and not canvas_late("doejane_12345_67890_09_pit.ipynb")
    assert not canvas_late("LATE_09_pit.ipynb")


def test_canvas_import_with_a_roster(tmp_path: Path) -> None:
    (tmp_path / "roster.csv").write_text(CANVAS_ROSTER, encoding="utf-8")
    results = canvas_results(tmp_path)
    notes = write_canvas(
        results, tmp_path / "canvas.csv", assignment="Chapter 9", points=10, roster=tmp_path / "roster.csv"
    )
    header, possible, *body = read(tmp_path / "canvas.csv")
    assert header == [*CANVAS_COLUMNS, "Chapter 9 (4321)"]  # the roster's column: Canvas's assignment id
    assert possible == ["    Points Possible", "", "", "", "", "10"]
    by_id = {line[1]: line for line in body}
    assert by_id["12345"] == ["Doe, Jane", "12345", "S001", "jdoe", "Section A", "7.5"]  # 3 of 4 points, of 10
    assert by_id["23456"][-1] == "10" and by_id["34567"][-1] == ""  # not graded: empty
    assert by_id["45678"] == ["Roe, Rick", "45678", "S004", "rroe", "Section B", ""]  # no submission
    assert by_id["99999"][:2] == ["newstudent", "99999"] and by_id["99999"][-1] == "0"
    assert "no submission: Roe, Rick (ID 45678)" in notes
    assert any(n.startswith("34567: no score: ex1: not graded: ERROR") for n in notes)
    assert "99999: not in the roster (graded, not imported by ID)" in notes
    write_csv(results, tmp_path / "report.csv")
    report = list(csv.DictReader(open(tmp_path / "report.csv", encoding="utf-8")))
    assert {r["student"]: r["late"] for r in report} == {"12345": "LATE", "23456": "", "34567": "", "99999": ""}


def test_canvas_import_without_a_roster_has_one_score_column(tmp_path: Path) -> None:
    write_canvas(canvas_results(tmp_path), tmp_path / "canvas.csv", assignment="=cmd|'/C calc'!A0")
    header, possible, *body = read(tmp_path / "canvas.csv")
    assert header == [*CANVAS_COLUMNS, "'=cmd|'/C calc'!A0"] and possible[-1] == "4"  # raw points
    assert [line[:2] + line[-1:] for line in body] == [
        ["doejane", "12345", "3"],
        ["smithbob", "23456", "4"],
        ["leeann", "34567", ""],
        ["newstudent", "99999", "0"],
    ]


def moodle_results(folder: Path) -> list[NotebookResult]:
    paths = [
        folder / "Jane Doe_123456_assignsubmission_file_" / "09_pit.ipynb",
        folder / "Bob Smith_234567_assignsubmission_file_" / "09_pit.ipynb",
        folder / "Eve Hacker_456789_assignsubmission_file_" / "09_pit.ipynb",
    ]
    ids = student_ids(paths, root=folder)
    assert list(ids.values()) == ["123456", "234567", "456789"]
    return [
        rows(str(paths[0]), ids[paths[0]], [("PASS", 2.0), ("FAIL", 1.0)]),
        rows(str(paths[1]), ids[paths[1]], [("PASS", 2.0), ("TIMEOUT", None)]),
        NotebookResult(
            str(paths[2]),
            student=ids[paths[2]],
            exercises=[
                ExerciseResult(str(paths[2]), "ex0", "f", "FAIL", "<script>alert(1)</script>", 2.0, 0.0, 0.0, "456789"),
                ExerciseResult(str(paths[2]), "ex1", "f", "FAIL", "x", 2.0, 0.0, 0.0, "456789"),
            ],
            anomalies=['=HYPERLINK("http://evil")<img src=x onerror=alert(1)>'],
        ),
    ]


def test_moodle_worksheet_fills_grade_and_feedback(tmp_path: Path) -> None:
    (tmp_path / "worksheet.csv").write_text(MOODLE_WORKSHEET, encoding="utf-8")
    notes = write_moodle(
        moodle_results(tmp_path), tmp_path / "out.csv", points=100, worksheet=tmp_path / "worksheet.csv"
    )
    header, *body = read(tmp_path / "out.csv")
    assert header == list(MOODLE_COLUMNS)
    by_id = {line[0]: dict(zip(header, line, strict=True)) for line in body}
    assert list(by_id) == ["Participant 123456", "Participant 234567", "Participant 345678"]
    assert (
        by_id["Participant 123456"]["Grade"] == "75"
        and "ex1: FAIL 1 / 2" in by_id["Participant 123456"]["Feedback comments"]
    )
    assert by_id["Participant 234567"]["Grade"] == ""  # not graded: the worksheet's (empty) grade stays
    assert "not graded: TIMEOUT" in by_id["Participant 234567"]["Feedback comments"]
    assert by_id["Participant 345678"]["Grade"] == "55.00"  # no submission: untouched
    assert by_id["Participant 345678"]["Last modified (grade)"] == "Monday, 2 June 2025, 9:00 AM"
    assert "no submission: Ann Lee (345678)" in notes
    assert "456789: not in the worksheet (graded, not imported)" in notes


def test_moodle_worksheet_without_a_download(tmp_path: Path) -> None:
    write_moodle(moodle_results(tmp_path), tmp_path / "out.csv", anomalies_to="student")  # the anomalies too
    header, *body = read(tmp_path / "out.csv")
    assert header == list(MOODLE_COLUMNS) and "Last modified (grade)" in header  # Moodle's importer needs it
    by_id = {line[0]: dict(zip(header, line, strict=True)) for line in body}
    eve = by_id["Participant 456789"]
    assert (eve["Full name"], eve["Grade"], eve["Maximum Grade"]) == ("Eve Hacker", "0", "4")
    assert "<img" not in eve["Feedback comments"] and "&lt;img" in eve["Feedback comments"]  # Moodle reads HTML
    assert not eve["Feedback comments"].startswith(("=", "+", "-", "@"))


def test_moodle_feedback_files_are_named_for_the_zip_upload(tmp_path: Path) -> None:
    written = write_moodle_feedback(moodle_results(tmp_path / "subs"), tmp_path / "feedback")
    names = sorted(p.relative_to(tmp_path / "feedback").as_posix() for p in written)
    assert names == [
        "Bob Smith_234567_assignsubmission_file_/feedback-09_pit.md",
        "Eve Hacker_456789_assignsubmission_file_/feedback-09_pit.md",
        "Jane Doe_123456_assignsubmission_file_/feedback-09_pit.md",
    ]
    for name in names:  # Moodle's importer: the participant id after the first "_" of the path
        folder, _ = name.split("/")
        assert folder.split("_")[1].isdigit() and folder.split("_")[2:4] == ["assignsubmission", "file"]


def test_the_lms_flags_are_checked_before_grading(tmp_path: Path) -> None:
    from vitlab_grader.__main__ import main

    base = ["grade", str(tmp_path), "--release", str(tmp_path), "--out", str(tmp_path / "r.csv")]
    for extra in (["--lms", "canvas"], ["--lms", "canvas", "--gradebook", "g.csv"], ["--roster", "x.csv"]):
        with pytest.raises(SystemExit):
            main([*base, *extra])
