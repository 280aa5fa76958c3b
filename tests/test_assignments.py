"""vitlab_grader: student copies leak nothing and run; grading reads every kind of submission.

The notebooks here are fabricated (tests/grader_release.py): two "implement it" exercises on real checks
(``t2t_token_count``, ``scaled_dot_product_attention``) and one question. Kernels are the
slow part (a few seconds each), so one module fixture runs them all in one ``grade`` call,
with the notebook of the per-cell limits graded beside it in a second process.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from grader_release import (  # the fabricated course notebook, shared with test_gradescope.py
    ATTENTION_PITFALL_1,
    ATTENTION_RIGHT,
    ATTENTION_STUB,
    MARKER,
    TOKEN_HANGS,
    TOKEN_PITFALL_9,
    TOKEN_RIGHT,
    TOKEN_STUB,
    TOKEN_SYNTAX_ERROR,
    TOKEN_WRONG_AT_224,
    instructor_notebook,
    submission,
    write,
)
from nbformat.v4 import new_code_cell

from vitlab_grader import AssignmentError, make_student, student_notebook
from vitlab_grader.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 20  # seconds per notebook: a normal one here needs ~5 s, the hanging one uses all of it


# ---------------------------------------------------------------- student copies (no kernel)


def test_student_copy_hides_solutions_answers_outputs_and_metadata(tmp_path: Path) -> None:
    source = write(instructor_notebook(), tmp_path / "instructor" / "ch.ipynb")
    (copy,) = make_student([source.parent], tmp_path / "student")
    text = copy.target.read_text(encoding="utf-8")
    assert MARKER not in text, "instructor-only text leaked into the student notebook"
    assert (copy.solutions_removed, copy.answers_removed) == (2, 1)
    assert [(e.function, e.check) for e in copy.exercises] == [
        ("token_count", "t2t_token_count"), ("attention", "scaled_dot_product_attention")
    ]  # fmt: skip

    student = json.loads(text)
    assert set(student["metadata"]) == {"kernelspec", "language_info", "vitlab"}
    import vitlab

    # the stamp the grader matches by, and the vitlab version the release pins
    assert student["metadata"]["vitlab"] == {"release": "ch", "vitlab": vitlab.__version__}
    assert len(student["cells"]) == len(instructor_notebook().cells) - 3
    for cell in student["cells"]:
        assert set(cell["metadata"]) <= {"tags", "vitlab"}, cell["metadata"]
        assert set(cell["metadata"].get("tags", [])) <= {"exercise", "check"}
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None
    stubs = [c for c in student["cells"] if "exercise" in c["metadata"].get("tags", [])]
    assert ["".join(c["source"]) for c in stubs] == [TOKEN_STUB, ATTENTION_STUB]
    assert sum("check" in c["metadata"].get("tags", []) for c in student["cells"]) == 2
    worth = [c["metadata"].get("vitlab") for c in student["cells"] if "check" in c["metadata"].get("tags", [])]
    assert worth == [None, {"points": 2.0}]  # the points travel with the check; the default is not written
    assert student["cells"][1]["attachments"] == {"grid.png": {"image/png": "aGVsbG8="}}  # used: kept
    nbformat.validate(nbformat.reads(text, as_version=4))


BROKEN = {
    "solution without a stub": (lambda cells: cells.pop(2), "does not follow a code cell tagged 'exercise'"),
    "check missing": (lambda cells: cells.pop(4), "not followed by a code cell tagged 'check'"),
    "solution of another function": (
        lambda cells: setattr(cells[3], "source", TOKEN_RIGHT.replace("token_count", "tokens")),
        "expected the stub's function 'token_count'",
    ),
    "stub that returns": (
        lambda cells: setattr(cells[2], "source", "def token_count(size, kernel, stride, padding):\n    return 0"),
        "must raise NotImplementedError",
    ),
    "stub called after its check": (
        lambda cells: setattr(cells[-1], "source", "print(token_count(224, 7, 4, 2))"),
        "cell 12, line 1: uses 'token_count', but the student's stub raises NotImplementedError",
    ),
    "helper only a solution defines": (
        lambda cells: (
            setattr(cells[3], "source", TOKEN_RIGHT + "\n\nSIDE = token_count(224, 7, 4, 2)"),
            setattr(cells[-1], "source", "print(SIDE)"),
        ),
        "uses 'SIDE', but only the solution defines it",
    ),
    "untagged answer": (lambda cells: cells[10].metadata.pop("tags"), "answer dropdown in an untagged cell"),
    "check of no exercise": (
        lambda cells: cells.insert(1, new_code_cell("vitlab.checks.patchify(f);", metadata={"tags": ["check"]})),
        "a check cell that follows no exercise",
    ),
    "unknown check": (
        lambda cells: setattr(cells[4], "source", "vitlab.checks.token_count(token_count);"),
        "vitlab.checks has no check named 'token_count'",
    ),
    "points that are not a number": (
        lambda cells: cells[4].metadata.update({"vitlab": {"points": "two"}}),
        "metadata vitlab.points must be a number >= 0",
    ),
    "stored check output is not PASS": (
        lambda cells: cells[4].outputs.append(
            nbformat.v4.new_output("stream", name="stdout", text="FAIL t2t_token_count [case 1/9: ...]: ...\n")
        ),
        "the stored output of the check is not a PASS line",
    ),
}


@pytest.mark.parametrize("case", BROKEN)
def test_student_refuses_a_notebook_that_breaks_the_format(tmp_path: Path, case: str) -> None:
    edit, message = BROKEN[case]
    notebook = instructor_notebook()
    edit(notebook.cells)
    with pytest.raises(AssignmentError, match=message.replace("(", r"\(").replace(")", r"\)")):
        student_notebook(notebook)
    path = write(notebook, tmp_path / "ch.ipynb")
    assert main(["student", str(path), "--out", str(tmp_path / "out")]) == 1
    assert not (tmp_path / "out").exists(), "nothing may be written when a notebook is refused"


def test_student_never_overwrites_its_source(tmp_path: Path) -> None:
    path = write(instructor_notebook(), tmp_path / "ch.ipynb")
    with pytest.raises(AssignmentError, match="would overwrite it"):
        make_student([path], tmp_path)


def test_validate_lists_exercises_and_fails_on_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(instructor_notebook(), tmp_path / "good.ipynb")
    assert main(["validate", str(good)]) == 0
    out = capsys.readouterr().out
    assert "2 exercises, 1 question" in out
    assert "token_count -> vitlab.checks.t2t_token_count  (cells 2, 3, 4; 1 point)" in out
    assert "attention -> vitlab.checks.scaled_dot_product_attention  (cells 6, 7, 8; 2 points)" in out

    bad = instructor_notebook()
    bad.cells.pop(4)
    write(bad, tmp_path / "bad.ipynb")
    assert main(["validate", str(tmp_path)]) == 1
    assert "bad.ipynb: 1 exercise, 1 question, 1 problem" in capsys.readouterr().out


def test_the_course_notebooks_make_student_copies_without_solutions(tmp_path: Path) -> None:
    """Every chapter passes the format checks, and no solution or answer reaches its copy."""
    copies = make_student([ROOT / "notebooks"], tmp_path)
    assert len(copies) == len(list((ROOT / "notebooks").glob("*.ipynb")))
    assert sum(c.solutions_removed for c in copies) >= 1, "no chapter has a cell tagged 'solution' yet"
    for copy in copies:
        instructor = json.loads(copy.source.read_text(encoding="utf-8"))
        written = copy.target.read_text(encoding="utf-8")
        student_sources = "\n".join("".join(c["source"]) for c in json.loads(written)["cells"])
        for cell in instructor["cells"]:
            tags = cell["metadata"].get("tags", [])
            if "solution" in tags or "answer" in tags:
                assert "".join(cell["source"]).strip() not in student_sources, f"{copy.source.name} leaks a {tags}"
        assert '"solution"' not in written and '"answer"' not in written
        assert '"outputs": []' in written or '"cell_type": "code"' not in written


def test_vitlab_needs_none_of_the_graders_dependencies() -> None:
    """``vitlab`` and its checks import where the grader's own requirements are not installed (Colab)."""
    blocked = ("nbformat", "nbclient", "jupyter_client", "vitlab_grader")
    code = f"import sys\nfor name in {blocked!r}:\n    sys.modules[name] = None\n"
    code += "import vitlab, vitlab.checks, vitlab.notebook"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------- grading (kernels)


