"""Find the exercises of an instructor notebook and check that they follow the course's format.

An "implement it" exercise is three code cells (markdown may sit between them):

* the stub, tagged ``exercise``: ``def fn(...): ... raise NotImplementedError``;
* the solution, tagged ``solution``: the same function, complete;
* the check, tagged ``check``: one call, ``vitlab.checks.<check>(fn);``. Its cell
  metadata may give the exercise's points, ``{"vitlab": {"points": 2}}`` (default 1;
  nbgrader's ``{"nbgrader": {"points": 2}}`` is read too).

A question is an untagged markdown cell followed by its answer, a markdown cell tagged
``answer``. The student copy drops every ``solution`` and ``answer`` cell, so this module
also makes sure the copy can run: no later cell may use a name that only a solution defines
or call an exercise's stub outside its check.

Notebooks are read as plain ``dict`` s (what :func:`json.load` or ``nbformat`` gives).
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXERCISE, SOLUTION, CHECK, ANSWER = "exercise", "solution", "check", "answer"
# A MyST dropdown titled "Answer" or "Solution": in an untagged cell the student would see it.
_ANSWER_DROPDOWN = re.compile(r"^\s*(```+|:::+)\s*\{dropdown\}\s*(answer|solution)\b", re.IGNORECASE | re.MULTILINE)
_EXERCISES_HEADING = re.compile(r"^##\s+Exercises\b", re.IGNORECASE | re.MULTILINE)
_LEVEL2_HEADING = re.compile(r"^##\s", re.MULTILINE)
_MAGIC = re.compile(r"^(\s*)[%!].*$", re.MULTILINE)


class AssignmentError(ValueError):
    """An instructor notebook that does not follow the exercise format (the message says where)."""


DEFAULT_POINTS = 1.0


@dataclass(frozen=True)
class Exercise:
    """One "implement it" exercise: cell indices of its stub, solution and check, and its points."""

    function: str
    check: str
    stub_cell: int
    solution_cell: int
    check_cell: int
    points: float = DEFAULT_POINTS


def points(cell: dict[str, Any]) -> float:
    """The points of a check cell: ``metadata.vitlab.points``, else ``metadata.nbgrader.points``, else 1.

    Raises:
        AssignmentError: the value is not a number >= 0.
    """
    metadata = cell.get("metadata", {})
    for owner in ("vitlab", "nbgrader"):
        value = (metadata.get(owner) or {}).get("points")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise AssignmentError(f"metadata {owner}.points must be a number >= 0, got {value!r}")
        return float(value)
    return DEFAULT_POINTS


@dataclass
class NotebookReport:
    """What :func:`inspect_notebook` found: exercises, questions, and what is wrong."""

    exercises: list[Exercise] = field(default_factory=list)
    questions: int = 0
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def tags(cell: dict[str, Any]) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def source(cell: dict[str, Any]) -> str:
    text = cell.get("source", "")
    return text if isinstance(text, str) else "".join(text)


def parse(code: str) -> ast.Module:
    """``ast.parse`` of a cell, IPython magics and shell lines read as ``pass``.

    Raises:
        SyntaxError: not Python; also code too deeply nested for the parser (its
            ``MemoryError`` or ``RecursionError``), with ``msg`` starting ``too complex to parse``.
    """
    try:
        return ast.parse(_MAGIC.sub(r"\1pass", code))
    except (MemoryError, RecursionError) as exc:
        raise SyntaxError(f"too complex to parse ({type(exc).__name__})") from None


def check_call(tree: ast.Module) -> tuple[str, str | None] | None:
    """``(check, argument)`` of the first ``vitlab.checks.<check>(arg)`` or ``checks.<check>(arg)`` call."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value
        is_checks = (isinstance(owner, ast.Name) and owner.id == "checks") or (
            isinstance(owner, ast.Attribute)
            and owner.attr == "checks"
            and isinstance(owner.value, ast.Name)
            and owner.value.id == "vitlab"
        )
        if is_checks:
            first = node.args[0] if node.args else None
            return node.func.attr, first.id if isinstance(first, ast.Name) else None
    return None


def functions(tree: ast.Module) -> list[str]:
    """Names of the top-level ``def`` s."""
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _raises_not_implemented(tree: ast.Module, name: str) -> bool:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            for inner in ast.walk(node):
                if isinstance(inner, ast.Raise) and inner.exc is not None:
                    exc = inner.exc.func if isinstance(inner.exc, ast.Call) else inner.exc
                    if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
                        return True
    return False


def _bound(statement: ast.stmt) -> set[str]:
    """Names a top-level statement binds in the notebook's namespace (not inside functions)."""
    names: set[str] = set()
    stack: list[ast.AST] = [statement]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue  # the body is another scope
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return names


