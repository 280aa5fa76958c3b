"""The Gradescope autograder: the zip's layout, results.json in Gradescope's format, the same scores as `grade`."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import nbformat
import pytest
from grader_release import (
    ATTENTION_RIGHT,
    TOKEN_PITFALL_9,
    instructor_notebook,
    submission,
    write,
)
from test_imports import imported_modules

from conftest import ROOT
from vitlab_grader import AssignmentError, make_student
from vitlab_grader.grade import ExerciseResult, NotebookResult
from vitlab_grader.gradescope import build, results_json
from vitlab_grader.release import read_release

# Gradescope's results.json (gradescope-autograders.readthedocs.io/en/latest/specs/, "Output format"):
# every key it documents, with its type; "score" on the top level or on every test.
TOP = {
    "score": (int, float),
    "execution_time": (int, float),
    "output": str,
    "output_format": str,
    "test_output_format": str,
    "test_name_format": str,
    "visibility": str,
    "stdout_visibility": str,
    "extra_data": dict,
    "tests": list,
    "leaderboard": list,
}
TEST = {
    "score": (int, float),
    "max_score": (int, float),
    "status": str,
    "name": str,
    "name_format": str,
    "number": str,
    "output": str,
    "output_format": str,
    "tags": list,
    "visibility": str,
    "extra_data": dict,
}
VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}
SECRET = bytes(range(32))  # the release's secret for hidden cases (tests only)
FORMATS = {"text", "html", "simple_format", "md", "ansi"}
STATUS = {"passed", "failed"}


def check_results(document: dict[str, Any]) -> None:
    """Raise AssertionError where ``document`` departs from Gradescope's documented results.json."""
    assert isinstance(document, dict)
    for key, value in document.items():
        assert key in TOP, f"unknown top-level key {key!r}"
        assert isinstance(value, TOP[key]), (key, value)
    for key in ("visibility", "stdout_visibility"):
        assert document.get(key, "visible") in VISIBILITY
    assert document.get("output_format", "text") in FORMATS
    tests = document.get("tests", [])
    assert "score" in document or (tests and all("score" in t for t in tests)), "a score is required"
    for test in tests:
        for key, value in test.items():
            assert key in TEST, f"unknown test key {key!r}"
            assert isinstance(value, TEST[key]), (key, value)
        assert test.get("visibility", "visible") in VISIBILITY and test.get("output_format", "text") in FORMATS
        assert test.get("status", "passed") in STATUS
        assert 0 <= test.get("score", 0) <= test.get("max_score", float("inf"))
    json.dumps(document, allow_nan=False)  # plain JSON: no NaN


@pytest.fixture
def release(tmp_path: Path) -> Path:
    instructor = write(instructor_notebook(), tmp_path / "instructor" / "ch.ipynb")
    make_student([instructor], tmp_path / "student")
    return tmp_path / "student"


def test_the_zip_has_gradescopes_layout(release: Path, tmp_path: Path) -> None:
    out = build([release], tmp_path / "autograder.zip", timeout=60, visibility="after_published")
    with zipfile.ZipFile(out) as archive:
        names = set(archive.namelist())
        modes = {info.filename: info.external_attr >> 16 for info in archive.infolist()}
        setup = archive.read("setup.sh").decode()
        settings = json.loads(archive.read("settings.json"))
        requirements = archive.read("requirements.txt").decode().split()
    assert {"setup.sh", "run_autograder", "release/ch.ipynb", "settings.json"} <= names  # at the root
    assert modes["run_autograder"] & stat.S_IXUSR and modes["setup.sh"] & stat.S_IXUSR
    assert (
        "packages/vitlab/vitlab/__init__.py" in names and "packages/vitlab_grader/vitlab_grader/gradescope.py" in names
    )
    assert "download.pytorch.org/whl/cpu" in setup and '"torch==' in setup  # CPU torch, pinned
    assert all("==" in line for line in requirements) and any(r.startswith("nbclient==") for r in requirements)
    assert settings["timeout"] == 60 and settings["visibility"] == "after_published"


def _imported(code: str, top_level: bool) -> set[str]:
    """The third-party packages ``code`` imports (at its module level only, if ``top_level``)."""
    names = {name.split(".")[0] for name in imported_modules(code, top_level)}
    return names - set(sys.stdlib_module_names) - {"vitlab", "google"}  # google: Colab's