# The tests below share one fixture that grades eight notebooks in kernels, and beside them,
# in a second `grade` process, the notebook of the per-cell limits (about 60 s on two busy
# cores: both mostly wait on hanging cells), so they are marked slow; the fast tests after
# them cover the same code on fabricated results.

STUBBORN = """import time

while True:  # does not stop when interrupted: the grader must restart the kernel
    try:
        time.sleep(0.1)
    except KeyboardInterrupt:
        pass"""
CELL_LIMIT = 15  # seconds per cell: above the import of torch and vitlab in a kernel on a busy two-core machine


def start_cell_limit_run(student: Path, folder: Path) -> tuple[subprocess.Popen, Path, list[int]]:
    """Start, in a process of its own, the grading of a notebook whose cells pass ``CELL_LIMIT``.

    Its token check hangs (interrupted) and a cell before the attention check ignores the
    interrupt (a restart and a replay); ``(the process, its JSON, the check cells' indices)``.
    """
    path = submission(student, TOKEN_HANGS, ATTENTION_RIGHT, folder / "s7_ch.ipynb")
    notebook = nbformat.read(path, as_version=4)
    checks = [i for i, c in enumerate(notebook.cells) if "check" in c.metadata.get("tags", [])]
    notebook.cells.insert(checks[1], new_code_cell(STUBBORN))
    notebook.cells.insert(checks[0] + 1, new_code_cell("undefined_name"))
    nbformat.write(notebook, path)
    out = folder / "results.json"
    argv = ["grade", str(path), "--release", str(student), "--out", str(folder / "r.csv"), "--json", str(out)]
    argv += ["--timeout", "300", "--cell-timeout", str(CELL_LIMIT)]
    with open(folder / "stdout.txt", "w", encoding="utf-8") as log:  # the child keeps its own copy
        process = subprocess.Popen([sys.executable, "-m", "vitlab_grader", *argv], stdout=log, stderr=subprocess.STDOUT)
    return process, out, checks


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Student copy made by the CLI, five submissions and a broken file, graded in one call.

    The notebook of the per-cell limits is graded at the same time in another process
    (``"cell_limit"``): its kernel mostly sleeps, as the hanging notebook here does.
    """
    root = tmp_path_factory.mktemp("course")
    instructor = write(instructor_notebook(), root / "instructor" / "ch.ipynb")
    (copy,) = make_student([instructor], root / "cell_limit" / "release")  # first: the longest run starts now
    process, cell_limit_json, checks = start_cell_limit_run(copy.target, root / "cell_limit")
    command = ["-m", "vitlab_grader", "student", str(root / "instructor"), "--out", str(root / "student")]
    subprocess.run([sys.executable, *command], check=True, capture_output=True, text=True)
    student = root / "student" / "ch.ipynb"
    subs = root / "submissions"
    paths = [  # the hanging one first, so that its wait overlaps the others
        submission(student, TOKEN_HANGS, ATTENTION_RIGHT, subs / "hangs.ipynb"),
        student,
        submission(student, TOKEN_RIGHT, ATTENTION_RIGHT, subs / "full.ipynb"),
        submission(student, TOKEN_RIGHT, ATTENTION_STUB, subs / "partial.ipynb"),
        submission(student, TOKEN_PITFALL_9, ATTENTION_PITFALL_1, subs / "wrong.ipynb"),
        submission(student, TOKEN_SYNTAX_ERROR, ATTENTION_STUB, subs / "broken.ipynb"),
        submission(student, TOKEN_WRONG_AT_224, ATTENTION_RIGHT, subs / "s0042_01_ch.ipynb"),
    ]
    (subs / "garbage.ipynb").write_text("this is not a notebook")
    paths.append(subs / "garbage.ipynb")
    out_csv, out_json, book = root / "results.csv", root / "results.json", root / "gradebook.csv"
    argv = ["grade", *map(str, paths), "--release", str(root / "student"), "--out", str(out_csv)]
    argv += ["--json", str(out_json), "--timeout", str(TIMEOUT), "--id-source", "file"]
    argv += ["--gradebook", str(book), "--id-column", "SIS User ID", "--feedback", str(root / "feedback")]
    # two at a time: kernel start-up and imports overlap, and the worker pool is exercised
    stdout = io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout):
            assert main([*argv, "--jobs", "2"]) == 0
    finally:
        returncode = process.wait(timeout=600)
    log = (root / "cell_limit" / "stdout.txt").read_text(encoding="utf-8")
    assert returncode == 0, log
    (cell_limit,) = json.loads(cell_limit_json.read_text())["notebooks"]
    with open(out_csv, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    by_name: dict[str, list[dict[str, str]]] = {}
    for row in rows:  # keyed "student" for the copy, else the submission's file name
        name = "student" if Path(row["notebook"]) == student else Path(row["notebook"]).name
        by_name.setdefault(name, []).append(row)
    with open(book, newline="", encoding="utf-8") as handle:
        gradebook = list(csv.reader(handle))
    feedback = {p.name: p.read_text(encoding="utf-8") for p in (root / "feedback").iterdir()}
    return {
        "rows": by_name, "json": json.loads(out_json.read_text()), "stdout": stdout.getvalue(),
        "gradebook": gradebook, "feedback": feedback, "cell_limit": cell_limit, "cell_limit_checks": checks,
    }  # fmt: skip


def pitfall(check: str, answer: str) -> str:
    """``"Pitfall 9"``: the words the check itself gives this wrong answer (pitfalls are renumbered at times)."""
    import vitlab.checks

    namespace: dict[str, Any] = {}
    exec("import torch\n" + answer, namespace)  # noqa: S102 - the test's own wrong answer
    function = next(v for k, v in namespace.items() if callable(v) and k in ("token_count", "attention"))
    with contextlib.redirect_stdout(io.StringIO()):
        number = getattr(vitlab.checks, check)(function).pitfall
    assert number is not None, f"{check} does not name this wrong answer as a pitfall"
    return f"Pitfall {number}"


def statuses(graded: dict, name: str) -> dict[str, str]:
    return {row["exercise"]: row["status"] for row in graded["rows"][name]}


def messages(graded: dict, name: str) -> dict[str, str]:
    return {row["exercise"]: row["message"] for row in graded["rows"][name]}


TOKEN, ATTENTION = "t2t_token_count", "scaled_dot_product_attention"


@pytest.mark.slow
def test_student_copy_runs_end_to_end_with_todo_lines(graded: dict) -> None:
    assert statuses(graded, "student") == {TOKEN: "TODO", ATTENTION: "TODO"}
    assert messages(graded, "student")[TOKEN] == f"TODO {TOKEN}: not implemented yet"
    (result,) = [n for n in graded["json"]["notebooks"] if n["notebook"].endswith("student/ch.ipynb")]
    assert (result["status"], result["error"], result["passed"], result["total"]) == ("OK", "", 0, 2)


@pytest.mark.slow
def test_grade_full_and_partial_solutions(graded: dict) -> None:
    assert statuses(graded, "full.ipynb") == {TOKEN: "PASS", ATTENTION: "PASS"}
    assert re.fullmatch(rf"PASS {TOKEN}: all \d+ cases match the reference", messages(graded, "full.ipynb")[TOKEN])
    assert statuses(graded, "partial.ipynb") == {TOKEN: "PASS", ATTENTION: "TODO"}
    assert [r["function"] for r in graded["rows"]["full.ipynb"]] == ["token_count", "attention"]


@pytest.mark.slow
def test_grade_names_the_pitfalls_of_wrong_answers(graded: dict) -> None:
    assert statuses(graded, "wrong.ipynb") == {TOKEN: "FAIL", ATTENTION: "FAIL"}
    assert pitfall(TOKEN, TOKEN_PITFALL_9) in messages(graded, "wrong.ipynb")[TOKEN]
    assert pitfall(ATTENTION, ATTENTION_PITFALL_1) in messages(graded, "wrong.ipynb")[ATTENTION]


@pytest.mark.slow
def test_grade_reports_a_crash_and_runs_the_later_checks(graded: dict) -> None:
    assert statuses(graded, "broken.ipynb") == {TOKEN: "FAIL", ATTENTION: "TODO"}
    assert "raised NameError: name 'token_count' is not defined" in messages(graded, "broken.ipynb")[TOKEN]
    (result,) = [n for n in graded["json"]["notebooks"] if n["notebook"].endswith("broken.ipynb")]
    cell = "cell 2 (`def token_count(size, kernel stride, padding):`)"  # where it is, in the student's words
    assert result["status"] == "ERROR" and result["error"].startswith(f"{cell}: SyntaxError"), result["error"]
    assert result["first_error"] == result["error"]


@pytest.mark.slow
def test_grade_stops_a_hanging_notebook_and_goes_on(graded: dict) -> None:
    assert statuses(graded, "hangs.ipynb") == {TOKEN: "TIMEOUT", ATTENTION: "TIMEOUT"}
    assert f"ran past the {TIMEOUT} s limit in the check of token_count" in messages(graded, "hangs.ipynb")[TOKEN]
    assert messages(graded, "hangs.ipynb")[ATTENTION].startswith("not run: ")
    (result,) = [n for n in graded["json"]["notebooks"] if n["notebook"].endswith("hangs.ipynb")]
    assert result["status"] == "TIMEOUT" and TIMEOUT <= result["seconds"] < TIMEOUT + 15


@pytest.mark.slow
def test_grade_reports_an_unreadable_file(graded: dict) -> None:
    (row,) = graded["rows"]["garbage.ipynb"]
    assert row["status"] == "ERROR" and row["message"].startswith("cannot read the notebook")


@pytest.mark.slow
def test_grade_prints_a_summary_per_notebook(graded: dict) -> None:
    out = graded["stdout"]
    assert "full.ipynb: 2/2 passed" in out and "partial.ipynb: 1/2 passed" in out
    assert "wrong.ipynb: 0/2 passed" in out and pitfall(TOKEN, TOKEN_PITFALL_9) in out
    assert "8 notebooks graded: 4/14 exercises passed" in out


def notebook_json(graded: dict, name: str) -> dict:
    (result,) = [n for n in graded["json"]["notebooks"] if Path(n["notebook"]).name == name]
    return result


@pytest.mark.slow
def test_grade_gives_partial_credit_times_the_points(graded: dict) -> None:
    """9 of 10 cases right: 0.9 of the exercise's point; the 2-point exercise passed: 2."""
    result = notebook_json(graded, "s0042_01_ch.ipynb")
    token, attention = result["exercises"]
    assert token["status"] == "FAIL" and token["points"] == 1 and 0 < token["fraction"] < 1
    assert token["score"] == pytest.approx(token["fraction"])
    assert (attention["status"], attention["points"], attention["fraction"], attention["score"]) == ("PASS", 2, 1, 2)
    assert result["score"] == pytest.approx(2 + token["fraction"]) and result["max_score"] == 3
    assert token["message"].startswith(f"FAIL {TOKEN} [case 1/")  # the first failure, as the student saw it
    (row,) = [r for r in graded["rows"]["s0042_01_ch.ipynb"] if r["exercise"] == ATTENTION]
    assert (row["points"], row["fraction"], row["score"], row["student"]) == ("2", "1", "2", "s0042")


