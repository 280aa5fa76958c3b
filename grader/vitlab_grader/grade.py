"""Grade submitted notebooks against the release: the student's code runs, the grader decides.

``grade(submissions, release)`` reads every submission into memory first, then grades
each one alone:

1. **Against the release.** The submission is matched to its release notebook (the
   student copy ``student`` wrote) and its check cells are replaced by the release's
   (:mod:`vitlab_grader.release`): the release gives every check's source, points,
   order and function. Edited, missing, duplicated or extra check cells and changed
   metadata never change the score; each is reported as an anomaly. Exercises the
   release does not assign are not graded.
2. **In isolation** (:mod:`vitlab_grader.isolation`): a fresh temporary folder with
   only the notebook and what the release ships, a scrubbed environment, an OS sandbox
   where one starts (else the result says file isolation was unavailable), and every
   process the kernel started ended before anything is read.
3. **Verdicts the student's code cannot reach.** Where the release has a check cell, the
   kernel runs a grader's cell (:mod:`vitlab_grader.harness`): the student's function
   runs on the check's cases, written by the grader, and its outputs come back as data
   (``torch.save``, read with ``torch.load(weights_only=True)`` and a size limit). The
   grader's own process computes the references and compares
   (:func:`vitlab.checks._core.evaluate`). Nothing the kernel prints or shows is read.
4. **Copied references flagged.** An answer that is, or names, a vitlab object the
   exercise asks the student to write, or anything of ``vitlab.checks``, keeps its score
   and is flagged by name.

Each notebook has a time limit (kernel start-up not counted) and, optionally, one per
cell. Cells that raise do not stop it, so later checks still run. A cell past the per-cell
limit is interrupted; if the kernel does not answer within a few seconds it is restarted
and every earlier cell that ran (the checks and the timed-out cell excepted) runs again.

Status of an exercise: ``PASS``, ``FAIL``, ``TODO`` (the check's verdict), ``ERROR`` (the
grader's cell could not run the function: the kernel died, the answers were unreadable)
or ``TIMEOUT``. Score: ``points * fraction`` (the share of the check's cases that passed;
0 for ``ERROR`` and ``TIMEOUT``), or with ``all_or_nothing`` the points for a ``PASS`` only.
"""

from __future__ import annotations

import copy
import logging
import math
import re
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from vitlab_grader.exercises import DEFAULT_POINTS, source
from vitlab_grader.release import (
    Release,
    ReleaseCheck,
    copied_references,
    match_release,
    plan,
    read_release,
    reference_objects,
    suspicious,
    vitlab_names,
)

STATUSES = ("PASS", "FAIL", "TODO", "ERROR", "TIMEOUT")
ANSWERS_LIMIT = 64 * 2**20  # bytes: the largest answers file the grader reads back from a kernel
_WORK = ".vitlab-grader"  # the folder, inside the submission's, for the cases and answers files
_DATA_STATUS = {"passed": "PASS", "failed": "FAIL", "not implemented": "TODO"}
_PROBE_SECONDS = 10  # how long an interrupted kernel may take to answer again
_TIMEOUT_ENAME = "CellTimeoutError"  # the error nbclient's reply carries for a cell past its limit
_QUIET = logging.getLogger("vitlab_grader.grade.nbclient")  # nbclient's timeout messages: not the table's
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


@dataclass(frozen=True)
class ExerciseResult:
    """One row of the results: an exercise of the release, its verdict and its score."""

    notebook: str
    exercise: str  # the check's name, e.g. "t2t_token_count"
    function: str  # the student's function given to the check
    status: str  # one of STATUSES
    message: str  # the check's line, or why there is none
    points: float = DEFAULT_POINTS  # what the exercise is worth (the release's)
    fraction: float = 0.0  # share of the check's cases that passed
    score: float = 0.0  # points * fraction, or all or nothing
    student: str = ""  # the student id
    flags: str = ""  # copied references: the vitlab objects the answer uses or is ("" when none)


