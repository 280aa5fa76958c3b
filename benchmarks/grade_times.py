"""Grading time per notebook: the release-based, isolated grader against a plain run of the notebook.

    .venv/bin/python benchmarks/grade_times.py [notebooks/09_pit.ipynb ...] [--repeats 3]

For each chapter: the student copies of its folder (``make_student``, with the folder's
``data/``, as an instructor makes them) are the release, and the submission is the
chapter's copy with every exercise's solution pasted back into its stub (a student who
solved everything). Two timings, each the median of ``--repeats`` runs, one after the other:

* **plain run**: the submission executed once by nbclient in a fresh kernel, its checks
  printing their lines in the notebook (what grading cost before it was run against the
  release: a kernel, the cells, the checks);
* **graded**: ``vitlab_grader.grade`` on the submission against the release: all of
  the above, plus the submission's folder, the sandbox, the cases written and the answers
  read back, the references computed in the grader, every process ended (with the sandbox,
  and with ``--no-sandbox``).

Wall-clock seconds, kernel start-up included in both.

**A class** (``--class 50 --jobs 2``): the first notebook's solved copy submitted by that
many students, graded in one ``python -m vitlab_grader grade`` run with ``--jobs``, the
release's secret (hidden cases) and every output file (CSV, JSON, gradebook, feedback).
Reported: the run's wall time, the time per notebook, each notebook's kernel session (what
the results' ``seconds`` measure: the kernel's start, the cells, the checks' cells) and the
grader's overhead per notebook beyond it, ``wall * jobs / N - mean(session)`` (reading,
scanning, folders, sandbox, references, hidden cases, results), next to a plain run.

No test asserts a time. It needs the grader's package, ``vitlab-grader`` (``make install``
installs it, or ``pip install -e ./grader``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def solved_copy(instructor: Path, release: Path, target: Path) -> Path:
    """The student copy with each exercise's stub replaced by the instructor's solution."""
    import nbformat

    from vitlab_grader import inspect_notebook

    original = nbformat.read(instructor, as_version=4)
    solutions = [original.cells[e.solution_cell].source for e in inspect_notebook(original).exercises]
    copy = nbformat.read(release, as_version=4)
    stubs = [cell for cell in copy.cells if "exercise" in cell.metadata.get("tags", [])]
    if len(stubs) != len(solutions):
        raise ValueError(f"{instructor.name}: {len(stubs)} stubs in the copy, {len(solutions)} solutions")
    for stub, solution in zip(stubs, solutions, strict=True):
        stub.source = solution
    nbformat.write(copy, target)
    return target


def plain_run(path: Path) -> float:
    """Seconds to execute the notebook once in a fresh kernel (nbclient), kernel start-up included."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    client = NotebookClient(notebook, kernel_name="python3", allow_errors=True, timeout=600)
    client.resources = {"metadata": {"path": str(path.parent)}}
    client.execute(stderr=subprocess.DEVNULL)  # the kernel's own log
    return time.perf_counter() - start


def graded(path: Path, release: Path, sandbox: bool) -> tuple[float, str, float]:
    """``(seconds, sandbox used, score)`` of grading the submission against the release."""
    from vitlab_grader import grade

    start = time.perf_counter()
    (result,) = grade([path], [release], timeout=600, sandbox=sandbox)
    seconds = time.perf_counter() - start
    if result.passed != result.total:
        raise RuntimeError(f"{path.name}: the solved copy did not pass: {[e.message for e in result.exercises]}")
    return seconds, result.sandbox, result.score


def release_copy(instructor: Path, folder: Path) -> Path:
    """The student copies of the chapter's whole folder in ``folder/release`` (its ``data/`` along, as an
    instructor makes them); the chapter's copy. ``folder/data`` links to it: the plain run, in ``folder``, reads it."""
    from vitlab_grader import make_student

    copies = make_student([instructor.parent], folder / "release")
    (folder / "data").symlink_to(folder / "release" / "data")
    return next(c.target for c in copies if c.source == instructor)


def grade_class(instructor: Path, students: int, jobs: int, folder: Path) -> None:
    """Grade ``students`` copies of the solved chapter in one run; print the times (the module's docstring)."""
    from vitlab_grader.__main__ import main as grader
    from vitlab_grader.release import write_secret

    key = folder / "hidden.key"
    write_secret(key)
    solved = solved_copy(instructor, release_copy(instructor, folder), folder / "solved.ipynb")
    subs = folder / "submissions"
    subs.mkdir()
    for number in range(students):
        shutil.copy(solved, subs / f"s{number:04d}_{instructor.name}")
    plain = plain_run(solved)
    argv = ["grade", str(subs), "--release", str(folder / "release"), "--secret", str(key), "--jobs", str(jobs)]
    argv += ["--out", str(folder / "r.csv"), "--json", str(folder / "r.json"), "--gradebook", str(folder / "g.csv")]
    argv += ["--feedback", str(folder / "feedback"), "--timeout", "600"]
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        grader(argv)
    wall = time.perf_counter() - start
    results = json.loads((folder / "r.json").read_text())["notebooks"]
    if len(results) != students or any(r["score"] != r["max_score"] for r in results):
        raise RuntimeError(f"{instructor.name}: not every solved copy scored full marks")
    session = statistics.mean(r["seconds"] for r in results)
    per = wall / students
    print(f"{students} x {instructor.name}, --jobs {jobs}, hidden cases: {wall:.0f} s in all, {per:.1f} s per notebook")
    print("| plain run (s) | kernel session, mean (s) | wall x jobs / N (s) | grader overhead per notebook (s) |")
    print("|---:|---:|---:|---:|")
    print(f"| {plain:.1f} | {session:.1f} | {per * jobs:.1f} | {per * jobs - session:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", default=[str(ROOT / "notebooks" / "09_pit.ipynb")])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--class", dest="students", type=int, default=0, help="grade this many copies at once")
    parser.add_argument("--jobs", type=int, default=2, help="with --class: notebooks graded at the same time")
    args = parser.parse_args()

    if args.students:
        with tempfile.TemporaryDirectory() as folder:
            grade_class(Path(args.notebooks[0]).resolve(), args.students, args.jobs, Path(folder))
        return

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    print(f"python {sys.version.split()[0]}, commit {commit.stdout.strip() or '?'}, median of {args.repeats}")
    print("| notebook | plain run (s) | graded, sandbox (s) | ratio | graded, --no-sandbox (s) | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.notebooks:
        instructor = Path(name).resolve()
        with tempfile.TemporaryDirectory() as folder:
            copy = release_copy(instructor, Path(folder))
            submission = solved_copy(instructor, copy, Path(folder) / f"s1_{instructor.name}")
            plain, sandboxed, unsandboxed, used = [], [], [], ""
            for _ in range(args.repeats):
                plain.append(plain_run(submission))
                seconds, used, _ = graded(submission, copy, sandbox=True)
                sandboxed.append(seconds)
                unsandboxed.append(graded(submission, copy, sandbox=False)[0])
        p, s, u = (statistics.median(x) for x in (plain, sandboxed, unsandboxed))
        print(f"| {instructor.name} | {p:.1f} | {s:.1f} ({used}) | {s / p:.2f} | {u:.1f} | {u / p:.2f} |", flush=True)


if __name__ == "__main__":
    main()