@pytest.mark.slow
def test_the_grader_counts_the_cases_itself(graded: dict) -> None:
    """The grader compares the answers it got back: the share of cases, whatever the cell printed."""
    token = notebook_json(graded, "s0042_01_ch.ipynb")["exercises"][0]
    match = re.search(r"\[case \d+/(\d+): ", token["message"])
    assert match, token["message"]
    cases = int(match.group(1))
    assert token["fraction"] == pytest.approx((cases - 1) / cases)  # wrong only at size 224


def test_all_or_nothing_scores_only_a_pass(tmp_path: Path) -> None:
    from vitlab_grader.grade import ExerciseResult, _score

    assert _score("FAIL", 2.0, 0.9, all_or_nothing=True) == 0 and _score("PASS", 2.0, 1.0, True) == 2
    assert _score("FAIL", 2.0, 0.9, all_or_nothing=False) == 1.8 and _score("TIMEOUT", 2.0, 0.9, False) == 0
    assert ExerciseResult("n", "e", "f", "PASS", "m").points == 1  # the default


@pytest.mark.slow
def test_the_gradebook_has_one_row_per_student_and_a_total(graded: dict) -> None:
    header, *rows = graded["gradebook"]
    assert header == ["SIS User ID", TOKEN, ATTENTION, "total", "anomalies"]
    by_id = {row[0]: row[1:-1] for row in rows}
    assert by_id["full"] == ["1", "2", "3"] and by_id["partial"] == ["1", "0", "1"]
    assert by_id["s0042"][1:] == ["2", f"{2 + float(by_id['s0042'][0]):g}"]
    assert by_id["garbage"] == ["", "", ""]  # nothing graded: empty scores
    notes = {row[0]: row[-1] for row in rows}
    assert notes["garbage"].startswith("not graded") and "graded again alone" in notes["hangs"]
    honest = [note for name, note in notes.items() if name not in {"garbage", "hangs"}]
    assert all(note == "" or "file isolation unavailable" in note for note in honest)
    assert [row[0] for row in rows] == sorted(by_id)