def test_the_container_installs_what_the_chapters_import() -> None:
    """Every package the chapters' cells and vitlab's modules import is in setup.sh's installs or their dependencies."""
    from importlib.metadata import PackageNotFoundError, packages_distributions, requires

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from vitlab_grader.gradescope import REQUIREMENTS

    modules = set()
    for path in (ROOT / "vitlab").rglob("*.py"):
        modules |= _imported(path.read_text(encoding="utf-8"), top_level=True)  # a function's import is optional
    for path in (ROOT / "notebooks").glob("*.ipynb"):
        cells = nbformat.read(path, as_version=4).cells
        modules |= {name for c in cells if c.cell_type == "code" for name in _imported(c.source, top_level=False)}
    installed, todo = set(), [*REQUIREMENTS, "torch", "torchvision"]  # torch and torchvision: setup.sh's first line
    while todo:
        name = canonicalize_name(todo.pop())
        if name not in installed:
            installed.add(name)
            try:
                todo += [r.name for r in map(Requirement, requires(name) or []) if not r.marker or r.marker.evaluate()]
            except PackageNotFoundError:
                pass
    distributions = packages_distributions()
    missing = {m for m in modules if not {canonicalize_name(d) for d in distributions.get(m, [m])} & installed}
    assert not missing, f"imported by the chapters or vitlab, not installed in the container: {sorted(missing)}"


def test_a_release_notebook_without_checks_is_refused(release: Path, tmp_path: Path) -> None:
    notebook = nbformat.read(release / "ch.ipynb", as_version=4)
    notebook.cells = [c for c in notebook.cells if "check" not in c.metadata.get("tags", [])]
    nbformat.write(notebook, release / "reading.ipynb")  # a chapter with no exercises, such as 14
    with pytest.raises(AssignmentError, match="reading: no check cells"):
        build([release], tmp_path / "autograder.zip")
    assert not (tmp_path / "autograder.zip").exists()


def test_results_json_follows_the_documented_format(release: Path) -> None:
    (ch,) = read_release([release])
    token, attention = ch.checks
    notebook = NotebookResult(
        "sub/ch.ipynb",
        student="x",
        release=ch.name,
        exercises=[
            ExerciseResult(
                "sub/ch.ipynb", token.check, "token_count", "FAIL", "FAIL [case 1/9]: \x1b[31mno", 1.0, 0.5, 0.5
            ),
            ExerciseResult("sub/ch.ipynb", attention.check, "attention", "ERROR", "the kernel died", 2.0, 0.0, None),  # type: ignore[arg-type]
        ],
        anomalies=["token_count: the answers file changed after its check ran"],
    )
    document = results_json([notebook], [ch], "visible", 12.3)
    check_results(document)
    tests = document["tests"]
    assert [(t["score"], t["max_score"], t["status"]) for t in tests] == [(0.5, 1.0, "failed"), (0.0, 2.0, "failed")]
    assert "not graded" in tests[1]["output"] and "\x1b" not in tests[0]["output"]
    assert document["score"] == 0.5 and document["extra_data"]["unscored"] == [
        f"{attention.check}: ERROR: the kernel died"
    ]
    assert document["extra_data"]["anomalies"] == ["token_count: the answers file changed after its check ran"]
    assert "answers file" not in document["output"]  # the instructor's, not the student's
    missing = results_json([], [ch], "visible", 1)  # nothing submitted: every exercise "not submitted", 0
    check_results(missing)
    assert [t["max_score"] for t in missing["tests"]] == [1.0, 2.0] and missing["score"] == 0
    with pytest.raises(AssertionError):  # the check can fail
        check_results({**document, "tests": [{**tests[0], "visibility": "students"}]})


WATCHED_PYTHON = """#!{python}
import runpy, sys
import vitlab_grader.grade
grade = sys.modules["vitlab_grader.grade"]  # the module (the package's attribute is the function)

def watched(*args, **kwargs):
    with open({record!r}, "w") as record:
        record.write(str("torch" in sys.modules))
    return execute(*args, **kwargs)

execute, grade._execute = grade._execute, watched
sys.argv[:] = sys.argv[2:]  # run_autograder's "-m vitlab_grader.gradescope ARGS"
runpy.run_module("vitlab_grader.gradescope", run_name="__main__")
"""


