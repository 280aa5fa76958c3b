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
4. **Hidden cases** (with the release's secret, :func:`vitlab_grader.release.hidden_spec`):
   the grader's cell runs the student's function on each check's public cases, then on
   its hidden ones. The score counts both; the message says how many hidden cases failed,
   never which, and an answer that passes every public case but not the hidden ones is
   reported (a table of the public outputs scores the public cases only).
5. **Copied references flagged.** An answer that is, or names, a vitlab object the
   exercise asks the student to write, or anything of ``vitlab.checks``, keeps its score
   and is flagged by name; in the kernel the checks' own functions are tripwires that
   compute nothing and report the call (:mod:`vitlab_grader.anomalies`).

The notebook runs up to its last check: later cells cannot change a score, and are not
run. Each notebook has a time limit (kernel start-up not counted) and, optionally, one per
cell. Cells that raise do not stop it, so later checks still run. A cell past the per-cell
limit is interrupted; if the kernel does not answer within a few seconds it is restarted
and every earlier cell that ran (the checks and the timed-out cell excepted) runs again.

Status of an exercise: ``PASS``, ``FAIL``, ``TODO`` (the check's verdict), ``ERROR`` (not
graded: the kernel died, the answers were unreadable, the grader failed) or ``TIMEOUT``.
Score: ``points * fraction`` (the share of the check's cases that passed; 0 for
``TIMEOUT``), or with ``all_or_nothing`` the points for a ``PASS`` only. An ``ERROR`` has
no score (``None``, never 0): the gradebook leaves it empty and ``--only-failed``
grades it again.

What the grader reads is bounded (the trust boundary): a submission is read only if it is
a regular file inside the submissions' folder (never through a symbolic link), at most
:data:`SUBMISSION_LIMIT` bytes, and it must parse as a notebook (what nbformat's schema
does not allow is reported, and fields of the wrong type are dropped). Of the kernel's
outputs only errors are kept (their text cut); an answers file is read right after its
check cell ran (a later rewrite is reported, never used), only if it is a regular file
within :data:`ANSWERS_LIMIT` bytes, stored uncompressed. Each submission is parsed,
scanned and graded inside its own error boundary. With ``jobs > 1`` a notebook that timed
out is graded again alone, and only that result counts.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
import math
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any

from vitlab_grader import anomalies as scan
from vitlab_grader.exercises import DEFAULT_POINTS, parse, source
from vitlab_grader.release import (
    Release,
    ReleaseCheck,
    hidden_spec,
    match_release,
    plan,
    read_release,
)

STATUSES = ("PASS", "FAIL", "TODO", "ERROR", "TIMEOUT")
ANSWERS_LIMIT = 64 * 2**20  # bytes: the largest answers file the grader reads back from a kernel
SUBMISSION_LIMIT = 32 * 2**20  # bytes: the largest submission the grader reads
OUTPUT_LIMIT = 16 * 2**20  # bytes of outputs (prints, displays) past which a notebook's report says so
SCAN_LIMIT = 2**20  # characters of student code the static scan reads
ERROR_TEXT_LIMIT = 2000  # characters kept of an error's message
MAX_RESTARTS = 8  # kernel restarts (deaths, stubborn cells) before a notebook's run stops
_WORK = ".vitlab-grader"  # the folder, inside the submission's, for the cases and answers files
_DATA_STATUS = {"passed": "PASS", "failed": "FAIL", "not implemented": "TODO"}
_PROBE_SECONDS = 10  # how long an interrupted kernel may take to answer again
_TIMEOUT_ENAME = "CellTimeoutError"  # the reply nbclient makes up for a cell past its limit (never read back)
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
    fraction: float | None = 0.0  # share of the check's cases that passed; None: not graded (ERROR)
    score: float | None = 0.0  # points * fraction, or all or nothing; None: not graded (ERROR), never 0
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
    cpu_share: str = ""  # "cgroup v1", "cgroup v2", or "none: " and why (isolation.cpu_cgroups)

    @property
    def passed(self) -> int:
        return sum(r.status == "PASS" for r in self.exercises)

    @property
    def total(self) -> int:
        return len(self.exercises)

    @property
    def score(self) -> float:
        """The points of the graded exercises (an ungraded one adds nothing: see :attr:`graded`)."""
        return round(sum(r.score for r in self.exercises if r.score is not None), 4)

    @property
    def graded(self) -> bool:
        """Whether every exercise has a score: ``False`` for a notebook or exercise in ``ERROR``."""
        if not self.exercises:
            return not self.error
        return all(r.score is not None for r in self.exercises)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NotebookResult:
        """A result as :func:`write_json` wrote it (for ``--resume``)."""
        names = {f.name for f in fields(cls)} - {"exercises"}
        result = cls(**{k: v for k, v in data.items() if k in names})
        exercise_names = {f.name for f in fields(ExerciseResult)}
        rows = [ExerciseResult(**{k: v for k, v in row.items() if k in exercise_names}) for row in data["exercises"]]
        result.exercises = [row for row in rows if row.exercise]  # the row saying why there are none is rows()'
        return result

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
        if self.error:
            return [ExerciseResult(self.notebook, "", "", "ERROR", self.error, 0.0, None, None, self.student)]
        message = "the release notebook has no check cells"
        return [ExerciseResult(self.notebook, "", "", "TODO", message, 0.0, 0.0, 0.0, self.student)]


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
    """What :func:`_execute` saw: cells that finished, past their limit or where the kernel died; why it stopped."""

    finished: set[int] = field(default_factory=set)
    timed_out: dict[int, str] = field(default_factory=dict)
    died: dict[int, str] = field(default_factory=dict)
    stopped: tuple[str, str] | None = None
    restarts: int = 0
    output_bytes: int = 0  # outputs the kernel sent that the grader did not keep


def _output_size(content: dict[str, Any]) -> int:
    text = content.get("text")
    if isinstance(text, str):
        return len(text)
    data = content.get("data")
    return sum(len(v) for v in data.values() if isinstance(v, str)) if isinstance(data, dict) else 0


@functools.cache
def _client_class() -> type:
    """nbclient's ``NotebookClient``, keeping only error outputs (cut) and recording timeouts by itself.

    A cell is past its limit when nbclient's own timeout handler runs for it (no reply in
    time), never because of an error's name: a student's exception named like nbclient's
    is an error like any other.
    """
    import nbformat
    from nbclient import NotebookClient

    class Client(NotebookClient):  # type: ignore[misc]
        index = -1  # the cell being run
        timed_out: list[int]
        output_bytes = 0

        def output(self, outs: list[Any], msg: dict[str, Any], display_id: str | None, cell_index: int) -> Any:
            content = msg.get("content") or {}
            if msg.get("msg_type") != "error":  # prints, displays, results: never read by the grader
                self.output_bytes += _output_size(content)
                return None
            ename, evalue = str(content.get("ename", "Error"))[:200], str(content.get("evalue", ""))
            if len(evalue) > ERROR_TEXT_LIMIT:
                evalue = evalue[:ERROR_TEXT_LIMIT] + f"... ({len(evalue)} characters, cut)"
            out = nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[])
            outs.append(out)
            return out

        async def _async_handle_timeout(self, timeout: int, cell: Any = None) -> Any:
            self.timed_out.append(self.index)
            return await super()._async_handle_timeout(timeout, cell)

    return Client


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