def test_student_ids_come_from_the_file_name_by_an_overridable_pattern() -> None:
    from vitlab_grader import student_id

    assert student_id("subs/s1234_07_t2t_vit.ipynb") == "s1234"
    assert student_id("subs/jane_doe_07_t2t_vit.ipynb") == "jane_doe"  # the name before "_NN_"
    assert student_id("full.ipynb") == "full"  # no match: the whole name
    assert student_id("07_t2t_vit-jdoe.ipynb", pattern=r"-(\w+)\.ipynb$") == "jdoe"  # group 1
    assert student_id("jdoe@uni.edu 07.ipynb", pattern=r"^(?P<id>\S+@\S+)") == "jdoe@uni.edu"  # group id


@pytest.mark.slow
def test_feedback_has_a_file_per_submission_with_status_points_and_full_message(graded: dict) -> None:
    feedback = graded["feedback"]
    assert len(feedback) == 8 and "s0042_01_ch.md" in feedback and "ch.md" in feedback
    text = feedback["wrong.md"]
    assert "Score: **0 / 3** points" in text
    wrong = notebook_json(graded, "wrong.ipynb")["exercises"]
    for exercise in wrong:
        assert f"| `{exercise['exercise']}` | `{exercise['function']}` | FAIL |" in text
        assert f"```text\n{exercise['message']}\n```" in text  # the full message, not cut
    assert pitfall(TOKEN, TOKEN_PITFALL_9) in text
    assert "cannot read the notebook" in feedback["garbage.md"]


