"""Grade submitted notebooks: run each one, read the lines its check cells print.

Each notebook runs in a fresh ``python3`` kernel whose working folder is the notebook's
folder, with a time limit for the whole notebook (kernel start-up not counted). Cells
that raise do not stop it (``allow_errors``), so later checks still run; the first error
outside the check cells is recorded. A check cell is a code cell tagged ``check`` or one
that calls ``vitlab.checks.<name>(...)``. Its status is what it printed (``PASS``,
``FAIL``, ``TODO``), else ``ERROR`` (the cell raised, printed nothing, or the kernel died)
or ``TIMEOUT`` (the time limit ran out before or during it).

The grader runs the students' code with your permissions: grade in a container or a
throwaway account.
"""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vitlab.assignments.exercises import CHECK, check_call, parse, source, tags

STATUSES = ("PASS", "FAIL", "TODO", "ERROR", "TIMEOUT")
CSV_COLUMNS = ("notebook", "exercise", "function", "status", "message", "cell")
_LINE = re.compile(r"^(PASS|FAIL|TODO) ([A-Za-z_]\w*)\b.*$", re.MULTILINE)


@dataclass(frozen=True)
class ExerciseResult:
    """One row of the results: a check cell of a notebook and what it printed."""

    notebook: str
    exercise: str  # the check's name, e.g. "t2t_token_count"
    function: str  # the student's function given to the check
    status: str  # one of STATUSES
    message: str  # the check's line, or why there is none
    cell: int | None  # index of the check cell in the notebook


@dataclass
class NotebookResult:
    """A graded notebook: its exercises, the first error outside the checks, the time it ran."""

    notebook: str
    status: str = "OK"  # OK, ERROR (a cell raised, or the notebook could not run) or TIMEOUT
    error: str = ""
    seconds: float = 0.0
    exercises: list[ExerciseResult] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(r.status == "PASS" for r in self.exercises)

    @property
    def total(self) -> int:
        return len(self.exercises)

    def rows(self) -> list[ExerciseResult]:
        """The CSV rows: one per exercise, or one row saying why there are none."""
        if self.exercises:
            return self.exercises
        message = self.error or "no check cells found"
        return [ExerciseResult(self.notebook, "", "", "ERROR" if self.error else "TODO", message, None)]


def _first_line(text: str, limit: int = 200) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _error(cell: dict[str, Any]) -> str | None:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return f"{output.get('ename', 'Error')}: {_first_line(output.get('evalue', ''))}".rstrip(": ")
    return None


def _stdout(cell: dict[str, Any]) -> str:
    return "".join(
        "".join(o.get("text", "")) for o in cell.get("outputs", [])
        if o.get("output_type") == "stream" and o.get("name") == "stdout"
    )  # fmt: skip


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


