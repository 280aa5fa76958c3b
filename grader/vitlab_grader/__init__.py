"""The instructor's workflow: validate chapters, make student copies, grade submissions.

From the command line (``python -m vitlab_grader --help``)::

    python -m vitlab_grader validate notebooks/
    python -m vitlab_grader student notebooks/ --out student/
    python -m vitlab_grader grade submissions/ --release student/ --out results.csv --json results.json \
        --timeout 300 --cell-timeout 60 --gradebook gradebook.csv --feedback feedback/

An instructor notebook marks its exercises with cell tags (``exercise``, ``solution``,
``check``, ``answer``; see :mod:`vitlab_grader.exercises`).

This package is the instructor's alone (distribution ``vitlab-grader``, in ``grader/`` of
the course's repository): it depends on ``vitlab``, whose exercise checks it runs, and
``vitlab`` never imports it. Students, Colab and the notebooks do not install it.
"""

from vitlab_grader.exercises import (
    AssignmentError,
    Exercise,
    NotebookReport,
    find_notebooks,
    inspect_notebook,
)
from vitlab_grader.grade import ExerciseResult, NotebookResult, grade, grade_notebook
from vitlab_grader.ids import StudentIdError, student_id, student_ids
from vitlab_grader.lms import write_canvas, write_moodle, write_moodle_feedback
from vitlab_grader.release import Release, read_release
from vitlab_grader.report import write_csv, write_feedback, write_gradebook, write_json
from vitlab_grader.specs import check_spec
from vitlab_grader.student import StudentCopy, make_student, student_notebook

__all__ = [
    "AssignmentError",
    "Exercise",
    "ExerciseResult",
    "NotebookReport",
    "NotebookResult",
    "Release",
    "StudentCopy",
    "StudentIdError",
    "check_spec",
    "find_notebooks",
    "grade",
    "grade_notebook",
    "inspect_notebook",
    "make_student",
    "read_release",
    "student_id",
    "student_ids",
    "student_notebook",
    "write_canvas",
    "write_csv",
    "write_feedback",
    "write_gradebook",
    "write_json",
    "write_moodle",
    "write_moodle_feedback",
]