def test_feedback_as_html_escapes_the_messages(tmp_path: Path) -> None:
    from vitlab_grader import write_feedback
    from vitlab_grader.grade import ExerciseResult, NotebookResult

    row = ExerciseResult("a/s1_ch.ipynb", "t", "f", "FAIL", "FAIL t [case 1/2: x<y]: got <b>", 2.0, 0.5, 1.0, "s1")
    (path,) = write_feedback([NotebookResult("a/s1_ch.ipynb", exercises=[row], student="s1")], tmp_path, "html")
    text = path.read_text(encoding="utf-8")
    assert path.name == "s1_ch.html" and "<pre>FAIL t [case 1/2: x&lt;y]: got &lt;b&gt;</pre>" in text
    assert "<td>1 / 2</td>" in text and "Score: <strong>1 / 2</strong>" in text


# ---------------------------------------------------------------- results, gradebook, data (no kernel)


def fabricated_results() -> list:
    from vitlab_grader.grade import ExerciseResult, NotebookResult

    def row(path: str, student: str, check: str, status: str, points: float, fraction: float) -> ExerciseResult:
        score = round(points * fraction, 4)
        return ExerciseResult(path, check, "f", status, f"{status} {check}", points, fraction, score, student)

    return [
        NotebookResult("b/s2_ch.ipynb", student="s2", exercises=[
            row("b/s2_ch.ipynb", "s2", TOKEN, "FAIL", 1, 0.9), row("b/s2_ch.ipynb", "s2", ATTENTION, "PASS", 2, 1),
        ]),
        NotebookResult("a/s1_ch.ipynb", student="s1", exercises=[row("a/s1_ch.ipynb", "s1", ATTENTION, "TODO", 2, 0)]),
        NotebookResult("a/s1_other.ipynb", student="s1",
                       exercises=[row("a/s1_other.ipynb", "s1", TOKEN, "PASS", 1, 1)]),
    ]  # fmt: skip