@dataclass
class NotebookResult:
    """A graded notebook: its exercises, why it stopped, its first error, anomalies, isolation, time."""

    notebook: str
    status: str = "OK"  # OK, ERROR (a cell raised, or the notebook could not run) or TIMEOUT
    error: str = ""  # the first of: why the run stopped, a cell past its limit, the first error
    seconds: float = 0.0
    exercises: list[ExerciseResult] = field(default_factory=list)
    student: str = ""
    first_error: str = ""  # the first error outside the check cells, even when the run timed out
    timed_out_cells: list[int] = field(default_factory=list)  # indices in the submission
    restarts: int = 0  # kernel restarts after a cell that did not stop when interrupted
    release: str = ""  # the release notebook it was graded against
    anomalies: list[str] = field(default_factory=list)  # what differs from the release; never scored
    sandbox: str = ""  # "bubblewrap", "unshare" or "none"
    isolation: str = ""  # "" or why file isolation was unavailable

    @property
    def passed(self) -> int:
        return sum(r.status == "PASS" for r in self.exercises)

    @property
    def total(self) -> int:
        return len(self.exercises)

    @property
    def score(self) -> float:
        return round(sum(r.score for r in self.exercises), 4)

    @property
    def max_score(self) -> float:
        return sum(r.points for r in self.exercises)

    @property
    def flags(self) -> list[str]:
        """Every exercise's flags, ``"check: what"``."""
        return [f"{r.exercise}: {r.flags}" for r in self.exercises if r.flags]

    def rows(self) -> list[ExerciseResult]:
        """The CSV rows: one per exercise, or one row saying why there are none."""
        if self.exercises:
            return self.exercises
        message = self.error or "the release notebook has no check cells"
        status = "ERROR" if self.error else "TODO"
        return [ExerciseResult(self.notebook, "", "", status, message, 0.0, 0.0, 0.0, self.student)]


def _first_line(text: str, limit: int = 200) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _error(cell: Any) -> str | None:
    """``"NameError: name 'x' is not defined"``: the cell's error, its whole message on one line."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            text = " ".join(line.strip() for line in _ANSI.sub("", output.get("evalue", "")).splitlines())
            return f"{output.get('ename', 'Error')}: {text}".rstrip(": ")
    return None


@dataclass
class _Run:
    """What :func:`_execute` saw: cells that finished, cells past their limit, why it stopped."""

    finished: set[int] = field(default_factory=set)
    timed_out: dict[int, str] = field(default_factory=dict)
    stopped: tuple[str, str] | None = None
    restarts: int = 0


def _kernel_answers(client: Any, seconds: float) -> bool:
    """Whether the kernel answers a silent ``pass`` within ``seconds`` (after an interrupt).

    Sent on the client's shell channel directly: nbclient would interrupt the kernel again
    on a timeout, and a second interrupt of a kernel about to be restarted loses outputs.
    """
    from queue import Empty

    from nbclient.util import run_sync

    msg_id = client.kc.execute("pass", silent=True, store_history=False)
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            reply = run_sync(client.kc.shell_channel.get_msg)(timeout=left)
        except Empty:
            return False
        if reply.get("parent_header", {}).get("msg_id") == msg_id:
            return True
    return False


def _restart_and_replay(
    client: Any, notebook: Any, run: _Run, skip: set[int], deadline: float, timed_out: list[int]
) -> bool:
    """Restart the kernel and run again, silently, every finished cell not in ``skip``; whether it worked."""
    from nbclient.exceptions import DeadKernelError
    from nbclient.util import run_sync

    run_sync(client.km.restart_kernel)(now=True)
    run_sync(client.kc.wait_for_ready)(timeout=60)
    run.restarts += 1
    for index in sorted(run.finished - skip):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        client.timeout = max(1, math.ceil(left))
        timed_out.clear()
        try:  # a copy: the cell keeps the outputs of its first run
            client.execute_cell(copy.deepcopy(notebook.cells[index]), index, store_history=False)
        except DeadKernelError:
            return False
        if timed_out:
            return False
    return True


def _execute(notebook: Any, km: Any, timeout: float, cell_timeout: float | None, skip: set[int], describe: Any) -> _Run:
    """Run the code cells in order in ``km``'s kernel under the notebook's and each cell's time limits.

    ``skip``: the grader's cells, which a restart does not run again; ``describe(index)``
    names a cell in messages. The kernel is shut down on return.
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    timed_out: list[int] = []

    def on_executed(cell: Any, cell_index: int, execute_reply: dict[str, Any]) -> None:
        if execute_reply.get("content", {}).get("ename") == _TIMEOUT_ENAME:
            timed_out.append(cell_index)

    client = NotebookClient(
        notebook, km=km, kernel_name="python3", allow_errors=True, shutdown_kernel="immediate",
        interrupt_on_timeout=True,  # interrupt the cell, as the stop button does, and go on
        error_on_timeout={"ename": _TIMEOUT_ENAME, "evalue": "", "traceback": []},
        on_cell_executed=on_executed, log=_QUIET,
    )  # fmt: skip
    run = _Run()
    client.reset_execution_trackers()
    try:
        # the kernel process's own log (not the notebook's output) would clutter the table;
        # the folder and the environment are the manager's
        with client.setup_kernel(stderr=subprocess.DEVNULL, cleanup_kc=True):
            start = time.monotonic()
            deadline = start + timeout
            for index, cell in enumerate(notebook.cells):
                if cell.cell_type != "code":
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    run.stopped = ("TIMEOUT", f"ran past the {timeout:g} s limit before {describe(index)}")
                    return run
                limit = cell_timeout if cell_timeout is not None and cell_timeout < left else None
                client.timeout = max(1, math.ceil(limit if limit is not None else left))
                timed_out.clear()
                try:
                    client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
                except DeadKernelError:
                    run.stopped = ("ERROR", f"the kernel died in {describe(index)}")
                    return run
                if index not in timed_out:
                    run.finished.add(index)
                    continue
                if limit is None:
                    run.stopped = ("TIMEOUT", f"ran past the {timeout:g} s limit in {describe(index)}")
                    return run
                run.timed_out[index] = f"ran past the {limit:g} s cell limit in {describe(index)}"
                probe = min(_PROBE_SECONDS, deadline - time.monotonic())
                if probe > 0 and _kernel_answers(client, probe):
                    continue
                if not _restart_and_replay(client, notebook, run, skip | set(run.timed_out), deadline, timed_out):
                    if time.monotonic() >= deadline:
                        run.stopped = ("TIMEOUT", f"ran past the {timeout:g} s limit after {describe(index)}")
                    else:
                        run.stopped = ("ERROR", f"the kernel was restarted after {describe(index)}, "
                                                "and an earlier cell did not run again")  # fmt: skip
                    return run
    except Exception as exc:  # noqa: BLE001 - a kernel that cannot start must not stop the other notebooks
        run.stopped = ("ERROR", f"could not run the notebook: {type(exc).__name__}: {_first_line(str(exc))}")
    return run


