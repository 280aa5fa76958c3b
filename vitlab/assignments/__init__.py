"""The instructor's workflow: validate chapters, make student copies, grade submissions.

From the command line (``python -m vitlab.assignments --help``)::

    python -m vitlab.assignments validate notebooks/
    python -m vitlab.assignments student notebooks/ --out student/
    python -m vitlab.assignments grade submissions/ --release student/ --out results.csv --json results.json \
        --timeout 300 --cell-timeout 60 --gradebook gradebook.csv --feedback feedback/

An instructor notebook marks its exercises with cell tags (``exercise``, ``solution``,
``check``, ``answer``; see :mod:`vitlab.assignments.exercises`). ``nbformat`` and
``nbclient`` are imported only when a notebook is read or run, so ``vitlab`` itself does
not need them.
"""

from vitlab.assignments.exercises import (
    AssignmentError,
    Exercise,
    NotebookReport,
    find_notebooks,
    inspect_notebook,
)
from vitlab.assignments.grade import (
    ExerciseResult,
    NotebookResult,
    grade,
    grade_notebook,
    student_id,
    write_csv,
    write_feedback,
    write_gradebook,
    write_json,
)
from vitlab.assignments.release import Release, read_release
from vitlab.assignments.student import StudentCopy, make_student, student_notebook

__all__ = [
    "AssignmentError",
    "Exercise",
    "ExerciseResult",
    "NotebookReport",
    "NotebookResult",
    "Release",
    "StudentCopy",
    "find_notebooks",
    "grade",
    "grade_notebook",
    "inspect_notebook",
    "make_student",
    "read_release",
    "student_id",
    "student_notebook",
    "write_csv",
    "write_feedback",
    "write_gradebook",
    "write_json",
]