def test_gradebook_merges_a_students_notebooks_and_sorts_by_id(tmp_path: Path) -> None:
    from vitlab_grader import write_gradebook

    write_gradebook(fabricated_results(), tmp_path / "book.csv", id_column="SID")
    with open(tmp_path / "book.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    assert rows == [
        ["SID", TOKEN, ATTENTION, "total", "anomalies"],
        ["s1", "1", "0", "1", ""],
        ["s2", "0.9", "2", "2.9", ""],
    ]


def test_feedback_markdown_without_a_kernel(tmp_path: Path) -> None:
    from vitlab_grader import write_feedback

    paths = write_feedback(fabricated_results(), tmp_path)
    assert [p.name for p in paths] == ["s2_ch.md", "s1_ch.md", "s1_other.md"]
    text = paths[0].read_text(encoding="utf-8")
    assert "Score: **2.9 / 3** points (1 of 2 exercises passed)." in text
    assert f"| `{TOKEN}` | `f` | FAIL | 90% of the cases | 0.9 / 1 |" in text


# ---------------------------------------------------------------- per-cell time limits (kernels, slow)


@pytest.mark.slow
def test_a_cell_past_its_limit_costs_only_that_cell(graded: dict) -> None:
    """A hanging check is interrupted; a cell that ignores the interrupt gets a restart and a replay.

    The later check still passes (the replay defined ``attention`` and imported vitlab again),
    and the JSON keeps the first error outside the checks although the notebook timed out.
    Graded by ``start_cell_limit_run``, beside the fixture's other notebooks.
    """
    result, checks = graded["cell_limit"], graded["cell_limit_checks"]
    token, attention = result["exercises"]
    assert (token["status"], token["score"]) == ("TIMEOUT", 0)
    assert token["message"] == f"ran past the {CELL_LIMIT} s cell limit in the check of token_count ({TOKEN})"
    assert (attention["status"], attention["score"]) == ("PASS", 2), attention
    assert result["status"] == "TIMEOUT" and result["restarts"] == 1
    assert result["timed_out_cells"] == [checks[1] + 1]  # the stubborn cell, numbered as in the submission
    error = "NameError: name 'undefined_name' is not defined"
    assert result["first_error"] == f"cell {checks[0] + 1} (`undefined_name`): {error}"