def _restart_and_replay(client: Any, notebook: Any, run: _Run, skip: set[int], deadline: float) -> bool:
    """Restart the kernel and run again, silently, every finished cell not in ``skip``; whether it worked."""
    from nbclient.exceptions import DeadKernelError
    from nbclient.util import run_sync

    if run.restarts >= MAX_RESTARTS:
        return False
    run_sync(client.km.restart_kernel)(now=True)
    run_sync(client.kc.wait_for_ready)(timeout=60)
    run.restarts += 1
    for index in sorted(run.finished - skip):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        client.timeout = max(1, math.ceil(left))
        client.timed_out.clear()
        client.index = index
        try:  # a copy: the cell keeps the outputs of its first run
            client.execute_cell(copy.deepcopy(notebook.cells[index]), index, store_history=False)
        except DeadKernelError:
            return False
        if client.timed_out:
            return False
    return True


def _execute(
    notebook: Any,
    km: Any,
    timeout: float,
    cell_timeout: float | None,
    skip: set[int],
    describe: Any,
    after: Any = None,
) -> _Run:
    """Run the code cells in order in ``km``'s kernel under the notebook's and each cell's time limits.

    ``skip``: the grader's cells, which a restart does not run again; ``describe(index)``
    names a cell in messages; ``after(index)`` is called right after each cell of ``skip``
    ran, before any other cell. The run ends with the last of ``skip``: no later cell can
    change a score, and a chapter's last cells (an appendix, a larger model) cost time and
    memory. A cell past its limit is interrupted; a kernel that does not answer then, or
    that died, is restarted and the finished cells run again (at most
    :data:`MAX_RESTARTS` times). The kernel is shut down on return.
    """
    from nbclient.exceptions import DeadKernelError

    client = _client_class()(
        notebook, km=km, kernel_name="python3", allow_errors=True, shutdown_kernel="immediate",
        interrupt_on_timeout=True,  # interrupt the cell, as the stop button does, and go on
        error_on_timeout={"ename": _TIMEOUT_ENAME, "evalue": "", "traceback": []}, log=_QUIET,
    )  # fmt: skip
    client.timed_out = []
    run = _Run()
    client.reset_execution_trackers()
    try:
        # the kernel process's own log (not the notebook's output) would clutter the table;
        # the folder and the environment are the manager's
        with client.setup_kernel(stderr=subprocess.DEVNULL, cleanup_kc=True):
            start = time.monotonic()
            deadline = start + timeout
            last = max(skip, default=len(notebook.cells) - 1)
            for index, cell in enumerate(notebook.cells[: last + 1]):
                if cell.cell_type != "code":
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    run.stopped = ("TIMEOUT", f"ran past the {timeout:g} s limit before {describe(index)}")
                    return run
                limit = cell_timeout if cell_timeout is not None and cell_timeout < left else None
                client.timeout = max(1, math.ceil(limit if limit is not None else left))
                client.timed_out.clear()
                client.index = index
                try:
                    client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
                except DeadKernelError:
                    run.died[index] = f"the kernel died in {describe(index)}"
                else:
                    if index in skip and after is not None:
                        after(index)
                    if index not in client.timed_out:
                        run.finished.add(index)
                        continue
                    if limit is None:
                        run.stopped = ("TIMEOUT", f"ran past the {timeout:g} s limit in {describe(index)}")
                        return run
                    run.timed_out[index] = f"ran past the {limit:g} s cell limit in {describe(index)}"
                    probe = min(_PROBE_SECONDS, deadline - time.monotonic())
                    if probe > 0 and _kernel_answers(client, probe):
                        continue
                # the kernel died, or does not answer: a new one, and the finished cells again
                if not _restart_and_replay(client, notebook, run, skip | set(run.timed_out) | set(run.died), deadline):
                    if time.monotonic() >= deadline:
                        why = f"ran past the {timeout:g} s limit after {describe(index)}"
                        if index in run.died:  # the time went to a new kernel and the finished cells again
                            why += f" ({run.died[index]}; running the finished cells again took the time left)"
                        run.stopped = ("TIMEOUT", why)
                    elif index in run.died and run.restarts >= MAX_RESTARTS:
                        run.stopped = ("ERROR", f"the kernel died in {describe(index)}, "
                                                f"after {run.restarts} restarts")  # fmt: skip
                    else:
                        run.stopped = ("ERROR", f"the kernel was restarted after {describe(index)}, "
                                                "and an earlier cell did not run again")  # fmt: skip
                    return run
    except Exception as exc:  # noqa: BLE001 - a kernel that cannot start must not stop the other notebooks
        run.stopped = ("ERROR", f"could not run the notebook: {type(exc).__name__}: {_first_line(str(exc))}")
    finally:
        run.output_bytes = client.output_bytes
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
    limits: Any = None  # vitlab_grader.isolation.Limits; None: its defaults
    run_dir: Path | None = None  # the run's own temporary folder
    secret: bytes | None = None  # the release's secret: hidden cases (None: public cases only)
    threads: int | None = None  # each kernel's OMP_NUM_THREADS (None: the grader's own, or the default)


