"""Grade submitted notebooks: run each one, read the results its check cells show.

Each notebook runs in a fresh ``python3`` kernel whose working folder is the notebook's
folder, with a time limit for the whole notebook (kernel start-up not counted) and,
optionally, one per cell. Cells that raise do not stop it (``allow_errors``), so later
checks still run; the first error outside the check cells is recorded.

A cell that runs past the per-cell limit is interrupted (``KeyboardInterrupt``, as the
stop button does) and the run goes on with the next cell in the same kernel, so the
names the earlier cells defined are still there. If the kernel does not answer within
a few seconds of the interrupt (code stuck in C, or a ``try`` that swallows
``KeyboardInterrupt``), it is restarted and every earlier cell that ran (check cells
and the timed-out cell excepted) is run again, silently, before the run goes on.

A check cell is a code cell tagged ``check`` or one that calls
``vitlab.checks.<name>(...)``. The kernels run with ``VITLAB_CHECK_DATA=1``, so every
check shows its result as data (:data:`vitlab.checks._core.DATA_MIME`): status, message,
cases passed of the cases run. A check cell without that data (an older ``vitlab``, a
check of your own that prints) is read from its printed ``PASS``/``FAIL``/``TODO`` line.
Its status is ``PASS``, ``FAIL`` or ``TODO``, else ``ERROR`` (the cell raised, showed
no result, or the kernel died) or ``TIMEOUT`` (a time limit ran out before or during it).

Score: ``points * fraction``, where ``points`` comes from the check cell's metadata
(:func:`vitlab.assignments.exercises.points`, default 1) and ``fraction`` is the share
of the check's cases that passed (0 for ``ERROR`` and ``TIMEOUT``); with
``all_or_nothing`` it is ``points`` for a ``PASS`` and 0 otherwise.

The grader runs the students' code with your permissions: grade in a container or a
throwaway account.
"""

from __future__ import annotations

import copy
import csv
import html
import json
import logging
import math
import os
import re
import subprocess
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from vitlab.assignments.exercises import (
    CHECK,
    DEFAULT_POINTS,
    AssignmentError,
    check_call,
    parse,
    points,
    source,
    tags,
)

STATUSES = ("PASS", "FAIL", "TODO", "ERROR", "TIMEOUT")
CSV_COLUMNS = (
    "notebook", "exercise", "function", "status", "message", "cell", "points", "fraction", "score", "student",
)  # fmt: skip
DATA_MIME = "application/vnd.vitlab.check+json"  # vitlab.checks._core.DATA_MIME (not imported: no torch here)
DATA_ENV = "VITLAB_CHECK_DATA"
DEFAULT_ID_PATTERN = r"^(?P<id>[^_]+)_"  # "s1234_07_t2t_vit.ipynb" -> "s1234"; no match: the file name
_LINE = re.compile(r"^(PASS|FAIL|TODO) ([A-Za-z_]\w*)\b.*$", re.MULTILINE)
_DATA_STATUS = {"passed": "PASS", "failed": "FAIL", "not implemented": "TODO"}
_PROBE_SECONDS = 10  # how long an interrupted kernel may take to answer again
_TIMEOUT_ENAME = "CellTimeoutError"  # the error nbclient's reply carries for a cell past its limit
_QUIET = logging.getLogger("vitlab.assignments.grade.nbclient")  # nbclient's timeout messages: not the table's
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


@dataclass(frozen=True)
class ExerciseResult:
    """One row of the results: a check cell of a notebook, what it showed, and its score."""

    notebook: str
    exercise: str  # the check's name, e.g. "t2t_token_count"
    function: str  # the student's function given to the check
    status: str  # one of STATUSES
    message: str  # the check's line, or why there is none
    cell: int | None  # index of the check cell in the notebook
    points: float = DEFAULT_POINTS  # what the exercise is worth
    fraction: float = 0.0  # share of the check's cases that passed
    score: float = 0.0  # points * fraction, or all or nothing
    student: str = ""  # the student id taken from the file name