# ---------------------------------------------------------------- the docs list every chapter


def chapter_checks() -> dict[int, list[str]]:
    """``{chapter number: the checks its check cells call, in order}`` for every chapter notebook."""
    found = {}
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        notebook = json.loads(path.read_text(encoding="utf-8"))
        cells = [c for c in notebook["cells"] if "check" in c["metadata"].get("tags", [])]
        calls = [re.search(r"checks\.(\w+)\(", "".join(c["source"])) for c in cells]
        if calls:
            found[int(path.name[:2])] = [m.group(1) for m in calls if m]
    return found


def test_the_instructors_page_lists_every_chapter_with_its_checks() -> None:
    page = (ROOT / "book" / "instructors.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| [^|]+ \| [^|]+ \| ([^|]+) \|$", page, re.M)
    table = {int(n): re.findall(r"`(\w+)`", checks) for n, checks in rows if "`" in checks}  # not the Gradescope table
    assert table == chapter_checks()


def test_the_readme_links_every_chapter() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for number in chapter_checks():
        (path,) = (ROOT / "notebooks").glob(f"{number:02d}_*.ipynb")
        assert f"| {number:02d} |" in readme and f"(notebooks/{path.name})" in readme, path.name


# ---------------------------------------------------------------- the release (no kernel)


def test_a_submission_is_matched_to_its_release_notebook_by_name_then_stamp(tmp_path: Path) -> None:
    from vitlab_grader.release import match_release, read_release

    for name in ("07_t2t_vit", "09_pit"):
        write(instructor_notebook(), tmp_path / "instructor" / f"{name}.ipynb")
    make_student([tmp_path / "instructor"], tmp_path / "release")
    releases = read_release([tmp_path / "release"])
    stamped = {"metadata": {"vitlab": {"release": "07_t2t_vit"}}}
    for file in ("s1_09_pit.ipynb", "Copy of 09_pit (1).ipynb", "doejane_12345_678_09_pit.ipynb"):
        release, anomalies = match_release(Path(file), {"metadata": {}}, releases)
        assert release is not None and release.name == "09_pit" and anomalies == [], file
    release, anomalies = match_release(Path("s1_09_pit.ipynb"), stamped, releases)  # the name decides
    assert release is not None and release.name == "09_pit"
    assert anomalies == ["the notebook's stamp names the release notebook '07_t2t_vit'; graded as '09_pit'"]
    release, _ = match_release(Path("homework.ipynb"), stamped, releases)  # no name: the stamp
    assert release is not None and release.name == "07_t2t_vit"
    assert match_release(Path("homework.ipynb"), {"metadata": {}}, releases)[0] is None


def test_a_release_ships_its_folders_data_at_the_same_paths(tmp_path: Path) -> None:
    from vitlab_grader.release import read_release

    write(instructor_notebook(), tmp_path / "instructor" / "ch.ipynb")
    files = {"data/explorer.pt": b"weights", "labels.csv": b"1,2", ".secret": b"s", "data/.cache": b"c"}
    for name, data in files.items():
        (tmp_path / "instructor" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "instructor" / name).write_bytes(data)
    make_student([tmp_path / "instructor"], tmp_path / "release")  # a folder: its data is copied along
    (release,) = read_release([tmp_path / "release"])
    assert release.files == {"data/explorer.pt": b"weights", "labels.csv": b"1,2"}  # no hidden file, no notebook


def test_the_plan_runs_the_releases_checks_wherever_the_submission_put_them(tmp_path: Path) -> None:
    from vitlab_grader.release import plan, read_release

    write(instructor_notebook(), tmp_path / "instructor" / "ch.ipynb")
    (copy,) = make_student([tmp_path / "instructor"], tmp_path / "release")
    (release,) = read_release([copy.target])
    notebook = json.loads(copy.target.read_text(encoding="utf-8"))
    cells = notebook["cells"]
    token_check = next(i for i, c in enumerate(cells) if "t2t_token_count(" in "".join(c["source"]))
    attention_check = next(i for i, c in enumerate(cells) if "scaled_dot_product_attention(" in "".join(c["source"]))
    cells[token_check]["metadata"]["vitlab"] = {"points": 9}
    del cells[attention_check]  # deleted: put back after the cell that defines `attention`
    cells.append(new_code_cell("vitlab.checks.patchify(f)"))
    planned = plan(notebook, release, lambda check: f"GRADER({check.check})")
    assert planned.sources.count("GRADER(t2t_token_count)") == 1
    assert planned.sources.count("GRADER(scaled_dot_product_attention)") == 1
    after = planned.sources[planned.sources.index("GRADER(scaled_dot_product_attention)") - 1]
    assert after.startswith("def attention"), after
    assert "vitlab.checks.patchify(f)" not in planned.sources
    assert planned.anomalies == [
        "t2t_token_count: the check cell's metadata changed (points 9 instead of 1); the release's points count",
        "scaled_dot_product_attention: the check cell was deleted; the release's check ran",
        f"an extra check cell (cell {len(cells) - 1}, calls vitlab.checks.patchify) was not run; "
        "only the release's count",
    ]