def autograder_folder(zip_path: Path, root: Path, submissions: list[Path]) -> Path:
    """``root`` laid out as Gradescope's /autograder: source/, run_autograder, submission/, results/."""
    with zipfile.ZipFile(zip_path) as archive:
        archive.extractall(root / "source")
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    (root / "run_autograder").chmod(0o755)
    (root / "submission").mkdir(parents=True)
    for path in submissions:
        shutil.copy(path, root / "submission" / path.name)
    return root


@pytest.mark.slow
def test_run_autograder_scores_as_grade_does(release: Path, tmp_path: Path) -> None:
    from vitlab_grader import grade

    student = release / "ch.ipynb"
    sub = submission(student, TOKEN_PITFALL_9, ATTENTION_RIGHT, tmp_path / "subs" / "ch.ipynb")
    out = build([release], tmp_path / "autograder.zip", timeout=120, secret=SECRET)  # hidden cases too
    root = autograder_folder(out, tmp_path / "autograder", [sub])
    # run_autograder's Python, watched: was PyTorch imported in the grader while the kernel ran?
    watch = tmp_path / "python"
    watch.write_text(WATCHED_PYTHON.format(python=sys.executable, record=str(tmp_path / "torch.txt")))
    watch.chmod(0o755)
    env = {**os.environ, "VITLAB_GRADER_PYTHON": str(watch)}
    # the autograder's kernel and grade's below run at the same time: each mostly waits on its own
    with open(tmp_path / "stderr.txt", "w", encoding="utf-8") as stderr:  # the child keeps its own copy
        autograder = subprocess.Popen(
            [str(root / "run_autograder"), "--root", str(root)],
            env=env,
            cwd=root,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        (expected,) = grade([sub], [release], timeout=120, secret=SECRET)
    finally:
        returncode = autograder.wait(timeout=600)
    assert returncode == 0, (tmp_path / "stderr.txt").read_text(encoding="utf-8")
    document = json.loads((root / "results" / "results.json").read_text())
    check_results(document)
    assert "hidden cases" in expected.exercises[1].message  # the right attention passes its hidden cases
    assert [(t["score"], t["max_score"]) for t in document["tests"]] == [
        (e.score, e.points) for e in expected.exercises
    ]
    assert document["score"] == pytest.approx(expected.score) and 0 < document["score"] < 3
    assert document["output"].startswith("# Feedback on ch\\.ipynb") and document["output_format"] == "md"
    # the grader held no PyTorch while the kernel ran (Gradescope's memory): only after it
    assert (tmp_path / "torch.txt").read_text() == "False", "the grader imported PyTorch before the kernel ended"


@pytest.mark.slow
def test_run_autograder_without_a_notebook_scores_zero_of_every_exercise(release: Path, tmp_path: Path) -> None:
    # A right answer's full marks through run_autograder are in the test above (its attention
    # exercise); here no kernel starts: an empty submission gets every exercise at 0.
    out = build([release], tmp_path / "autograder.zip", timeout=120)
    root = autograder_folder(out, tmp_path / "empty", [])
    env = {**os.environ, "VITLAB_GRADER_PYTHON": sys.executable}
    subprocess.run([str(root / "run_autograder"), "--root", str(root)], env=env, check=True, timeout=600)
    document = json.loads((root / "results" / "results.json").read_text())
    check_results(document)
    assert document["score"] == 0 and sum(t["max_score"] for t in document["tests"]) == 3


def test_the_secret_ships_in_the_autograder_and_never_in_the_release(release: Path, tmp_path: Path) -> None:
    from vitlab_grader.gradescope import SECRET_FILE

    out = build([release], tmp_path / "autograder.zip", timeout=60, secret=SECRET)
    with zipfile.ZipFile(out) as archive:
        assert archive.read(SECRET_FILE).decode().strip() == SECRET.hex()
        assert json.loads(archive.read("settings.json"))["hidden_cases"] is True
        released = b"".join(archive.read(n) for n in archive.namelist() if n.startswith("release/"))
    for data in (released, b"".join(p.read_bytes() for p in release.rglob("*") if p.is_file())):
        assert SECRET.hex().encode() not in data and SECRET not in data
    with zipfile.ZipFile(build([release], tmp_path / "public.zip", timeout=60)) as archive:
        assert SECRET_FILE not in archive.namelist()
        assert json.loads(archive.read("settings.json"))["hidden_cases"] is False