def _harness_source(folder: Path, check: ReleaseCheck) -> str:
    """The grader's cell in place of a release check cell: run the function on the cases, save the answers.

    The paths are absolute: a student's ``os.chdir`` does not lose them.
    """
    work = str(folder / _WORK / str(check.number))
    return (
        f"__import__('vitlab_grader.harness', fromlist=['answer_cases']).answer_cases("
        f"{work + '-cases.pt'!r}, {work + '-answers.pt'!r}, lambda: {check.function})"
    )


def _describe(plan_origins: list[tuple[str, int]], release: Release, cells: list[Any], index: int) -> str:
    """A cell of the run in words: ``the token_count exercise's check`` or ``cell 12 (`def f(x):`)``."""
    kind, number = plan_origins[index]
    if kind == "check":
        check = release.checks[number]
        return f"the check of {check.function} ({check.check})"
    first = _first_line(source(cells[number]), 60)
    return f"cell {number} (`{first}`)" if first else f"cell {number}"


@dataclass(frozen=True)
class _Settings:
    timeout: float
    cell_timeout: float | None
    all_or_nothing: bool
    sandbox: bool


def _score(status: str, worth: float, fraction: float, all_or_nothing: bool) -> float:
    if all_or_nothing:
        return worth if status == "PASS" else 0.0
    return round(worth * (fraction if status in ("PASS", "FAIL", "TODO") else 0.0), 4)


def _read_answers(path: Path, cases: int) -> Any:
    """The student's answers a grader's cell saved, or why they cannot be read (a string)."""
    import torch

    from vitlab_grader.harness import decode

    if not path.is_file():
        return "the grader's cell saved no answers"
    size = path.stat().st_size
    if size > ANSWERS_LIMIT:
        return f"the answers take {size} bytes, more than the {ANSWERS_LIMIT} the grader reads"
    try:
        return decode(torch.load(path, weights_only=True, map_location="cpu"), cases)
    except Exception as exc:  # noqa: BLE001 - a file the student's code may have written: anything
        return f"the answers cannot be read: {type(exc).__name__}: {_first_line(str(exc))}"


