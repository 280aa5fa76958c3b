"""Submissions that try to harm the grader's run: each costs that submission only, honest classmates keep theirs.

The release of ``conftest.release_notebook`` (``token_count``, 1 point; ``attention``, 2
points). Every crafted notebook answers ``token_count`` honestly (1 point of work) unless
it is a file the grader must refuse; it is graded in one ``grade`` run with ``--jobs 2``
beside an honest notebook (1 point) and a full one (3 points), who must keep their scores.

The run side without kernels (re-running timeouts alone, ``--resume``, ``--only-failed``,
results written as each notebook finishes, answers files that inflate) is tested with a
stand-in for the kernel run.
"""

from __future__ import annotations

import contextlib
import csv
import importlib
import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell

from conftest import ATTENTION, ATTENTION_RIGHT, ATTENTION_STUB, TOKEN, cell_of, honest, release_notebook
from vitlab_grader import make_student
from vitlab_grader.__main__ import main
from vitlab_grader.grade import ANSWERS_LIMIT, OUTPUT_LIMIT, ExerciseResult, NotebookResult, _load_answers, grade
from vitlab_grader.isolation import MESSAGE_LIMIT

grade_module = importlib.import_module("vitlab_grader.grade")  # the module (the package exports a function grade)

REFUSED = "the submission is a symbolic link, not a regular file, or cannot be read: not read"
# a cell after the token check writes wrong answers over its answers file (the grader read it already)
FORGE = """from vitlab_grader.harness import answer_cases

answer_cases('.vitlab-grader/0-cases.pt', '.vitlab-grader/0-answers.pt', lambda: lambda *args: 0)"""
META = "def attention(q, k, v, mask=None):\n    return torch.empty(v.shape, device='meta')"
FAKE_TIMEOUT = "class CellTimeoutError(Exception):\n    pass\n\nraise CellTimeoutError('not a timeout')"
PRINTS = (  # just past each limit: every byte printed is one the kernel and the grader move
    f"for _ in range({OUTPUT_LIMIT // 2**20 + 1}):  # past the outputs' limit, one message each\n"
    "    print('x' * 2**20, flush=True)\n"
    f"print('y' * {MESSAGE_LIMIT + 2**20})  # one message over the grader's message limit: dropped"
)


def insert_before_first_check(source: str) -> Any:
    def change(notebook: nbformat.NotebookNode) -> None:
        notebook.cells.insert(cell_of(notebook, f"checks.{TOKEN}("), new_code_cell(source))

    return change


def after_first_check(source: str) -> Any:
    def change(notebook: nbformat.NotebookNode) -> None:
        notebook.cells.insert(cell_of(notebook, f"checks.{TOKEN}(") + 1, new_code_cell(source))

    return change


def before_last_check(source: str) -> Any:  # the grader runs a notebook up to its last check
    def change(notebook: nbformat.NotebookNode) -> None:
        notebook.cells.insert(cell_of(notebook, f"checks.{ATTENTION}("), new_code_cell(source))

    return change


def append(source: str) -> Any:
    def change(notebook: nbformat.NotebookNode) -> None:
        notebook.cells.append(new_code_cell(source))

    return change


def replace_attention(source: str) -> Any:
    def change(notebook: nbformat.NotebookNode) -> None:
        notebook.cells[cell_of(notebook, ATTENTION_STUB)].source = source

    return change


