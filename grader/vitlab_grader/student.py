"""Student copies of instructor notebooks: no solutions, no answers, no outputs, no stray metadata.

Kept: every other cell, with its source; the tags ``exercise`` and ``check`` (the grader
finds checks by them) and ``raises-exception``; a check cell's points
(``metadata.vitlab.points``, written as such even when the instructor used nbgrader's
key); markdown attachments that the cell's text uses. Dropped: cells tagged ``solution``
or ``answer``, all outputs and execution counts, every other cell metadata
(``execution``, ``collapsed``, ``scrolled``, ``jupyter``, display tags such as
``hide-input``) and all notebook metadata except ``kernelspec`` and ``language_info``.
:func:`make_student` stamps each copy with its name in the release
(``metadata.vitlab.release``, e.g. ``"09_pit"``), which the grader uses to match a
submission whose file name does not say which notebook it is, and with the vitlab version
it was made with (``metadata.vitlab.vitlab``); the Colab setup cell's
``vitlab @ git+https://...@main`` and the data it downloads are pinned to that version's tag
(``@v0.1.0``, or another ref), so the checks a student runs are the ones the release was
made with.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitlab_grader.exercises import (
    ANSWER,
    CHECK,
    DEFAULT_POINTS,
    EXERCISE,
    SOLUTION,
    AssignmentError,
    Exercise,
    find_notebooks,
    inspect_notebook,
    points,
    source,
    tags,
)
from vitlab_grader.release import STAMP, VERSION_STAMP, shipped

KEEP_TAGS = (EXERCISE, CHECK, "raises-exception")
KEEP_NOTEBOOK_METADATA = ("kernelspec", "language_info")
_VITLAB_INSTALL = re.compile(r"(vitlab(?:\[[\w,]*\])? @ git\+[^@\s\"']+)@[^\s\"']+")  # pip's "vitlab @ git+URL@ref"
_RAW_FILES = re.compile(r"(https://raw\.githubusercontent\.com/[^/\s\"']+/[^/\s\"']+)/[^/\s\"']+")  # .../owner/repo/ref


def pin_setup(text: str, ref: str) -> str:
    """``text`` with every ``vitlab @ git+URL@ref`` pip requirement, and the repository's raw
    files it downloads (``data/``), pinned to ``ref``: the data of the vitlab it installs."""
    text = _VITLAB_INSTALL.sub(lambda m: f"{m.group(1)}@{ref}", text)
    return _RAW_FILES.sub(lambda m: f"{m.group(1)}/{ref}", text)


@dataclass(frozen=True)
class StudentCopy:
    """One student notebook written by :func:`make_student`."""

    source: Path
    target: Path
    exercises: list[Exercise]
    solutions_removed: int
    answers_removed: int


def _scrub(cell: dict[str, Any]) -> dict[str, Any]:
    """A fresh copy of a cell that keeps only what a student needs."""
    text = source(cell)
    clean: dict[str, Any] = {"cell_type": cell["cell_type"]}
    metadata: dict[str, Any] = {}
    if "id" in cell:
        clean["id"] = cell["id"]
    kept = [t for t in tags(cell) if t in KEEP_TAGS]
    if kept:
        metadata["tags"] = kept
    if CHECK in kept and cell.get("cell_type") == "code" and points(cell) != DEFAULT_POINTS:
        metadata["vitlab"] = {"points": points(cell)}
    clean["metadata"] = metadata
    clean["source"] = text
    if cell["cell_type"] == "code":
        clean["execution_count"] = None
        clean["outputs"] = []
    elif "attachments" in cell:
        used = {name: copy.deepcopy(data) for name, data in cell["attachments"].items() if f"attachment:{name}" in text}
        if used:
            clean["attachments"] = used
    return clean


def student_notebook(notebook: dict[str, Any]) -> dict[str, Any]:
    """The student copy of an instructor notebook (a new dict; the argument is not changed).

    Raises:
        AssignmentError: the notebook breaks the exercise format (every problem is listed).
    """
    report = inspect_notebook(notebook)
    if report.errors:
        raise AssignmentError("\n".join(report.errors))
    metadata = notebook.get("metadata", {})
    return {
        "cells": [_scrub(c) for c in notebook["cells"] if not {SOLUTION, ANSWER} & set(tags(c))],
        "metadata": {k: copy.deepcopy(metadata[k]) for k in KEEP_NOTEBOOK_METADATA if k in metadata},
        "nbformat": notebook["nbformat"],
        "nbformat_minor": notebook["nbformat_minor"],
    }


def _leaks(instructor: dict[str, Any], written: str) -> list[str]:
    """Solution and answer sources found in the written file (none, unless this module has a bug)."""
    text = "\n".join(source(c) for c in json.loads(written)["cells"])
    hidden = [source(c).strip() for c in instructor["cells"] if {SOLUTION, ANSWER} & set(tags(c))]
    return [h[:60] for h in hidden if h and h in text]


def make_student(sources: list[str | Path], out: str | Path, *, vitlab_ref: str | None = None) -> list[StudentCopy]:
    """Write the student copy of every notebook in ``sources`` (files or folders) under ``out``.

    A folder's notebooks keep their paths relative to it, and the files it ships
    (:func:`vitlab_grader.release.shipped`: its data, such as ``data/``) are copied along.
    Nothing is written unless every notebook is valid; a source is never overwritten. The setup cell installs vitlab at
    ``vitlab_ref`` (default: the tag of the running vitlab's version, ``v0.1.0``).

    Raises:
        AssignmentError: a notebook breaks the format, or a target would overwrite a source.
    """
    import nbformat

    import vitlab

    out = Path(out)
    ref = vitlab_ref or f"v{vitlab.__version__}"
    found = list(find_notebooks(sources))
    if not found:
        raise AssignmentError(f"no notebooks in {', '.join(map(str, sources))}")
    plans, problems, targets = [], [], {}
    for path, relative in found:
        instructor = nbformat.read(path, as_version=4)
        target = out / relative
        if target.resolve() == path.resolve():
            problems.append(f"{path}: the student copy would overwrite it; choose another --out")
        elif target.resolve() in targets:
            problems.append(f"{path}: same target {target} as {targets[target.resolve()]}")
        targets[target.resolve()] = path
        try:
            student = student_notebook(instructor)
            student["metadata"]["vitlab"] = {
                STAMP: relative.with_suffix("").as_posix(),
                VERSION_STAMP: vitlab.__version__,
            }
            for cell in student["cells"]:
                cell["source"] = pin_setup(cell["source"], ref) if cell["cell_type"] == "code" else cell["source"]
            plans.append((path, target, instructor, student))
        except AssignmentError as exc:
            problems.extend(f"{path}: {line}" for line in str(exc).splitlines())
    if problems:
        raise AssignmentError("\n".join(problems))

    written = []
    for path, target, instructor, student in plans:
        node = nbformat.from_dict(student)
        nbformat.validate(node)
        text = nbformat.writes(node)
        leaked = _leaks(instructor, text)
        if leaked:  # a bug here, never the author's: refuse to write it
            raise AssignmentError(f"{path}: hidden cells would leak into the student copy: {leaked}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        exercises = inspect_notebook(instructor).exercises
        count = {tag: sum(tag in tags(c) for c in instructor["cells"]) for tag in (SOLUTION, ANSWER)}
        written.append(StudentCopy(path, target, exercises, count[SOLUTION], count[ANSWER]))
    for folder in (Path(given) for given in sources if Path(given).is_dir()):
        for path in shipped(folder):
            target = out / path.relative_to(folder)
            if target.resolve() != path.resolve():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
    return written