def _verdict(spec: Any, answers: Any, run: _Run, index: int, cell: Any, describe: Any) -> tuple[str, str, float, str]:
    """``(status, message, fraction, function)`` of one exercise after the run."""
    from vitlab.checks._core import evaluate

    if index in run.timed_out:
        return "TIMEOUT", run.timed_out[index], 0.0, ""
    if index not in run.finished:
        assert run.stopped is not None, "every code cell runs unless the run stopped"
        status, why = run.stopped
        return status, why if why.endswith(describe(index)) else f"not run: {why}", 0.0, ""
    if isinstance(answers, str):
        raised = _error(cell)
        return "ERROR", answers + (f" (the grader's cell raised {raised})" if raised else ""), 0.0, ""
    result = evaluate(spec, answers)
    return _DATA_STATUS[result.status], result.message, result.fraction, answers.function


def _write_cases(folder: Path, checks: Sequence[ReleaseCheck], specs: dict[str, Any]) -> None:
    import torch

    work = folder / _WORK
    work.mkdir()
    for check in checks:
        torch.save(list(specs[check.check].cases), work / f"{check.number}-cases.pt")


def _grade_submission(
    path: Path, data: bytes, student: str, releases: list[Release], settings: _Settings
) -> NotebookResult:
    """Grade one submission (its bytes, read before any kernel started) against its release notebook."""
    import nbformat

    from vitlab_grader.isolation import submission_folder

    result = NotebookResult(str(path), student=student)
    try:
        notebook = nbformat.reads(data.decode("utf-8"), as_version=4)
    except Exception as exc:  # noqa: BLE001 - not JSON, not a notebook, not UTF-8
        result.status = "ERROR"
        result.error = f"cannot read the notebook: {type(exc).__name__}: {_first_line(str(exc))}"
        return result
    release, result.anomalies = match_release(path, notebook, releases)
    if release is None:
        names = ", ".join(r.name for r in releases)
        result.status, result.error = "ERROR", f"matches no notebook of the release ({names}): rename it after one"
        return result
    result.release = release.name
    name = path.name if path.name not in release.files else f"submission-{path.name}"
    with submission_folder({**release.files, name: data}) as folder:
        _run_in(folder, path, notebook, release, result, settings)
    return result


def _run_in(
    folder: Path, path: Path, notebook: Any, release: Release, result: NotebookResult, settings: _Settings
) -> None:
    """Run a submission in its folder, then score every exercise of its release notebook into ``result``."""
    import nbformat

    from vitlab_grader.isolation import end_processes, isolated_kernel_manager, scrubbed_env
    from vitlab_grader.specs import check_spec

    planned = plan(notebook, release, partial(_harness_source, folder))
    result.anomalies += planned.anomalies
    cells = notebook["cells"]
    specs = {check.check: check_spec(check.check) for check in release.checks}
    code = [source(cells[n]) for kind, n in planned.origins if kind == "student"]
    release_code = [
        source(c) for i, c in enumerate(release.notebook.get("cells", []))
        if c.get("cell_type") == "code" and i not in {check.cell for check in release.checks}
    ]  # fmt: skip
    baseline = vitlab_names(release_code)
    result.anomalies += [f"uses {name} (from vitlab.checks)" for name in copied_references(code, baseline)]
    result.anomalies += [f"the code {what}" for what in suspicious(code, release_code)]
    run_cells = [nbformat.v4.new_code_cell(text) for text in planned.sources]
    run_notebook = nbformat.v4.new_notebook(cells=run_cells, metadata=release.notebook.get("metadata", {}))
    describe = partial(_describe, planned.origins, release, cells)
    skip = {i for i, (kind, _) in enumerate(planned.origins) if kind == "check"}
    start = time.monotonic()
    _write_cases(folder, release.checks, specs)
    km, isolation = isolated_kernel_manager(folder, scrubbed_env(), sandbox=settings.sandbox)
    result.sandbox, result.isolation = isolation.sandbox, isolation.note
    try:
        run = _execute(run_notebook, km, settings.timeout, settings.cell_timeout, skip, describe)
    finally:
        end_processes(km)  # every process the kernel started is gone before anything is read
    answers = {
        check.number: _read_answers(folder / _WORK / f"{check.number}-answers.pt", len(specs[check.check].cases))
        for check in release.checks
    }  # fmt: skip
    result.seconds = round(time.monotonic() - start, 1)
    result.restarts = run.restarts
    result.timed_out_cells = sorted(planned.origins[i][1] for i in run.timed_out if i not in skip)
    errors = {i: _error(run_notebook.cells[i]) for i in run.finished}
    problems = {i: f"{describe(i)}: {error}" for i, error in errors.items() if error}
    problems |= {i: f"{describe(i)}: {why.removesuffix(f' in {describe(i)}')}" for i, why in run.timed_out.items()}
    outside = sorted(i for i in problems if i not in skip)
    result.first_error = problems[outside[0]] if outside else ""
    if run.stopped is not None:
        result.status, result.error = run.stopped
    elif run.timed_out:
        result.status, result.error = "TIMEOUT", run.timed_out[min(run.timed_out)]
    elif result.first_error:
        result.status, result.error = "ERROR", result.first_error
    where = {number: i for i, (kind, number) in enumerate(planned.origins) if kind == "check"}
    for check in release.checks:
        spec = specs[check.check]
        found = answers[check.number]
        index = where[check.number]
        status, message, fraction, function = _verdict(spec, found, run, index, run_notebook.cells[index], describe)
        flags = copied_references(code, baseline, reference_objects(spec.reference))
        if function.startswith("vitlab."):
            flags.append(f"the answer is vitlab's own {function}")
        score = _score(status, check.points, fraction, settings.all_or_nothing)
        result.exercises.append(
            ExerciseResult(str(path), check.check, check.function, status, message, check.points, fraction, score,
                           result.student, "; ".join(dict.fromkeys(flags)))
        )  # fmt: skip