# name: change to the honest notebook (graded: 1 point each, the honest work)
GRADED: dict[str, Any] = {
    "scan_memory_error": before_last_check("x = " + "-" * 100_000 + "1"),  # the parser's MemoryError in the static scan
    "meta_tensor": replace_attention(META),
    "forged_answers": after_first_check(FORGE),
    "fake_timeout": before_last_check(FAKE_TIMEOUT),
    "kernel_dies": insert_before_first_check("import os\n\nos._exit(1)"),
    "prints_a_lot": before_last_check(PRINTS),
    "dies_after_the_last_check": append("import os\n\nos._exit(1)"),  # never runs: no score can change after it
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("robust")
    instructor = root / "instructor" / "ch.ipynb"
    instructor.parent.mkdir()
    nbformat.write(release_notebook(), instructor)
    (copy,) = make_student([instructor], root / "release")
    subs = root / "subs"
    subs.mkdir()
    nbformat.write(honest(copy.target), subs / "honest_ch.ipynb")
    full = honest(copy.target)
    full.cells[cell_of(full, ATTENTION_STUB)].source = ATTENTION_RIGHT
    nbformat.write(full, subs / "full_ch.ipynb")
    for name, change in GRADED.items():
        notebook = honest(copy.target)
        change(notebook)
        nbformat.write(notebook, subs / f"{name}_ch.ipynb")
    text = json.loads(nbformat.writes(honest(copy.target)))
    text["metadata"] = "a string"  # read by the release's matching as a dict
    text["cells"][0]["metadata"] = ["a list"]
    (subs / "string_metadata_ch.ipynb").write_text(json.dumps(text), encoding="utf-8")
    secret = root / "outside.txt"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n", encoding="utf-8")
    (subs / "link_existing_ch.ipynb").symlink_to(secret)
    (subs / "link_missing_ch.ipynb").symlink_to(root / "no-such-file")
    (subs / "link_solution_ch.ipynb").symlink_to(instructor)
    (subs / "link_dev_zero_ch.ipynb").symlink_to("/dev/zero")
    os.mkfifo(subs / "fifo_ch.ipynb")
    (subs / "big_ch.ipynb").write_bytes(b" " * (grade_module.SUBMISSION_LIMIT + 1))
    nbformat.write(honest(copy.target), subs / "twice_ch.ipynb")  # both "twice_ch": an id collision
    nbformat.write(honest(copy.target), subs / "twice_ch (1).ipynb")
    out = root / "results.json"
    argv = ["grade", str(subs), "--release", str(root / "release"), "--out", str(root / "r.csv"), "--json", str(out)]
    argv += ["--gradebook", str(root / "gradebook.csv"), "--timeout", "90", "--jobs", "2", "--id-source", "file"]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(argv) == 0
    results = {Path(n["notebook"]).name.removesuffix(".ipynb"): n for n in json.loads(out.read_text())["notebooks"]}
    with open(root / "gradebook.csv", newline="", encoding="utf-8") as handle:
        book = {row["student_id"]: row for row in csv.DictReader(handle)}
    return {"results": results, "stdout": stdout.getvalue(), "gradebook": book}


def _report(result: dict[str, Any]) -> str:
    return " | ".join([result["error"], *result["anomalies"], *(e["message"] for e in result["exercises"])])


@pytest.mark.slow
def test_the_classmates_keep_their_scores(run: dict[str, Any]) -> None:
    results = run["results"]
    assert (results["honest_ch"]["score"], results["full_ch"]["score"]) == (1, 3)
    for name in ("honest_ch", "full_ch"):
        assert results[name]["status"] == "OK" and results[name]["anomalies"] == [], _report(results[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(GRADED))
def test_a_crafted_notebook_costs_itself_only(run: dict[str, Any], name: str) -> None:
    result = run["results"][f"{name}_ch"]
    assert result["score"] == 1, _report(result)
    token = result["exercises"][0]
    assert (token["status"], token["score"]) == ("PASS", 1), _report(result)


@pytest.mark.slow
def test_the_run_ends_with_the_last_check(run: dict[str, Any]) -> None:
    result = run["results"]["dies_after_the_last_check_ch"]
    assert (result["status"], result["error"], result["restarts"]) == (run["results"]["honest_ch"]["status"], "", 0)


@pytest.mark.slow
def test_the_static_scan_failing_is_reported(run: dict[str, Any]) -> None:
    result = run["results"]["scan_memory_error_ch"]
    assert "the static scan could not read a cell: too complex to parse (MemoryError)" in result["anomalies"]


@pytest.mark.slow
def test_a_meta_tensor_answer_fails_by_name(run: dict[str, Any]) -> None:
    attention = run["results"]["meta_tensor_ch"]["exercises"][1]
    assert attention["status"] == "FAIL" and "meta Tensor" in attention["message"], attention


@pytest.mark.slow
def test_a_rewritten_answers_file_changes_nothing_and_is_reported(run: dict[str, Any]) -> None:
    result = run["results"]["forged_answers_ch"]  # its token count keeps the score of its right answer
    assert any(
        "answers file (.vitlab-grader/0-answers.pt) changed after its check ran" in a for a in result["anomalies"]
    )


@pytest.mark.slow
def test_an_exception_named_like_a_timeout_is_an_error(run: dict[str, Any]) -> None:
    result = run["results"]["fake_timeout_ch"]
    assert result["status"] == "ERROR" and "CellTimeoutError: not a timeout" in result["error"], _report(result)
    assert result["timed_out_cells"] == [] and result["restarts"] == 0


@pytest.mark.slow
def test_a_dead_kernel_restarts_and_the_later_exercises_count(run: dict[str, Any]) -> None:
    result = run["results"]["kernel_dies_ch"]
    assert result["restarts"] == 1 and "the kernel died in cell" in result["first_error"], _report(result)


@pytest.mark.slow
def test_outputs_are_not_kept_and_their_size_is_reported(run: dict[str, Any]) -> None:
    result = run["results"]["prints_a_lot_ch"]
    assert any("the grader kept none of them" in a for a in result["anomalies"]), _report(result)


@pytest.mark.slow
def test_string_metadata_is_reported_and_the_notebook_graded(run: dict[str, Any]) -> None:
    result = run["results"]["string_metadata_ch"]
    assert result["score"] == 1 and "the notebook's metadata is not a dict; not read" in result["anomalies"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["link_existing", "link_missing", "link_solution", "link_dev_zero", "fifo"])
def test_links_and_special_files_are_refused_with_one_message(run: dict[str, Any], name: str) -> None:
    result = run["results"][f"{name}_ch"]
    assert (result["status"], result["error"], result["exercises"][0]["score"]) == ("ERROR", REFUSED, None)
    assert "root:" not in run["stdout"] and "outside.txt" not in run["stdout"]
    assert run["gradebook"][f"{name}_ch"]["total"] == ""  # no score, never 0


@pytest.mark.slow
def test_a_too_large_file_and_an_id_collision_cost_those_files_only(run: dict[str, Any]) -> None:
    big = run["results"]["big_ch"]
    assert big["status"] == "ERROR" and "more than the" in big["error"]
    for name in ("twice_ch", "twice_ch (1)"):
        result = run["results"][name]
        assert result["status"] == "ERROR" and "both get student id 'twice_ch'" in result["error"]
        assert result["exercises"][0]["score"] is None


@pytest.mark.slow
def test_a_timeout_after_a_dead_kernel_says_the_kernel_died(tmp_path: Path) -> None:
    from jupyter_client.manager import AsyncKernelManager

    from vitlab_grader.grade import _execute

    flag = tmp_path / "ran-once"  # the first cell is quick, and slow when it runs again after the restart
    first = f"import os, time\nif os.path.exists({str(flag)!r}):\n    time.sleep(60)\nopen({str(flag)!r}, 'w').close()"
    notebook = nbformat.v4.new_notebook(cells=[new_code_cell(first), new_code_cell("os._exit(1)"), new_code_cell("1")])
    run = _execute(notebook, AsyncKernelManager(kernel_name="python3"), 15, None, {2}, lambda i: f"cell {i}")
    assert run.died == {1: "the kernel died in cell 1"} and run.restarts == 1
    assert run.stopped == (
        "TIMEOUT",
        "ran past the 15 s limit after cell 1 (the kernel died in cell 1; "
        "running the finished cells again took the time left)",
    )


# ---------------------------------------------------------------- the run side, without kernels


def test_an_answers_file_that_inflates_is_refused() -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("answers/data/0", b"\0" * (ANSWERS_LIMIT + 1))
    data = buffer.getvalue()
    assert len(data) < ANSWERS_LIMIT // 100
    assert "compressed, or more than the" in _load_answers(data, 1)


def test_a_meta_or_huge_tensor_in_the_answers_is_refused() -> None:
    from vitlab_grader.harness import VERSION, decode

    def answers(value: torch.Tensor) -> dict[str, Any]:
        case = {"value": value, "type": "Tensor", "error": None, "where": "", "not_implemented": False, "changed": []}
        return {"version": VERSION, "cases": [case], "gradient": None, "gradient_case": None, "function": "f"}

    with pytest.raises(ValueError, match="on the CPU"):
        decode(answers(torch.empty(3, device="meta")), 1)
    with pytest.raises(ValueError, match="more than"):
        decode(answers(torch.zeros(1).expand(2**25)), 1)


def _fake_grades(monkeypatch: pytest.MonkeyPatch, outcome: Any) -> list[str]:
    """``_grade_submission`` replaced: ``outcome(name, call)`` gives ``(status, exercise status)``; the calls."""
    calls: list[str] = []

    def fake(path: Path, notebook: Any, anomalies: list[str], student: str, releases: Any, settings: Any) -> Any:
        calls.append(path.name)
        status, exercise = outcome(path.name, calls.count(path.name))
        score = {"PASS": 1.0, "TIMEOUT": 0.0}.get(exercise)
        row = ExerciseResult(str(path), TOKEN, "token_count", exercise, "", 1.0, None if score is None else 1.0,
                             score, student)  # fmt: skip
        return NotebookResult(str(path), status=status, student=student, exercises=[row])

    monkeypatch.setattr(grade_module, "_grade_submission", fake)
    return calls


@pytest.fixture
def course(tmp_path: Path) -> dict[str, Any]:
    instructor = tmp_path / "instructor" / "ch.ipynb"
    instructor.parent.mkdir()
    nbformat.write(release_notebook(), instructor)
    (copy,) = make_student([instructor], tmp_path / "release")
    subs = tmp_path / "subs"
    subs.mkdir()
    for name in ("a", "b", "c"):
        nbformat.write(honest(copy.target), subs / f"{name}_ch.ipynb")
    argv = ["grade", str(subs), "--release", str(copy.target), "--out", str(tmp_path / "r.csv")]
    return {"subs": subs, "release": copy.target, "json": tmp_path / "r.json", "argv": argv}


def test_a_timeout_beside_others_is_graded_again_alone(course: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    def outcome(name: str, call: int) -> tuple[str, str]:
        return ("TIMEOUT", "TIMEOUT") if name == "a_ch.ipynb" and call == 1 else ("OK", "PASS")

    calls = _fake_grades(monkeypatch, outcome)
    paths = sorted(course["subs"].iterdir())
    results = list(grade(paths, [course["release"]], jobs=2, id_source="file"))
    assert sorted(calls) == ["a_ch.ipynb", "a_ch.ipynb", "b_ch.ipynb", "c_ch.ipynb"] and calls[-1] == "a_ch.ipynb"
    again = results[-1]
    assert Path(again.notebook).name == "a_ch.ipynb" and again.status == "OK" and again.score == 1
    assert "graded again alone" in again.anomalies[-1]


def test_results_are_written_as_each_notebook_finishes_and_resume_keeps_them(
    course: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(name: str, call: int) -> tuple[str, str]:
        if name == "c_ch.ipynb":
            raise KeyboardInterrupt  # the run is killed on the third notebook
        return ("ERROR", "ERROR") if name == "b_ch.ipynb" else ("OK", "PASS")

    calls = _fake_grades(monkeypatch, interrupted)
    argv = [*course["argv"], "--json", str(course["json"]), "--id-source", "file"]
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(KeyboardInterrupt):
        main(argv)
    kept = {Path(n["notebook"]).name: n for n in json.loads(course["json"].read_text())["notebooks"]}
    assert sorted(kept) == ["a_ch.ipynb", "b_ch.ipynb"] and kept["b_ch.ipynb"]["exercises"][0]["score"] is None

    calls = _fake_grades(monkeypatch, lambda name, call: ("OK", "PASS"))
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([*argv, "--resume"]) == 0
    assert calls == ["c_ch.ipynb"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([*argv, "--only-failed"]) == 0
    assert calls == ["c_ch.ipynb", "b_ch.ipynb"]
    final = {Path(n["notebook"]).name: n["score"] for n in json.loads(course["json"].read_text())["notebooks"]}
    assert final == {"a_ch.ipynb": 1, "b_ch.ipynb": 1, "c_ch.ipynb": 1}
    rows = list(csv.DictReader(open(Path(course["argv"][-1]), newline="", encoding="utf-8")))
    assert [row["score"] for row in rows] == ["1", "1", "1"]


def test_an_error_has_no_score_and_an_empty_gradebook_cell(
    course: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_grades(monkeypatch, lambda name, call: ("ERROR", "ERROR") if name == "a_ch.ipynb" else ("OK", "PASS"))
    book = Path(course["argv"][-1]).with_name("book.csv")
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([*course["argv"], "--gradebook", str(book), "--id-source", "file"]) == 0
    rows = {row["student_id"]: row for row in csv.DictReader(open(book, newline="", encoding="utf-8"))}
    assert (rows["a_ch"][TOKEN], rows["b_ch"][TOKEN]) == ("", "1")


def test_a_grader_failure_on_one_submission_costs_it_only(
    course: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def outcome(name: str, call: int) -> tuple[str, str]:
        if name == "b_ch.ipynb":
            raise RecursionError("deep")
        return "OK", "PASS"

    _fake_grades(monkeypatch, outcome)
    results = {Path(r.notebook).name: r for r in grade(sorted(course["subs"].iterdir()), [course["release"]])}
    assert results["b_ch.ipynb"].status == "ERROR" and "RecursionError" in results["b_ch.ipynb"].error
    assert not results["b_ch.ipynb"].graded and results["b_ch.ipynb"].rows()[0].score is None
    assert results["a_ch.ipynb"].score == results["c_ch.ipynb"].score == 1


def test_kernels_side_by_side_get_their_share_of_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert [grade_module._threads(jobs) for jobs in (1, 2, 3, 16)] == [None, 4, 2, 1]
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the instructor's own setting reaches the kernels instead
    assert grade_module._threads(2) is None