def test_two_submissions_with_one_student_id_are_both_errors_before_any_kernel(tmp_path: Path) -> None:
    from vitlab_grader import grade

    write(instructor_notebook(), tmp_path / "instructor" / "09_pit.ipynb")
    (copy,) = make_student([tmp_path / "instructor"], tmp_path / "release")
    paths = [
        write(instructor_notebook(), tmp_path / "subs" / name) for name in ("09_pit (1).ipynb", "Copy of 09_pit.ipynb")
    ]
    results = list(grade(paths, [copy.target]))  # the collision costs those two files only
    assert [r.status for r in results] == ["ERROR", "ERROR"]
    assert all("both get student id '09_pit'" in r.error and r.rows()[0].score is None for r in results)


# ---------------------------------------------------------------- hidden cases' secret, pinned vitlab (no kernel)

SETUP = """import sys

if "google.colab" in sys.modules:
    import subprocess

    subprocess.run(
        [sys.executable, "-m", "pip", "install", "vitlab @ git+https://github.com/vitlab-course/vit-lab@main"],
        check=True,
    )
    repository = "https://raw.githubusercontent.com/vitlab-course/vit-lab/main"
    urllib.request.urlretrieve(f"{repository}/notebooks/data/x.pt", "data/x.pt")"""  # the chapters' Colab setup cell


def test_student_writes_the_secret_outside_the_release_and_pins_vitlab(tmp_path: Path) -> None:
    import vitlab

    notebook = instructor_notebook()
    notebook.cells.insert(0, new_code_cell(SETUP))
    instructor = write(notebook, tmp_path / "instructor" / "ch.ipynb")
    out, key = tmp_path / "student", tmp_path / "keys" / "hidden.key"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main(["student", str(instructor), "--out", str(out), "--secret", str(key)]) == 0
    secret = key.read_text().strip()
    assert re.fullmatch(r"[0-9a-f]{64}", secret) and key.stat().st_mode & 0o077 == 0, printed.getvalue()
    shipped = b"".join(p.read_bytes() for p in out.rglob("*") if p.is_file())
    assert secret.encode() not in shipped and bytes.fromhex(secret) not in shipped  # never in the release
    with contextlib.redirect_stdout(io.StringIO()):  # again: the same secret, the same hidden cases
        assert main(["student", str(instructor), "--out", str(tmp_path / "again"), "--secret", str(key)]) == 0
    assert key.read_text().strip() == secret
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):  # inside the release: refused
        main(["student", str(instructor), "--out", str(out), "--secret", str(out / "hidden.key")])
    assert not (out / "hidden.key").exists()
    copy = nbformat.read(out / "ch.ipynb", as_version=4)
    assert f"vit-lab@v{vitlab.__version__}" in copy.cells[0].source and "@main" not in copy.cells[0].source
    assert f'vitlab-course/vit-lab/v{vitlab.__version__}"' in copy.cells[0].source  # its data, of the same version
    assert "/main" not in copy.cells[0].source
    assert copy.metadata["vitlab"]["vitlab"] == vitlab.__version__


def test_a_submission_made_against_another_vitlab_is_reported_and_graded_alike(tmp_path: Path) -> None:
    from vitlab_grader.release import match_release, read_release

    make_student([write(instructor_notebook(), tmp_path / "instructor" / "ch.ipynb")], tmp_path / "student")
    releases = read_release([tmp_path / "student"])
    older = {"metadata": {"vitlab": {"release": "ch", "vitlab": "0.0.1"}}}
    release, anomalies = match_release(Path("ch.ipynb"), older, releases)
    assert release is releases[0] and len(anomalies) == 1 and "made against vitlab '0.0.1'" in anomalies[0]
    same = {"metadata": {"vitlab": {"release": "ch", "vitlab": releases[0].notebook["metadata"]["vitlab"]["vitlab"]}}}
    for notebook in (same, {"metadata": {}}, {"metadata": {"vitlab": "0.0.1"}}):  # no stamp: nothing to say
        assert match_release(Path("ch.ipynb"), notebook, releases)[1] == []