def grade_notebook(
    path: str | Path, release: Iterable[str | Path], timeout: float = 300, **settings: Any
) -> NotebookResult:
    """Grade one submission against the release: :func:`grade` for one path (same keyword arguments)."""
    (result,) = grade([path], release, timeout, **settings)
    return result


def _student_ids(paths: list[Path], root: Path | None, id_source: str, pattern: str | None) -> dict[Path, str]:
    from vitlab_grader.ids import student_ids

    return student_ids(paths, root=root, source=id_source, pattern=pattern)


def grade(
    paths: Iterable[str | Path],
    release: Iterable[str | Path],
    timeout: float = 300,
    jobs: int = 1,
    *,
    cell_timeout: float | None = None,
    all_or_nothing: bool = False,
    id_source: str = "auto",
    id_pattern: str | None = None,
    root: str | Path | None = None,
    sandbox: bool = True,
) -> Iterator[NotebookResult]:
    """Grade submissions against the release, one after the other (or ``jobs`` at a time).

    Every submission is read into memory before the first kernel starts (a kernel cannot
    change a classmate's file before it is graded). Results come in the order of ``paths``.

    Args:
        paths: the submitted notebooks.
        release: the release notebooks (the student copies), files or folders.
        timeout: seconds for a whole notebook.
        jobs: notebooks run at the same time.
        cell_timeout: seconds for one cell (``None``: only the notebook's limit).
        all_or_nothing: full points for a ``PASS`` and none otherwise, instead of partial credit.
        id_source, id_pattern, root: how the student ids are found
            (:func:`vitlab_grader.ids.student_ids`).
        sandbox: ``False`` runs the kernels without an OS sandbox (folder, environment and
            processes are still isolated).

    Raises:
        AssignmentError: the release cannot be read.
        vitlab_grader.ids.StudentIdError: two submissions get the same student id.
    """
    paths = [Path(p) for p in paths]
    releases = read_release(release)
    ids = _student_ids(paths, Path(root) if root is not None else None, id_source, id_pattern)
    submissions: list[tuple[Path, bytes | str]] = []
    for path in paths:
        try:
            submissions.append((path, path.read_bytes()))
        except OSError as exc:
            submissions.append((path, f"cannot read the notebook: {type(exc).__name__}: {exc.strerror}"))
    settings = _Settings(timeout, cell_timeout, all_or_nothing, sandbox)

    def one(item: tuple[Path, bytes | str]) -> NotebookResult:
        path, data = item
        if isinstance(data, str):
            return NotebookResult(str(path), status="ERROR", error=data, student=ids[path])
        return _grade_submission(path, data, ids[path], releases, settings)

    if jobs <= 1 or len(submissions) <= 1:
        for item in submissions:
            yield one(item)
        return
    # Threads are enough: each notebook runs in its own kernel process, and nbclient gives
    # every thread its own event loop; the threads only wait on the kernels.
    with ThreadPoolExecutor(jobs) as pool:
        yield from pool.map(one, submissions)