@dataclass
class NotebookResult:
    """A graded notebook: its exercises, why it stopped, its first error, the time it ran."""

    notebook: str
    status: str = "OK"  # OK, ERROR (a cell raised, or the notebook could not run) or TIMEOUT
    error: str = ""  # the first of: why the run stopped, a cell past its limit, the first error
    seconds: float = 0.0
    exercises: list[ExerciseResult] = field(default_factory=list)
    student: str = ""
    first_error: str = ""  # the first error outside the check cells, even when the run timed out
    timed_out_cells: list[int] = field(default_factory=list)
    restarts: int = 0  # kernel restarts after a cell that did not stop when interrupted

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

    def rows(self) -> list[ExerciseResult]:
        """The CSV rows: one per exercise, or one row saying why there are none."""
        if self.exercises:
            return self.exercises
        message = self.error or "no check cells found"
        status = "ERROR" if self.error else "TODO"
        return [ExerciseResult(self.notebook, "", "", status, message, None, 0.0, 0.0, 0.0, self.student)]


def student_id(path: str | Path, pattern: str = DEFAULT_ID_PATTERN) -> str:
    """The student id in a submission's file name: ``pattern``'s group ``id`` (or group 1, or all it matched).

    ``pattern`` is a regular expression searched in the file name without ``.ipynb``; when
    it does not match, the id is that whole name.
    """
    name = Path(path).name.removesuffix(".ipynb")
    match = re.search(pattern, name)
    if match is None:
        return name
    if "id" in match.re.groupindex:
        return match.group("id")
    return match.group(1) if match.re.groups else match.group(0)


def _first_line(text: str, limit: int = 200) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _error(cell: dict[str, Any]) -> str | None:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return f"{output.get('ename', 'Error')}: {_first_line(output.get('evalue', ''))}".rstrip(": ")
    return None


def _shown_text(cell: dict[str, Any]) -> str:
    """What the cell printed to stdout and showed as text/plain display data, in order."""
    parts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream" and output.get("name") == "stdout":
            parts.append("".join(output.get("text", "")))
        elif output.get("output_type") == "display_data":
            text = output.get("data", {}).get("text/plain", "")
            parts.append(("".join(text) if isinstance(text, list) else text) + "\n")
    return "".join(parts)


def check_data(cell: dict[str, Any]) -> list[dict[str, Any]]:
    """Every check result a cell showed as data (:data:`DATA_MIME`), in order."""
    found = []
    for output in cell.get("outputs", []):
        data = output.get("data", {}).get(DATA_MIME) if output.get("output_type") == "display_data" else None
        if isinstance(data, str):  # a notebook written by a tool that keeps JSON as text
            try:
                data = json.loads(data)
            except ValueError:
                data = None
        if isinstance(data, dict) and data.get("status") in _DATA_STATUS:
            found.append(dict(data))
    return found


def check_cells(notebook: dict[str, Any]) -> list[tuple[int, str, str]]:
    """``(cell index, check, function)`` for every check cell, tagged or recognised by its call."""
    found = []
    for index, cell in enumerate(notebook["cells"]):
        if cell.get("cell_type") != "code":
            continue
        try:
            call = check_call(parse(source(cell)))
        except (SyntaxError, ValueError):  # a student's broken cell: not a check cell
            call = None
        if call is not None:
            found.append((index, call[0], call[1] or ""))
        elif CHECK in tags(cell):
            found.append((index, "", ""))
    return found


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