def _threads(jobs: int) -> int | None:
    """Each kernel's OpenMP threads when ``jobs`` kernels share the cores: its share of them
    (a waiting OpenMP thread spins, so more threads than cores cost CPU for nothing); ``None``
    (the library's default) for one job at a time, or where the instructor set OMP_NUM_THREADS."""
    if jobs <= 1 or "OMP_NUM_THREADS" in os.environ:
        return None
    return max(1, (os.cpu_count() or 1) // jobs)


def _score(status: str, worth: float, fraction: float | None, all_or_nothing: bool) -> float | None:
    """An exercise's score; ``None`` for an ``ERROR`` (not graded, never a 0)."""
    if status == "ERROR" or fraction is None:
        return None
    if all_or_nothing:
        return worth if status == "PASS" else 0.0
    return round(worth * (fraction if status in ("PASS", "FAIL", "TODO") else 0.0), 4)


class _Refused(Exception):
    """A file the grader does not read; the message names no host path and no content."""


def _read_regular(path: Path, limit: int, what: str) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes, never through a symbolic link.

    The last part of the path is opened with ``O_NOFOLLOW`` and checked with ``fstat`` on the
    open file (no race between the check and the read); a FIFO or device never blocks.

    Raises:
        _Refused: a symbolic link, not a regular file, too large, or unreadable.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # ELOOP for a link, whatever it points to (or not): one message for all
        raise _Refused(f"{what} is a symbolic link, not a regular file, or cannot be read: not read") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _Refused(f"{what} is a symbolic link, not a regular file, or cannot be read: not read")
        if info.st_size > limit:
            raise _Refused(f"{what} takes {info.st_size} bytes, more than the {limit} the grader reads")
        chunks, size = [], 0
        while chunk := os.read(fd, min(2**20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise _Refused(f"{what} takes more than the {limit} bytes the grader reads")
        return b"".join(chunks)
    except OSError:
        raise _Refused(f"{what} is a symbolic link, not a regular file, or cannot be read: not read") from None
    finally:
        os.close(fd)


def _inside(path: Path, root: Path) -> bool:
    """Whether ``path``'s folder is ``root`` or below it, no folder of the way being a symbolic link."""
    folder = Path(os.path.abspath(path)).parent
    base = Path(os.path.abspath(root))
    try:
        relative = folder.relative_to(base)
    except ValueError:
        return False
    return Path(os.path.realpath(folder)) == Path(os.path.realpath(base)) / relative


def read_submission(path: Path, root: Path) -> bytes:
    """A submission's bytes: a regular file inside ``root``, read with :data:`SUBMISSION_LIMIT`.

    Raises:
        _Refused: why it was not read (the same words for a link to an existing or a missing file).
    """
    if not _inside(path, root):
        raise _Refused("the submission is not inside the submissions' folder (a symbolic link on the way?): not read")
    return _read_regular(path, SUBMISSION_LIMIT, "the submission")


def parse_notebook(data: bytes) -> tuple[Any, list[str]]:
    """``(notebook, anomalies)``: the submission as an nbformat 4 notebook, outputs dropped, fields checked.

    What nbformat's schema does not allow is reported; a field of the wrong type that the
    grader reads (metadata that is not a dict, a source that is not text) is dropped and
    reported. Messages never quote the file.

    Raises:
        _Refused: not UTF-8 JSON, or not a notebook.
    """
    import nbformat

    try:
        raw = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _Refused(f"cannot read the notebook: not UTF-8 text (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise _Refused(f"cannot read the notebook: not JSON (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise _Refused("cannot read the notebook: its JSON is nested too deeply") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
        raise _Refused("cannot read the notebook: not a notebook (no list of cells)")
    anomalies = []
    if not isinstance(raw.get("metadata"), dict):
        anomalies.append("the notebook's metadata is not a dict; not read")
        raw["metadata"] = {}
    cells = []
    for cell in raw["cells"]:
        if not isinstance(cell, dict):
            continue
        text = cell.get("source", "")
        if isinstance(text, list) and all(isinstance(line, str) for line in text):
            text = "".join(text)
        if not isinstance(text, str):
            anomalies.append("a cell's source is not text; read as empty")
            text = ""
        metadata = cell.get("metadata", {})
        if not isinstance(metadata, dict):
            anomalies.append("a cell's metadata is not a dict; not read")
            metadata = {}
        kind = cell.get("cell_type") if cell.get("cell_type") in ("code", "markdown", "raw") else "raw"
        fixed: dict[str, Any] = {"cell_type": kind, "source": text, "metadata": metadata}
        if isinstance(cell.get("id"), str):
            fixed["id"] = cell["id"]
        if kind == "code":
            fixed |= {"outputs": [], "execution_count": None}
        cells.append(fixed)
    if len(cells) != len(raw["cells"]):
        anomalies.append("the notebook has cells that are not JSON objects; left out")
    checked = {"nbformat": 4, "nbformat_minor": 5, "metadata": raw["metadata"], "cells": cells}
    try:
        nbformat.validate(raw, relax_add_props=True)
    except Exception as exc:  # noqa: BLE001 - jsonschema's ValidationError, or a version nbformat does not know
        message = getattr(exc, "message", "") or type(exc).__name__
        anomalies.append(f"the notebook does not follow nbformat's schema ({_first_line(str(message), 120)})")
    try:
        notebook = nbformat.from_dict(checked)
        notebook.metadata = nbformat.from_dict(raw["metadata"])
    except Exception as exc:  # noqa: BLE001
        raise _Refused(f"cannot read the notebook: {type(exc).__name__}") from None
    return notebook, list(dict.fromkeys(anomalies))


def _load_answers(data: bytes, cases: int) -> Any:
    """The student's answers in an answers file's bytes, or why they cannot be read (a string).

    The file must be a zip archive (``torch.save``'s format) whose members are stored, not
    compressed, so what ``torch.load`` makes of it is no larger than the file.
    """
    import io
    import zipfile

    import torch

    from vitlab_grader.harness import decode

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return "the answers cannot be read: not a file torch.save writes"
    if any(m.compress_type != zipfile.ZIP_STORED for m in members) or sum(m.file_size for m in members) > ANSWERS_LIMIT:
        return f"the answers cannot be read: compressed, or more than the {ANSWERS_LIMIT} bytes the grader reads"
    try:
        return decode(torch.load(io.BytesIO(data), weights_only=True, map_location="cpu"), cases)
    except Exception as exc:  # noqa: BLE001 - a file the student's code may have written: anything
        return f"the answers cannot be read: {type(exc).__name__}: {_first_line(str(exc))}"


def _read_answers(path: Path, cases: int) -> Any:
    """The student's answers a grader's cell saved, or why they cannot be read (a string)."""
    if not os.path.lexists(path):
        return "the grader's cell saved no answers"
    try:
        data = _read_regular(path, ANSWERS_LIMIT, "the answers file")
    except _Refused as exc:
        return str(exc)
    return _load_answers(data, cases)


def _verdict(
    spec: Any, answers: Any, run: _Run, index: int, cell: Any, describe: Any, hidden: Any = None
) -> tuple[str, str, float | None, str]:
    """``(status, message, fraction, function)`` of one exercise after the run."""
    from vitlab.checks._core import evaluate

    if index in run.timed_out:
        return "TIMEOUT", run.timed_out[index], 0.0, ""
    if index in run.died:
        return "ERROR", run.died[index], None, ""
    if index not in run.finished:
        assert run.stopped is not None, "every code cell runs unless the run stopped"
        status, why = run.stopped
        fraction = None if status == "ERROR" else 0.0
        return status, why if why.endswith(describe(index)) else f"not run: {why}", fraction, ""
    if isinstance(answers, str):
        raised = _error(cell)
        return "ERROR", answers + (f" (the grader's cell raised {raised})" if raised else ""), None, ""
    try:
        result = evaluate(spec, _part(answers, 0, len(spec.cases)))
        if hidden is not None:
            result = _with_hidden(result, evaluate(hidden, _part(answers, len(spec.cases), len(hidden.cases))))
    except Exception as exc:  # noqa: BLE001 - answers the comparison cannot take cost this exercise only
        return "ERROR", f"the answers cannot be compared: {type(exc).__name__}: {_first_line(str(exc))}", None, ""
    return _DATA_STATUS[result.status], result.message, result.fraction, answers.function


_HIDDEN_ONLY = "hidden cases do not"  # in the message of an answer that fails hidden cases only


def _part(answers: Any, start: int, count: int) -> Any:
    """The answers to cases ``start`` to ``start + count`` (the public or the hidden ones)."""
    from vitlab.checks._core import Answers

    graded = answers.gradient_case
    at = graded - start if graded is not None and start <= graded < start + count else None
    return Answers(answers.cases[start : start + count], answers.gradient if at is not None else None, at,
                   answers.function)  # fmt: skip


def _with_hidden(public: Any, hidden: Any) -> Any:
    """One result for the public and hidden cases: both counted; of the hidden ones, only how many failed."""
    failed = hidden.cases_total - hidden.cases_passed
    passed, total = public.cases_passed + hidden.cases_passed, public.cases_total + hidden.cases_total
    message, status = public.message, public.status
    if failed and public.passed:
        status = "failed"
        message = (f"FAIL {public.name}: the {public.cases_total} public cases match the reference, but "
                   f"{failed} of {hidden.cases_total} {_HIDDEN_ONLY} (hidden cases are not shown)")  # fmt: skip
    elif failed and public.status == "failed":
        message += f" ({failed} of {hidden.cases_total} hidden cases failed too)"
    elif public.passed:
        message += f" (and {hidden.cases_total} hidden cases)"
    return dataclasses.replace(public, status=status, message=message, cases_passed=passed, cases_total=total)


def _write_cases(folder: Path, checks: Sequence[tuple[int, str]], secret: bytes | None) -> None:
    """Each check's cases for the grader's cell (``checks``: number and name): public, then hidden ones."""
    import torch

    from vitlab_grader.specs import check_spec

    work = folder / _WORK
    work.mkdir()
    for number, check in checks:
        extra = hidden_spec(check, secret).cases if secret else ()
        torch.save([*check_spec(check).cases, *extra], work / f"{number}-cases.pt")


def _write_cases_lean(folder: Path, checks: Sequence[ReleaseCheck], secret: bytes | None) -> None:
    """:func:`_write_cases`, in a child process while this one has not imported PyTorch.

    Then the grader holds no PyTorch (about 200 MB) while the kernel runs, which keeps a
    Gradescope container's one submission within its memory: PyTorch is imported after
    the kernel ended, to compare. The cases are the same (the specs are seeded).
    """
    pairs = [(check.number, check.check) for check in checks]
    if "torch" in sys.modules:
        _write_cases(folder, pairs, secret)
        return
    order = json.dumps({"folder": str(folder), "checks": pairs, "secret": secret.hex() if secret else None})
    code = (
        "import json, sys; from pathlib import Path; from vitlab_grader.grade import _write_cases; "
        "o = json.load(sys.stdin); secret = o['secret'] and bytes.fromhex(o['secret']); "
        "_write_cases(Path(o['folder']), o['checks'], secret)"
    )
    # the secret goes through a pipe, never the command line
    done = subprocess.run([sys.executable, "-c", code], input=order, cwd=folder.parent, capture_output=True, text=True)
    if done.returncode:
        why = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit status {done.returncode}"
        raise RuntimeError(f"the cases could not be written: {_first_line(why)}")


def _grade_submission(
    path: Path, notebook: Any, anomalies: list[str], student: str, releases: list[Release], settings: _Settings
) -> NotebookResult:
    """Grade one submission (parsed before any kernel started) against its release notebook."""
    import nbformat

    from vitlab_grader.isolation import submission_folder

    result = NotebookResult(str(path), student=student, anomalies=list(anomalies))
    release, found = match_release(path, notebook, releases)
    result.anomalies += found
    if release is None:
        names = ", ".join(r.name for r in releases)
        result.status, result.error = "ERROR", f"matches no notebook of the release ({names}): rename it after one"
        return result
    result.release = release.name
    name = path.name if path.name not in release.files else f"submission-{path.name}"
    data = nbformat.writes(notebook).encode("utf-8")  # what was read, without outputs
    with submission_folder({**release.files, name: data}, parent=settings.run_dir) as folder:
        _run_in(folder, path, notebook, release, result, settings)
    return result


def _scan(result: NotebookResult, code: list[str], work: Any, default: Any) -> Any:
    """``work()``, the static scan of the student's code, inside its own boundary; ``default`` if it fails."""
    if sum(map(len, code)) > SCAN_LIMIT:
        note = f"the code is longer than the {SCAN_LIMIT} characters the static scan reads; not scanned"
    else:
        try:
            return work()
        except (Exception, RecursionError, MemoryError) as exc:  # noqa: BLE001 - the student's source: anything
            note = f"the static scan could not read the code ({type(exc).__name__}); not scanned"
    if note not in result.anomalies:
        result.anomalies.append(note)
    return default


def _run_in(
    folder: Path, path: Path, notebook: Any, release: Release, result: NotebookResult, settings: _Settings
) -> None:
    """Run a submission in its folder, then score every exercise of its release notebook into ``result``."""
    import nbformat

    from vitlab_grader.isolation import DEFAULT_LIMITS, end_processes, isolated_kernel_manager, scrubbed_env

    planned = plan(notebook, release, partial(_harness_source, folder))
    result.anomalies += planned.anomalies
    cells = notebook["cells"]
    secret = settings.secret
    code = [source(cells[n]) for kind, n in planned.origins if kind == "student"]
    # judged: the cells the student wrote or changed; the release's own only bind names
    written = scan.student_cells([cells[n] for kind, n in planned.origins if kind == "student"],
                                 release.notebook.get("cells", []))  # fmt: skip
    names = _scan(result, code, lambda: scan.names_of(code), scan.Names())
    for text in code:  # what the scan cannot parse: reported, the rest is scanned
        try:
            parse(text)
        except SyntaxError as exc:
            if str(exc.msg).startswith("too complex to parse"):
                note = f"the static scan could not read a cell: {exc.msg}"
                result.anomalies += [] if note in result.anomalies else [note]
    used = _scan(result, code, lambda: scan.from_checks(written, names), [])
    result.anomalies += [f"uses {name} (from vitlab.checks)" for name in used]
    found = _scan(result, code, lambda: scan.suspicious(written, names), [])
    result.anomalies += [f"the code {what}" for what in found]
    run_cells = [nbformat.v4.new_code_cell(text) for text in planned.sources]
    run_notebook = nbformat.v4.new_notebook(cells=run_cells, metadata=release.notebook.get("metadata", {}))
    describe = partial(_describe, planned.origins, release, cells)
    skip = {i for i, (kind, _) in enumerate(planned.origins) if kind == "check"}
    number_at = {i: number for i, (kind, number) in enumerate(planned.origins) if kind == "check"}
    work = folder / _WORK
    saved: dict[int, bytes | str] = {}  # the answers files, read right after their check cells
    tripped: list[str] = []  # the checks' references the kernel called (read with each answers file)

    def read_now(index: int) -> None:
        tripped.extend(scan.read_tripped(folder))
        answers = work / f"{number_at[index]}-answers.pt"
        if not os.path.lexists(answers):
            saved[index] = "the grader's cell saved no answers"
            return
        try:
            saved[index] = _read_regular(answers, ANSWERS_LIMIT, "the answers file")
        except _Refused as exc:
            saved[index] = str(exc)

    start = time.monotonic()
    _write_cases_lean(folder, release.checks, secret)
    limits = settings.limits if settings.limits is not None else DEFAULT_LIMITS
    km, isolation = isolated_kernel_manager(
        folder,
        scrubbed_env({"OMP_NUM_THREADS": str(settings.threads)} if settings.threads else None),
        sandbox=settings.sandbox,
        limits=limits,
        parent=settings.run_dir,
        startup=[scan.arm_line(str(folder))],
    )
    result.sandbox, result.isolation, result.cpu_share = isolation.sandbox, isolation.note, isolation.cpu_share
    try:
        run = _execute(run_notebook, km, settings.timeout, settings.cell_timeout, skip, describe, read_now)
    finally:
        end_processes(km)  # every process the kernel started is gone before anything is read
    result.seconds = round(time.monotonic() - start, 1)
    for name in dict.fromkeys([*tripped, *scan.read_tripped(folder)]):
        result.anomalies.append(f"the code called {name}, a check's own code (it computed nothing)")
    result.restarts = run.restarts
    if run.output_bytes > OUTPUT_LIMIT:
        result.anomalies.append(
            f"its outputs took {run.output_bytes} characters, more than {OUTPUT_LIMIT}; the grader kept none of them"
        )
    result.timed_out_cells = sorted(planned.origins[i][1] for i in run.timed_out if i not in skip)
    errors = {i: _error(run_notebook.cells[i]) for i in run.finished}
    problems = {i: f"{describe(i)}: {error}" for i, error in errors.items() if error}
    problems |= {i: f"{describe(i)}: {why.removesuffix(f' in {describe(i)}')}" for i, why in run.timed_out.items()}
    problems |= {i: why for i, why in run.died.items()}
    outside = sorted(i for i in problems if i not in skip)
    result.first_error = problems[outside[0]] if outside else ""
    if run.stopped is not None:
        result.status, result.error = run.stopped
    elif run.timed_out:
        result.status, result.error = "TIMEOUT", run.timed_out[min(run.timed_out)]
    elif result.first_error:
        result.status, result.error = "ERROR", result.first_error
    elif run.died:
        result.status, result.error = "ERROR", run.died[min(run.died)]
    from vitlab_grader.specs import check_spec  # PyTorch, now that the kernel has ended

    specs = {check.check: check_spec(check.check) for check in release.checks}
    hidden = {check.check: hidden_spec(check.check, secret) for check in release.checks} if secret else {}
    where = {number: i for i, number in number_at.items()}
    for check in release.checks:
        spec, secret_cases = specs[check.check], hidden.get(check.check)
        index = where[check.number]
        read = saved.get(index, "the grader's cell did not run")
        count = len(spec.cases) + (len(secret_cases.cases) if secret_cases else 0)
        found = read if isinstance(read, str) else _load_answers(read, count)
        later = _read_answers_bytes(work / f"{check.number}-answers.pt")
        if index in saved and later != read:
            result.anomalies.append(
                f"{check.check}: the answers file ({_WORK}/{check.number}-answers.pt) changed after its check ran; "
                "the grader used what the check saved"
            )
        status, message, fraction, function = _verdict(
            spec, found, run, index, run_notebook.cells[index], describe, secret_cases
        )
        if status == "FAIL" and _HIDDEN_ONLY in message:
            result.anomalies.append(
                f"{check.check}: every public case passes, but hidden cases fail: an answer fitted to the public "
                "cases (a table of their outputs?) or a slip they do not catch"
            )
        references = scan.reference_objects(spec.reference, check.check)
        flags = _scan(result, code, lambda: scan.copied(written, names, check.function, references), [])  # noqa: B023
        if function.startswith("vitlab."):
            flags.append(f"the answer is vitlab's own {function}")
        calls = () if isinstance(found, str) else found.calls
        flags += [f"the answer ran vitlab's own {name}" for name in scan.ran(calls, references) if name not in flags]
        if untraced := [call for call in calls if call.startswith("sys.")]:
            result.anomalies.append(
                f"{check.check}: the answer called {', '.join(untraced)}, which stops the grader's record of "
                "the vitlab functions it runs"
            )
        score = _score(status, check.points, fraction, settings.all_or_nothing)
        result.exercises.append(
            ExerciseResult(str(path), check.check, check.function, status, message, check.points, fraction, score,
                           result.student, "; ".join(dict.fromkeys(flags)))
        )  # fmt: skip


def _read_answers_bytes(path: Path) -> bytes | str:
    """What is in an answers file now (to see whether it changed after it was read)."""
    if not os.path.lexists(path):
        return "the grader's cell saved no answers"
    try:
        return _read_regular(path, ANSWERS_LIMIT, "the answers file")
    except _Refused as exc:
        return str(exc)


def grade_notebook(
    path: str | Path, release: Iterable[str | Path], timeout: float = 300, **settings: Any
) -> NotebookResult:
    """Grade one submission against the release: :func:`grade` for one path (same keyword arguments)."""
    (result,) = grade([path], release, timeout, **settings)
    return result


def _failed(path: Path, student: str, why: str) -> NotebookResult:
    return NotebookResult(str(path), status="ERROR", error=why, student=student)


def _retimed(result: NotebookResult) -> bool:
    """Whether a result timed out (the notebook or an exercise): graded again alone when jobs > 1."""
    return result.status == "TIMEOUT" or any(r.status == "TIMEOUT" for r in result.exercises)


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
    limits: Any = None,
    secret: bytes | None = None,
) -> Iterator[NotebookResult]:
    """Grade submissions against the release, one after the other (or ``jobs`` at a time).

    Every submission is read, parsed and checked before the first kernel starts (a kernel
    cannot change a classmate's file before it is graded). Results come in the order of
    ``paths``, except that with ``jobs > 1`` a notebook that timed out is graded again
    alone after the others (a classmate's busy kernel must not cost it its points), and
    comes then. Whatever a submission holds costs that submission only: a refused file, an
    id shared with another file, a notebook that cannot be read or a failure of the grader
    on it gives its result status ``ERROR`` and the reason, and the others are graded.

    Args:
        paths: the submitted notebooks.
        release: the release notebooks (the student copies), files or folders.
        timeout: seconds for a whole notebook.
        jobs: notebooks run at the same time.
        cell_timeout: seconds for one cell (``None``: only the notebook's limit).
        all_or_nothing: full points for a ``PASS`` and none otherwise, instead of partial credit.
        id_source, id_pattern, root: how the student ids are found
            (:func:`vitlab_grader.ids.student_ids`); ``root`` is also the submissions'
            folder: a file outside it, or reached through a symbolic link, is refused.
        sandbox: ``False`` runs the kernels without an OS sandbox (folder, environment and
            processes are still isolated).
        limits: each kernel's :class:`vitlab_grader.isolation.Limits` (default
            :data:`vitlab_grader.isolation.DEFAULT_LIMITS`).
        secret: the release's secret (:func:`vitlab_grader.release.read_secret`): every
            check also runs its hidden cases (``None``: the public cases only).

    Raises:
        AssignmentError: the release cannot be read.
    """
    from vitlab_grader.ids import checked_student_ids, common_root

    paths = [Path(p) for p in paths]
    releases = read_release(release)
    base = Path(root) if root is not None else common_root(paths)
    ids, problems = checked_student_ids(paths, root=base, source=id_source, pattern=id_pattern)
    parsed: list[tuple[Path, Any]] = []  # (path, (notebook, anomalies) or why it is not graded)
    for path in paths:
        if path in problems:
            parsed.append((path, problems[path]))
            continue
        try:
            parsed.append((path, parse_notebook(read_submission(path, base))))
        except _Refused as exc:
            parsed.append((path, str(exc)))
        except (Exception, RecursionError, MemoryError) as exc:  # noqa: BLE001 - costs this submission only
            parsed.append((path, f"the grader could not read it: {type(exc).__name__}"))
    run_dir = Path(tempfile.mkdtemp(prefix="vitlab-grade-"))  # the run's own: submissions' and kernels' folders
    settings = _Settings(timeout, cell_timeout, all_or_nothing, sandbox, limits, run_dir, secret, _threads(jobs))

    def one(item: tuple[Path, Any]) -> NotebookResult:
        path, read = item
        student = ids.get(path, "")
        if isinstance(read, str):
            return _failed(path, student, read)
        try:
            return _grade_submission(path, read[0], read[1], student, releases, settings)
        except (Exception, RecursionError, MemoryError) as exc:  # noqa: BLE001 - costs this submission only
            return _failed(path, student, f"the grader failed on it: {type(exc).__name__}: {_first_line(str(exc))}")

    try:
        if jobs <= 1 or len(parsed) <= 1:
            for item in parsed:
                yield one(item)
            return
        # Threads are enough: each notebook runs in its own kernel process, and nbclient gives
        # every thread its own event loop; the threads only wait on the kernels.
        again = []
        with ThreadPoolExecutor(jobs) as pool:
            for item, result in zip(parsed, pool.map(one, parsed)):
                if _retimed(result):
                    again.append(item)
                else:
                    yield result
        for item in again:  # alone: nothing else runs now
            result = one(item)
            note = "timed out beside other notebooks; graded again alone, and this run counts"
            result.anomalies.append(note)
            yield result
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def read_results(path: str | Path) -> list[NotebookResult]:
    """The results in a JSON file :func:`write_json` wrote (for ``--resume``)."""
    document = json.loads(Path(path).read_text(encoding="utf-8"))
    return [NotebookResult.from_dict(n) for n in document.get("notebooks", [])]