def _loaded(node: ast.AST) -> dict[str, int]:
    """Every name read anywhere in ``node`` (function bodies included), with its first line."""
    lines: dict[str, int] = {}
    for inner in ast.walk(node):
        if isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Load):
            lines.setdefault(inner.id, inner.lineno)
    return lines


def _first_uses(tree: ast.Module, names: set[str]) -> dict[str, int]:
    """Lines where a cell reads one of ``names`` before it binds it again."""
    uses: dict[str, int] = {}
    pending = set(names)
    for statement in tree.body:
        for name, line in _loaded(statement).items():
            if name in pending:
                uses.setdefault(name, line)
        pending -= _bound(statement)
    return uses


def _in_exercises_section(cells: list[dict[str, Any]]) -> set[int]:
    """Indices of the cells under a ``## Exercises`` heading (up to the next ``##`` heading)."""
    inside, indices = False, set()
    for index, cell in enumerate(cells):
        if cell.get("cell_type") == "markdown":
            text = source(cell)
            if _EXERCISES_HEADING.search(text):
                inside = True
            elif _LEVEL2_HEADING.search(text):
                inside = False
        if inside:
            indices.add(index)
    return indices


def _next_code(cells: list[dict[str, Any]], index: int, step: int) -> int | None:
    index += step
    while 0 <= index < len(cells):
        if cells[index].get("cell_type") == "code":
            return index
        index += step
    return None


def inspect_notebook(notebook: dict[str, Any]) -> NotebookReport:
    """Find the exercises and questions of an instructor notebook; collect every problem.

    Errors make the student copy unsafe (a leak) or broken (it would crash); warnings do not.
    """
    cells: list[dict[str, Any]] = notebook.get("cells", [])
    report = NotebookReport()
    trees: dict[int, ast.Module] = {}
    for index, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        try:
            trees[index] = parse(source(cell))
        except SyntaxError as exc:
            (report.errors if {EXERCISE, SOLUTION, CHECK} & set(tags(cell)) else report.warnings).append(
                f"cell {index}: not valid Python ({exc.msg}, line {exc.lineno})"
            )

    expected_type = {EXERCISE: "code", SOLUTION: "code", CHECK: "code", ANSWER: "markdown"}
    for index, cell in enumerate(cells):
        for tag in set(tags(cell)) & set(expected_type):
            if cell.get("cell_type") != expected_type[tag]:
                report.errors.append(f"cell {index}: tagged {tag!r} but is a {cell.get('cell_type')} cell")

    owned_checks: set[int] = set()
    for index, cell in enumerate(cells):
        if cell.get("cell_type") != "code" or index not in trees:
            continue
        if SOLUTION in tags(cell):
            exercise = _exercise_at(cells, trees, index, report)
            if exercise is not None:
                report.exercises.append(exercise)
                owned_checks.add(exercise.check_cell)
        elif EXERCISE in tags(cell):
            following = _next_code(cells, index, +1)
            if following is None or SOLUTION not in tags(cells[following]):
                report.errors.append(
                    f"cell {index}: the exercise stub is not followed by a code cell tagged 'solution'"
                )
    for index, cell in enumerate(cells):
        if CHECK in tags(cell) and cell.get("cell_type") == "code" and index not in owned_checks:
            report.errors.append(f"cell {index}: a check cell that follows no exercise stub and solution")

    answers = [i for i, c in enumerate(cells) if ANSWER in tags(c)]
    report.questions = len(answers)
    for index in answers:
        before = cells[index - 1] if index > 0 else None
        if before is None or before.get("cell_type") != "markdown" or tags(before):
            report.errors.append(f"cell {index}: an answer must follow its question, an untagged markdown cell")
    for index in sorted(_in_exercises_section(cells)):
        cell = cells[index]
        if cell.get("cell_type") == "markdown" and ANSWER not in tags(cell) and _ANSWER_DROPDOWN.search(source(cell)):
            report.errors.append(
                f"cell {index}: an answer dropdown in an untagged cell would reach students; "
                "move it into its own markdown cell tagged 'answer'"
            )
    _check_student_copy_runs(cells, trees, report)
    return report