def _execute(notebook: Any, folder: Path, timeout: float, cell_timeout: float | None, skip: set[int]) -> _Run:
    """Run the code cells in order under the notebook's and each cell's time limits.

    ``skip``: the check cells, which a restart does not run again.
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    timed_out: list[int] = []

    def on_executed(cell: Any, cell_index: int, execute_reply: dict[str, Any]) -> None:
        if execute_reply.get("content", {}).get("ename") == _TIMEOUT_ENAME:
            timed_out.append(cell_index)

    client = NotebookClient(
        notebook, kernel_name="python3", allow_errors=True, shutdown_kernel="immediate",
        resources={"metadata": {"path": str(folder)}},
        interrupt_on_timeout=True,  # interrupt the cell, as the stop button does, and go on
        error_on_timeout={"ename": _TIMEOUT_ENAME, "evalue": "", "traceback": []},
        on_cell_executed=on_executed, log=_QUIET,
    )  # fmt: skip
    run = _Run()
    client.reset_execution_trackers()
    env = {**os.environ, DATA_ENV: "1"}
    try:
        # the kernel process's own log (not the notebook's output) would clutter the table
        with client.setup_kernel(stderr=subprocess.DEVNULL, env=env):
            start = time.monotonic()
            deadline = start + timeout
            for index, cell in enumerate(notebook.cells):
                if cell.cell_type != "code":
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    run.stopped = ("TIMEOUT", f"ran past the {timeout:g} s limit before cell {index}")
                    return run
                limit = cell_timeout if cell_timeout is not None and cell_timeout < left else None
                client.timeout = max(1, math.ceil(limit if limit is not None else left))
                timed_out.clear()
                try:
                    client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
                except DeadKernelError:
                    run.stopped = ("ERROR", f"the kernel died in cell {index}")
                    return run
                if index not in timed_out:
                    run.finished.add(index)
                    continue
                if limit is None:
                    run.stopped = ("TIMEOUT", f"ran past the {timeout:g} s limit in cell {index}")
                    return run
                run.timed_out[index] = f"ran past the {limit:g} s cell limit in cell {index}"
                probe = min(_PROBE_SECONDS, deadline - time.monotonic())
                if probe > 0 and _kernel_answers(client, probe):
                    continue
                if not _restart_and_replay(client, notebook, run, skip | set(run.timed_out), deadline, timed_out):
                    if time.monotonic() >= deadline:
                        run.stopped = ("TIMEOUT", f"ran past the {timeout:g} s limit after cell {index}")
                    else:
                        run.stopped = ("ERROR", f"the kernel was restarted after cell {index}, "
                                                "and an earlier cell did not run again")  # fmt: skip
                    return run
    except Exception as exc:  # noqa: BLE001 - a kernel that cannot start must not stop the other notebooks
        run.stopped = ("ERROR", f"could not run the notebook: {type(exc).__name__}: {_first_line(str(exc))}")
    return run


def _status(cell: Any, index: int, check: str, run: _Run, first_error: str | None) -> tuple[str, str, str, float]:
    """``(status, message, check, fraction)`` of one check cell after the run."""
    if index in run.timed_out:
        return "TIMEOUT", run.timed_out[index], check, 0.0
    if index not in run.finished:
        assert run.stopped is not None, "every code cell runs unless the run stopped"
        status, why = run.stopped
        return status, why if why.endswith(f"cell {index}") else f"not run: {why}", check, 0.0
    data = [d for d in check_data(cell) if not check or d.get("name") == check]
    if data:  # the last one: an earlier result shown by the student's own code cannot pose as the check's
        last = data[-1]
        fraction = float(last.get("fraction", 1.0 if last["status"] == "passed" else 0.0))
        return _DATA_STATUS[last["status"]], str(last.get("message", "")), check or str(last.get("name", "")), fraction
    lines = [m for m in _LINE.finditer(_shown_text(cell)) if not check or m.group(2) == check]
    if lines:  # no data (a check that only prints): the last line; no case count, so all or nothing
        status = lines[-1].group(1)
        return status, lines[-1].group(0).strip(), check or lines[-1].group(2), 1.0 if status == "PASS" else 0.0
    message = _error(cell) or "the check cell showed no PASS, FAIL or TODO result"
    if first_error is not None:
        message += f" (first error in the notebook: {first_error})"
    return "ERROR", message, check, 0.0


def _score(status: str, worth: float, fraction: float, all_or_nothing: bool) -> float:
    if all_or_nothing:
        return worth if status == "PASS" else 0.0
    return round(worth * (fraction if status in ("PASS", "FAIL", "TODO") else 0.0), 4)


def grade_notebook(
    path: str | Path,
    timeout: float = 300,
    *,
    cell_timeout: float | None = None,
    all_or_nothing: bool = False,
    id_pattern: str = DEFAULT_ID_PATTERN,
) -> NotebookResult:
    """Execute one notebook (a copy in memory; the file is not changed) and read its checks.

    Args:
        path: the submission.
        timeout: seconds for the whole notebook.
        cell_timeout: seconds for one cell (``None``: only the notebook's limit).
        all_or_nothing: full points for a ``PASS`` and none otherwise, instead of partial credit.
        id_pattern: how the student id is read from the file name (:func:`student_id`).
    """
    import nbformat

    result = NotebookResult(str(path), student=student_id(path, id_pattern))
    try:
        notebook = nbformat.read(Path(path), as_version=4)
    except Exception as exc:  # noqa: BLE001 - not JSON, not a notebook, unreadable
        result.status = "ERROR"
        result.error = f"cannot read the notebook: {type(exc).__name__}: {_first_line(str(exc))}"
        return result
    for cell in notebook.cells:  # a cell the run does not reach must not show the student's old output
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    checks = check_cells(notebook)
    check_indices = {index for index, _, _ in checks}
    start = time.monotonic()
    run = _execute(notebook, Path(path).resolve().parent, timeout, cell_timeout, check_indices)
    result.seconds = round(time.monotonic() - start, 1)
    result.timed_out_cells, result.restarts = sorted(run.timed_out), run.restarts
    problems = {i: f"cell {i}: {_error(notebook.cells[i])}" for i in run.finished if _error(notebook.cells[i])}
    problems |= {i: f"cell {i}: {why.removesuffix(f' in cell {i}')}" for i, why in run.timed_out.items()}
    outside = sorted(i for i in problems if i not in check_indices)
    first_error = problems[outside[0]] if outside else None
    result.first_error = first_error or ""
    if run.stopped is not None:
        result.status, result.error = run.stopped
    elif run.timed_out:
        result.status, result.error = "TIMEOUT", run.timed_out[min(run.timed_out)]
    elif first_error is not None:
        result.status, result.error = "ERROR", first_error
    for index, check, function in checks:
        status, message, check, fraction = _status(notebook.cells[index], index, check, run, first_error)
        try:
            worth = points(notebook.cells[index])
        except AssignmentError:
            worth = DEFAULT_POINTS
        score = _score(status, worth, fraction, all_or_nothing)
        row = ExerciseResult(str(path), check, function, status, message, index, worth, fraction, score, result.student)
        result.exercises.append(row)
    return result


def grade(
    paths: Iterable[str | Path],
    timeout: float = 300,
    jobs: int = 1,
    *,
    cell_timeout: float | None = None,
    all_or_nothing: bool = False,
    id_pattern: str = DEFAULT_ID_PATTERN,
) -> Iterator[NotebookResult]:
    """Grade notebooks one after the other (or ``jobs`` at a time); yield the results in order.

    The keyword arguments are :func:`grade_notebook`'s.
    """
    paths = list(paths)
    one = partial(
        grade_notebook, timeout=timeout, cell_timeout=cell_timeout, all_or_nothing=all_or_nothing,
        id_pattern=id_pattern,
    )  # fmt: skip
    if jobs <= 1 or len(paths) <= 1:
        for path in paths:
            yield one(path)
        return
    # Threads are enough: each notebook runs in its own kernel process, and nbclient gives
    # every thread its own event loop; the threads only wait on the kernels.
    with ThreadPoolExecutor(jobs) as pool:
        yield from pool.map(one, paths)


def _number(x: float) -> str:
    """``1``, ``0.5``, ``0.6667``: points without trailing zeros."""
    return f"{round(x, 4):g}"


def write_csv(results: list[NotebookResult], path: str | Path) -> None:
    """One row per (notebook, exercise), columns :data:`CSV_COLUMNS`."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer: csv.DictWriter[str] = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for result in results:
            for row in result.rows():
                values = asdict(row)
                values.update({k: _number(values[k]) for k in ("points", "fraction", "score")})
                writer.writerow(values)


def gradebook(results: list[NotebookResult]) -> tuple[list[str], list[tuple[str, dict[str, float]]]]:
    """``(exercise columns, [(student id, {column: score})])``: one row per student, ids sorted.

    A student's notebooks are merged into one row. Columns are the check names in the
    order they first appear; a check a student's notebooks run twice gets a second column
    ``name (2)``. ``total`` is the sum of a row's scores.
    """
    columns: list[str] = []
    students: dict[str, dict[str, float]] = {}
    for result in results:
        row = students.setdefault(result.student, {})
        for exercise in result.exercises:
            name = exercise.exercise or f"cell {exercise.cell}"
            column, n = name, 1
            while column in row:
                n += 1
                column = f"{name} ({n})"
            row[column] = exercise.score
            if column not in columns:
                columns.append(column)
    return columns, sorted(students.items())


def write_gradebook(results: list[NotebookResult], path: str | Path, id_column: str = "student_id") -> None:
    """The gradebook CSV: column ``id_column``, one column per exercise, then ``total``.

    The layout LMS imports take (an id column, then score columns): name ``id_column``
    after the field your LMS matches students by (Canvas: ``SIS User ID``, Moodle: the
    identifier you map on import such as ``ID number``, Gradescope: ``SID`` or ``Email``).
    An exercise a student did not hand in is empty.
    """
    columns, rows = gradebook(results)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow([id_column, *columns, "total"])
        for student, scores in rows:
            cells = [_number(scores[c]) if c in scores else "" for c in columns]
            writer.writerow([student, *cells, _number(sum(scores.values()))])


def write_json(results: list[NotebookResult], path: str | Path, timeout: float, **settings: Any) -> None:
    """Every notebook with its status, errors, run time, score and exercises; ``settings`` are recorded too."""
    notebooks = [
        {**asdict(r), "passed": r.passed, "total": r.total, "score": r.score, "max_score": r.max_score,
         "exercises": [asdict(e) for e in r.rows()]}
        for r in results
    ]  # fmt: skip
    document = {"timeout": timeout, **settings, "notebooks": notebooks}
    Path(path).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")


def _feedback_name(result: NotebookResult, used: set[str], suffix: str) -> str:
    stem = Path(result.notebook).name.removesuffix(".ipynb") or "notebook"
    name, n = f"{stem}{suffix}", 1
    while name in used:
        n += 1
        name = f"{stem}-{n}{suffix}"
    used.add(name)
    return name


def _cases(row: ExerciseResult) -> str:
    return f"{row.fraction:.0%} of the cases" if row.status in ("PASS", "FAIL", "TODO") else "not graded"


def feedback_markdown(result: NotebookResult) -> str:
    """A submission's feedback as Markdown: score, notebook problems, each exercise's status, points and message."""
    name = Path(result.notebook).name
    lines = [f"# Feedback on {name}", ""]
    if result.student:
        lines += [f"Student: {result.student}", ""]
    score = f"Score: **{_number(result.score)} / {_number(result.max_score)}** points"
    lines += [f"{score} ({result.passed} of {result.total} exercises passed).", ""]
    if result.error:
        lines += [f"The notebook: {result.status}: {result.error}", ""]
    if result.first_error and result.first_error != result.error:
        lines += [f"First error outside the checks: {result.first_error}", ""]
    lines += ["| Exercise | Your function | Status | Cases | Points |", "|---|---|---|---|---|"]
    for row in result.rows():
        function = f"`{row.function}`" if row.function else "-"
        points_text = f"{_number(row.score)} / {_number(row.points)}"
        lines.append(f"| `{row.exercise or '-'}` | {function} | {row.status} | {_cases(row)} | {points_text} |")
    lines.append("")
    for row in result.rows():
        lines += [f"## {row.exercise or 'The notebook'}", "", "```text", row.message, "```", ""]
    return "\n".join(lines)


_STYLE = (
    "<style>body{font-family:sans-serif;max-width:50em;margin:2em auto}"
    "td,th{border:1px solid #ccc;padding:.3em .6em}table{border-collapse:collapse}"
    "pre{background:#f6f6f6;padding:.6em;white-space:pre-wrap}</style>"
)


def feedback_html(result: NotebookResult) -> str:
    """The same content as :func:`feedback_markdown`, as a standalone HTML page."""
    e = html.escape
    name = Path(result.notebook).name
    parts = [
        "<!DOCTYPE html>", '<html lang="en">', '<head><meta charset="utf-8">',
        f"<title>Feedback on {e(name)}</title>",
        _STYLE,
        "</head>", "<body>", f"<h1>Feedback on {e(name)}</h1>",
    ]  # fmt: skip
    if result.student:
        parts.append(f"<p>Student: {e(result.student)}</p>")
    parts.append(f"<p>Score: <strong>{_number(result.score)} / {_number(result.max_score)}</strong> points "
                 f"({result.passed} of {result.total} exercises passed).</p>")  # fmt: skip
    if result.error:
        parts.append(f"<p>The notebook: {e(result.status)}: {e(result.error)}</p>")
    if result.first_error and result.first_error != result.error:
        parts.append(f"<p>First error outside the checks: {e(result.first_error)}</p>")
    parts.append("<table><tr><th>Exercise</th><th>Your function</th><th>Status</th><th>Cases</th><th>Points</th></tr>")
    for row in result.rows():
        parts.append(
            f"<tr><td><code>{e(row.exercise or '-')}</code></td><td><code>{e(row.function or '-')}</code></td>"
            f"<td>{e(row.status)}</td><td>{e(_cases(row))}</td>"
            f"<td>{_number(row.score)} / {_number(row.points)}</td></tr>"
        )
    parts.append("</table>")
    for row in result.rows():
        parts += [f"<h2>{e(row.exercise or 'The notebook')}</h2>", f"<pre>{e(row.message)}</pre>"]
    parts += ["</body>", "</html>", ""]
    return "\n".join(parts)


def write_feedback(results: list[NotebookResult], folder: str | Path, fmt: str = "md") -> list[Path]:
    """One feedback file per submission in ``folder`` (``<notebook name>.md`` or ``.html``); the paths written."""
    if fmt not in ("md", "html"):
        raise ValueError(f"feedback format must be 'md' or 'html', got {fmt!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    used: set[str] = set()
    written = []
    for result in results:
        target = folder / _feedback_name(result, used, f".{fmt}")
        text = feedback_markdown(result) if fmt == "md" else feedback_html(result)
        target.write_text(text, encoding="utf-8")
        written.append(target)
    return written


def summary(result: NotebookResult, width: int = 100) -> str:
    """A notebook's score line, then one line per exercise: status, check, points, message."""
    head = (f"{result.notebook}: {result.passed}/{result.total} passed, "
            f"{_number(result.score)}/{_number(result.max_score)} points ({result.seconds:.1f} s)")  # fmt: skip
    if result.error:
        head += f", {result.status}: {result.error}"
    lines = [head]
    for row in result.rows():
        message = "" if row.status == "PASS" else row.message
        if row.exercise:  # "FAIL name [case 1/9: label]: what" -> "case 1/9: what"
            message = re.sub(rf"^(FAIL|TODO) {re.escape(row.exercise)}\b:?\s*", "", message)
            message = re.sub(r"^\[case (\d+/\d+)[^\]]*\]:\s*", r"case \1: ", message)
        worth = f"{_number(row.score)}/{_number(row.points)}"
        text = f"  {row.status:<8} {row.exercise or '-':<30} {worth:>7}  {message}".rstrip()
        lines.append(text if len(text) <= width else text[: width - 3] + "...")
    return "\n".join(lines)