def _execute(notebook: Any, folder: Path, timeout: float) -> tuple[set[int], tuple[str, str] | None]:
    """Run the code cells in order; return the cells that finished and why the run stopped early."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    client = NotebookClient(
        notebook, kernel_name="python3", allow_errors=True, shutdown_kernel="immediate",
        resources={"metadata": {"path": str(folder)}},
    )  # fmt: skip
    finished: set[int] = set()
    client.reset_execution_trackers()
    try:
        # the kernel process's own log (not the notebook's output) would clutter the table
        with client.setup_kernel(stderr=subprocess.DEVNULL):
            start = time.monotonic()
            for index, cell in enumerate(notebook.cells):
                if cell.cell_type != "code":
                    continue
                left = timeout - (time.monotonic() - start)
                if left <= 0:
                    return finished, ("TIMEOUT", f"ran past the {timeout:g} s limit before cell {index}")
                client.timeout = max(1, math.ceil(left))
                try:
                    client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
                except CellTimeoutError:
                    return finished, ("TIMEOUT", f"ran past the {timeout:g} s limit in cell {index}")
                except DeadKernelError:
                    return finished, ("ERROR", f"the kernel died in cell {index}")
                finished.add(index)
    except Exception as exc:  # noqa: BLE001 - a kernel that cannot start must not stop the other notebooks
        return finished, ("ERROR", f"could not run the notebook: {type(exc).__name__}: {_first_line(str(exc))}")
    return finished, None


def _status(
    cell: Any, index: int, check: str, finished: set[int], stopped: tuple[str, str] | None, first_error: str | None
) -> tuple[str, str, str]:
    """``(status, message, check)`` of one check cell after the run."""
    if index not in finished:
        assert stopped is not None, "every code cell runs unless the run stopped"
        status, why = stopped
        return status, why if why.endswith(f"cell {index}") else f"not run: {why}", check
    lines = [m for m in _LINE.finditer(_stdout(cell)) if not check or m.group(2) == check]
    if lines:  # the last one: a line the student's own code printed cannot pose as the check's
        return lines[-1].group(1), lines[-1].group(0).strip(), check or lines[-1].group(2)
    message = _error(cell) or "the check cell printed no PASS, FAIL or TODO line"
    if first_error is not None:
        message += f" (first error in the notebook: {first_error})"
    return "ERROR", message, check


def grade_notebook(path: str | Path, timeout: float = 300) -> NotebookResult:
    """Execute one notebook (a copy in memory; the file is not changed) and read its checks."""
    import nbformat

    result = NotebookResult(str(path))
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
    start = time.monotonic()
    finished, stopped = _execute(notebook, Path(path).resolve().parent, timeout)
    result.seconds = round(time.monotonic() - start, 1)
    others = sorted(finished - {index for index, _, _ in checks})
    first_error = next((f"cell {i}: {_error(notebook.cells[i])}" for i in others if _error(notebook.cells[i])), None)
    if stopped is not None:
        result.status, result.error = stopped
    elif first_error is not None:
        result.status, result.error = "ERROR", first_error
    for index, check, function in checks:
        status, message, check = _status(notebook.cells[index], index, check, finished, stopped, first_error)
        result.exercises.append(ExerciseResult(str(path), check, function, status, message, index))
    return result


def grade(paths: Iterable[str | Path], timeout: float = 300, jobs: int = 1) -> Iterator[NotebookResult]:
    """Grade notebooks one after the other (or ``jobs`` at a time); yield the results in order."""
    paths = list(paths)
    if jobs <= 1 or len(paths) <= 1:
        for path in paths:
            yield grade_notebook(path, timeout)
        return
    # Threads are enough: each notebook runs in its own kernel process, and nbclient gives
    # every thread its own event loop; the threads only wait on the kernels.
    with ThreadPoolExecutor(jobs) as pool:
        yield from pool.map(grade_notebook, paths, [timeout] * len(paths))


def write_csv(results: list[NotebookResult], path: str | Path) -> None:
    """One row per (notebook, exercise), columns :data:`CSV_COLUMNS`."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for result in results:
            writer.writerows(asdict(row) for row in result.rows())


def write_json(results: list[NotebookResult], path: str | Path, timeout: float) -> None:
    """Every notebook with its status, first error, run time, score and exercises."""
    notebooks = [
        {**asdict(r), "passed": r.passed, "total": r.total, "exercises": [asdict(e) for e in r.rows()]}
        for r in results
    ]
    Path(path).write_text(json.dumps({"timeout": timeout, "notebooks": notebooks}, indent=1) + "\n", encoding="utf-8")


def summary(result: NotebookResult, width: int = 100) -> str:
    """A notebook's score line, then one line per exercise: status, check, message."""
    head = f"{result.notebook}: {result.passed}/{result.total} passed ({result.seconds:.1f} s)"
    if result.error:
        head += f", {result.status}: {result.error}"
    lines = [head]
    for row in result.rows():
        message = "" if row.status == "PASS" else row.message
        if row.exercise:  # "FAIL name [case 1/9: label]: what" -> "case 1/9: what"
            message = re.sub(rf"^(FAIL|TODO) {re.escape(row.exercise)}\b:?\s*", "", message)
            message = re.sub(r"^\[case (\d+/\d+)[^\]]*\]:\s*", r"case \1: ", message)
        text = f"  {row.status:<8} {row.exercise or '-':<30} {message}".rstrip()
        lines.append(text if len(text) <= width else text[: width - 3] + "...")
    return "\n".join(lines)