def _exercise_at(
    cells: list[dict[str, Any]], trees: dict[int, ast.Module], index: int, report: NotebookReport
) -> Exercise | None:
    """The exercise whose solution is cell ``index``, or ``None`` (with the errors recorded)."""
    stub_index, check_index = _next_code(cells, index, -1), _next_code(cells, index, +1)
    if stub_index is None or EXERCISE not in tags(cells[stub_index]):
        report.errors.append(f"cell {index}: a solution that does not follow a code cell tagged 'exercise' (the stub)")
        return None
    if stub_index not in trees:
        return None  # already reported as not valid Python
    stub_names, solution_names = functions(trees[stub_index]), functions(trees[index])
    if not stub_names:
        report.errors.append(f"cell {stub_index}: the exercise stub defines no function")
        return None
    if check_index is None or CHECK not in tags(cells[check_index]) or check_index not in trees:
        report.errors.append(f"cell {index}: the solution is not followed by a code cell tagged 'check'")
        return None
    found = check_call(trees[check_index])
    if found is None:
        report.errors.append(f"cell {check_index}: the check cell calls no vitlab.checks function")
        return None
    check, argument = found
    function = argument if argument in stub_names else stub_names[-1]
    if argument != function:
        report.errors.append(
            f"cell {check_index}: the check is given {argument!r}, expected the stub's function {function!r}"
        )
    if function not in solution_names:
        report.errors.append(
            f"cell {index}: the solution defines {solution_names or 'no function'}, "
            f"expected the stub's function {function!r}"
        )
    if not _raises_not_implemented(trees[stub_index], function):
        report.errors.append(
            f"cell {stub_index}: the stub of {function!r} must raise NotImplementedError "
            "(so that its check prints TODO, not FAIL)"
        )
    _check_the_check(cells[check_index], check_index, check, report)
    try:
        worth = points(cells[check_index])
    except AssignmentError as exc:
        report.errors.append(f"cell {check_index}: {exc}")
        worth = DEFAULT_POINTS
    return Exercise(function, check, stub_index, index, check_index, worth)


def _check_the_check(cell: dict[str, Any], index: int, check: str, report: NotebookReport) -> None:
    import vitlab.checks

    if check not in vitlab.checks.__all__ or check == "CheckResult":
        report.errors.append(f"cell {index}: vitlab.checks has no check named {check!r}")
    if len(re.findall(r"\bchecks\.\w+\s*\(", source(cell))) > 1:
        report.errors.append(f"cell {index}: a check cell runs exactly one check")
    # A check's result displays nothing (CheckResult._ipython_display_), so both
    # `vitlab.checks.x(fn);` and `result = vitlab.checks.x(fn)` show only the check's line.
    printed = "".join(  # printed, or shown as display data by a grader's kernel (text/plain)
        "".join(o.get("text", "") if o.get("output_type") == "stream" else o.get("data", {}).get("text/plain", ""))
        for o in cell.get("outputs", [])
    )
    if cell.get("outputs") and not re.search(rf"^PASS {re.escape(check)}\b", printed, re.MULTILINE):
        report.errors.append(
            f"cell {index}: the stored output of the check is not a PASS line (is the solution right?): "
            f"{printed.strip()[:120]!r}"
        )


def _check_student_copy_runs(cells: list[dict[str, Any]], trees: dict[int, ast.Module], report: NotebookReport) -> None:
    """No cell of the student copy may use a stub (outside its check) or a name only a solution defines."""
    bound_before: set[str] = set()  # names cells that stay in the student copy have bound so far
    for index in sorted(trees):
        cell = cells[index]
        if SOLUTION not in tags(cell):
            bound_before |= {name for statement in trees[index].body for name in _bound(statement)}
            continue
        stub = _next_code(cells, index, -1)
        own_check = _next_code(cells, index, +1)
        stub_functions = set(functions(trees[stub])) if stub in trees and EXERCISE in tags(cells[stub]) else set()
        solution_only = {n for s in trees[index].body for n in _bound(s)} - bound_before - stub_functions
        watched = stub_functions | solution_only
        for later in sorted(i for i in trees if i > index and i != own_check and SOLUTION not in tags(cells[i])):
            if later in trees and EXERCISE in tags(cells[later]):
                continue  # a stub only defines a function that raises; its body calls nothing yet
            for name, line in sorted(_first_uses(trees[later], watched).items()):
                why = (
                    "the student's stub raises NotImplementedError"
                    if name in stub_functions
                    else ("only the solution defines it, and the student copy has no solution")
                )
                report.errors.append(f"cell {later}, line {line}: uses {name!r}, but {why}")
            watched -= {n for s in trees[later].body for n in _bound(s)}


def find_notebooks(sources: Iterable[str | Path]) -> Iterator[tuple[Path, Path]]:
    """``(notebook, path relative to what was given)`` for every notebook in files and folders."""
    for given in map(Path, sources):
        if given.is_dir() and not (given.suffix == ".ipynb" and given.is_symlink()):
            for path in sorted(given.rglob("*.ipynb")):  # links to folders are not followed
                if ".ipynb_checkpoints" not in path.parts:
                    yield path, path.relative_to(given)
        elif given.suffix == ".ipynb" and os.path.lexists(given):
            # a link or special file is the grader's to refuse (grade.read_submission), for that file only
            yield given, Path(given.name)
        else:
            raise AssignmentError(f"{given}: not a notebook (.ipynb) or a folder")
