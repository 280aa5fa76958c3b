"""The release (the student copies ``student`` wrote) and how a submission is graded against it.

A submission's own check cells are never trusted: :func:`plan` takes the submission's code
cells, drops every check cell it has (tagged ``check`` or calling ``vitlab.checks``) and
puts a grader's cell (:mod:`vitlab_grader.harness`) where each of the release's check
cells is. What differs from the release is an *anomaly*: a check cell edited, missing,
duplicated or added, its metadata changed (points, tags), a stamp that names another
notebook. Anomalies never change a score; the report lists them. What the student's own
code does is read in :mod:`vitlab_grader.anomalies`.

**Hidden cases.** A release may have a secret (:func:`read_secret`, written by
``student --secret FILE``) that the instructor keeps and students never get. Each check then
also has hidden cases (:func:`hidden_spec`): the check's own cases built again under
:func:`vitlab.checks._core.hidden_cases` with the key ``HMAC-SHA256(secret, check name)``:
the same kinds and sizes, other values. A table of the public cases' outputs fails them.
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import os
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitlab_grader.exercises import (
    CHECK,
    AssignmentError,
    check_call,
    find_notebooks,
    parse,
    points,
    source,
    tags,
)
from vitlab_grader.ids import undecorated

STAMP = "release"  # notebook metadata vitlab.release: the release notebook a student copy came from
VERSION_STAMP = "vitlab"  # notebook metadata vitlab.vitlab: the vitlab version the release pins
SECRET_BYTES = 32  # the hidden cases' secret: 32 random bytes, written as 64 hex digits
SHIPPED_LIMIT = 50 * 2**20  # bytes of other files a release folder may ship with its notebooks


@dataclass(frozen=True)
class ReleaseCheck:
    """One check cell of the release: what it checks, with which function, for how many points."""

    number: int  # its place among the release's check cells, from 0
    cell: int  # index of the cell in the release notebook
    cell_id: str | None
    check: str  # e.g. "t2t_token_count"
    function: str  # the student's function it is given, e.g. "token_count"
    points: float
    source: str
    metadata: dict[str, Any]


@dataclass(frozen=True)
class Release:
    """One release notebook: its name (path in the release without ``.ipynb``), cells and checks."""

    name: str
    path: Path
    notebook: dict[str, Any]
    checks: tuple[ReleaseCheck, ...]
    files: dict[str, bytes] = field(default_factory=dict)  # what the release ships next to the notebook


def _release_checks(notebook: dict[str, Any], path: Path) -> tuple[ReleaseCheck, ...]:
    found = []
    for index, cell in enumerate(notebook.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        try:
            call = check_call(parse(source(cell)))
        except SyntaxError as exc:
            if CHECK in tags(cell):
                raise AssignmentError(f"{path}: cell {index}: a check cell that is not valid Python") from exc
            continue
        if call is None and CHECK not in tags(cell):
            continue
        if call is None or not call[1]:
            raise AssignmentError(f"{path}: cell {index}: a check cell must call vitlab.checks.<check>(function)")
        found.append(
            ReleaseCheck(len(found), index, cell.get("id"), call[0], call[1], points(cell), source(cell),
                         dict(cell.get("metadata", {})))
        )  # fmt: skip
    return tuple(found)


def shipped(folder: Path) -> list[Path]:
    """The files a release folder ships with its notebooks: the others in it and below, not hidden."""
    found = []
    for path in sorted(folder.rglob("*")):
        hidden = any(part.startswith(".") or part == "__pycache__" for part in path.relative_to(folder).parts)
        if path.is_file() and path.suffix != ".ipynb" and not hidden:
            found.append(path)
    return found


def read_release(sources: Iterable[str | Path]) -> list[Release]:
    """Every release notebook in ``sources`` (files or folders), with its checks and shipped files.

    A notebook ships the other files of its folder and its subfolders (not notebooks, not
    hidden): the data a student copy reads (``data/explorer_vit.pt``). Each graded
    submission gets copies of them in its own folder, at the same paths.

    Raises:
        AssignmentError: no notebook, a check cell that calls no check, or too much to ship.
    """
    import nbformat

    releases = []
    for path, relative in find_notebooks(sources):
        notebook = nbformat.read(path, as_version=4)
        files, size = {}, 0
        for other in shipped(path.parent):
            size += other.stat().st_size
            if size > SHIPPED_LIMIT:
                raise AssignmentError(f"{path.parent}: the release ships more than {SHIPPED_LIMIT} bytes")
            files[other.relative_to(path.parent).as_posix()] = other.read_bytes()
        name = relative.with_suffix("").as_posix()
        releases.append(Release(name, path, dict(notebook), _release_checks(notebook, path), files))
    if not releases:
        raise AssignmentError(f"no notebooks in the release {', '.join(map(str, sources))}")
    return releases


def write_secret(path: str | Path) -> bool:
    """Write a new secret to ``path`` (readable by its owner only) unless it has one; whether it wrote one."""
    path = Path(path)
    if path.exists():
        read_secret(path)  # a file that is there must be a secret
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(secrets.token_hex(SECRET_BYTES) + "\n")
    return True


def read_secret(path: str | Path) -> bytes:
    """The secret in ``path`` (hex digits, at least 16 bytes' worth).

    Raises:
        AssignmentError: no such file, or not a secret.
    """
    try:
        secret = bytes.fromhex(Path(path).read_text(encoding="ascii").strip())
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise AssignmentError(f"{path}: not a secret for hidden cases ({type(exc).__name__})") from None
    if len(secret) < 16:
        raise AssignmentError(f"{path}: a secret for hidden cases has at least 32 hex digits")
    return secret


def hidden_spec(check: str, secret: bytes) -> Any:
    """The spec of ``check``'s hidden cases: its cases drawn with the key HMAC-SHA256(``secret``, ``check``)."""
    from vitlab.checks._core import hidden_cases
    from vitlab_grader.specs import check_spec

    with hidden_cases(hmac.new(secret, check.encode(), hashlib.sha256).digest()):
        return check_spec(check)


def match_release(path: Path, notebook: dict[str, Any], releases: list[Release]) -> tuple[Release | None, list[str]]:
    """The release notebook a submission answers, and the anomalies found on the way.

    The only one if the release has one notebook; else the one whose name ends the file's
    name (``s1234_09_pit.ipynb``, ``Copy of 09_pit (1).ipynb``), else the one the
    student copy's stamp names. The stamp is the student's to change, so a stamp that
    names another release notebook is an anomaly and never decides over the file name.
    """
    stamps = notebook.get("metadata", {}).get("vitlab")
    stamp = stamps.get(STAMP) if isinstance(stamps, dict) else None
    base = undecorated(path.name)  # the student ids' rules: "Copy of 09_pit (1)" is "09_pit"
    by_name = sorted(
        (r for r in releases if base == Path(r.name).name or base.endswith(("_" + Path(r.name).name, " " + r.name))),
        key=lambda r: len(r.name), reverse=True,
    )  # fmt: skip
    if len(releases) == 1:
        chosen: Release | None = releases[0]
    elif by_name:
        chosen = by_name[0]
    else:
        chosen = next((r for r in releases if r.name == stamp), None)
    anomalies = []
    if chosen is not None and stamp is not None and stamp != chosen.name:
        anomalies.append(f"the notebook's stamp names the release notebook {stamp!r}; graded as {chosen.name!r}")
    pinned, made = pinned_version(chosen.notebook) if chosen is not None else None, pinned_version(notebook)
    if pinned is not None and made is not None and made != pinned:  # no stamp (metadata lost): nothing to say
        anomalies.append(f"made against vitlab {made[:40]!r}, not the release's {pinned!r} (graded with the release's)")
    return chosen, anomalies


def pinned_version(notebook: dict[str, Any]) -> str | None:
    """The vitlab version a student copy was made for (its metadata ``vitlab.vitlab``), or ``None``."""
    stamps = notebook.get("metadata", {}).get("vitlab")
    version = stamps.get(VERSION_STAMP) if isinstance(stamps, dict) else None
    return version if isinstance(version, str) else None


# ---------------------------------------------------------------- the cells that run


@dataclass
class Plan:
    """The cells a graded run executes, where each came from, and the anomalies found.

    ``origins[i]`` is ``("student", index in the submission)`` or ``("check", release check number)``.
    """

    sources: list[str] = field(default_factory=list)
    origins: list[tuple[str, int]] = field(default_factory=list)
    anomalies: list[str] = field(default_factory=list)


def _is_check_cell(cell: dict[str, Any]) -> str | None:
    """The check a submission's code cell calls (``""`` if it is only tagged ``check``), or ``None``."""
    try:
        call = check_call(parse(source(cell)))
    except SyntaxError:
        call = None
    if call is not None:
        return call[0]
    return "" if CHECK in tags(cell) else None


def _binds(cell: dict[str, Any], name: str) -> bool:
    try:
        tree = parse(source(cell))
    except SyntaxError:
        return False
    for statement in tree.body:
        for node in ast.walk(statement):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                return True
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == name:
                return True
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if any((a.asname or a.name).split(".")[0] == name for a in node.names):
                    return True
    return False


def _metadata_changes(release: ReleaseCheck, cell: dict[str, Any]) -> list[str]:
    changes = []
    try:
        worth: float | str = points(cell)
    except AssignmentError as exc:
        worth = str(exc)
    if worth != release.points:
        shown = f"{worth:g}" if isinstance(worth, float) else worth
        changes.append(f"points {shown} instead of {release.points:g}")
    if sorted(tags(cell)) != sorted(release.metadata.get("tags", [])):
        changes.append(f"tags {tags(cell)} instead of {release.metadata.get('tags', [])}")
    return changes


def plan(notebook: dict[str, Any], release: Release, harness: Callable[[ReleaseCheck], str]) -> Plan:
    """The code cells to run for a submission: its own, its check cells replaced by ``harness(check)``.

    A release check cell is found in the submission by its cell id, else by its source;
    the grader's cell takes its place. A check cell the student deleted is put back after
    the last cell that defines its function (at the end if none does). Every other check
    cell of the submission is dropped.
    """
    cells = notebook.get("cells", [])
    code = [i for i, c in enumerate(cells) if c.get("cell_type") == "code"]
    checkish = {i: call for i in code if (call := _is_check_cell(cells[i])) is not None}
    at: dict[int, ReleaseCheck] = {}  # submission cell -> the release check that replaces it
    result = Plan()
    missing = []
    for check in release.checks:
        by_id = [i for i in code if check.cell_id is not None and cells[i].get("id") == check.cell_id]
        by_source = [i for i in code if source(cells[i]).strip() == check.source.strip()]
        found = [i for i in by_id + by_source if i not in at]
        if not found:
            missing.append(check)
            result.anomalies.append(f"{check.check}: the check cell was deleted; the release's check ran")
            continue
        index = found[0]
        at[index] = check
        if source(cells[index]).strip() != check.source.strip():
            result.anomalies.append(f"{check.check}: the check cell was edited; the release's check ran instead")
        changes = _metadata_changes(check, cells[index])
        if changes:
            result.anomalies.append(f"{check.check}: the check cell's metadata changed ({'; '.join(changes)}); "
                                    "the release's points count")  # fmt: skip
        for other in sorted(set(by_id + by_source) - {index}):
            if other not in at and other in checkish:
                result.anomalies.append(f"{check.check}: the check cell is duplicated (cell {other}); not run")
                checkish[other] = "duplicate"
    for index, call in sorted(checkish.items()):
        if index not in at and call != "duplicate":
            what = f"calls vitlab.checks.{call}" if call else "tagged 'check'"
            result.anomalies.append(f"an extra check cell (cell {index}, {what}) was not run; only the release's count")
    after: dict[int | None, list[ReleaseCheck]] = {}
    for check in missing:
        binding = [i for i in code if _binds(cells[i], check.function) and i not in checkish]
        after.setdefault(binding[-1] if binding else None, []).append(check)
    for index in code:
        if index in at:
            result.sources.append(harness(at[index]))
            result.origins.append(("check", at[index].number))
        elif index not in checkish:
            result.sources.append(source(cells[index]))
            result.origins.append(("student", index))
        for check in after.get(index, []):
            result.sources.append(harness(check))
            result.origins.append(("check", check.number))
    for check in after.get(None, []):
        result.sources.append(harness(check))
        result.origins.append(("check", check.number))
    return result
