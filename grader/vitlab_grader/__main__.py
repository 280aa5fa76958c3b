"""``python -m vitlab_grader {validate,student,grade,gradescope} ...``: the instructor's command line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vitlab_grader.exercises import (
    AssignmentError,
    find_notebooks,
    inspect_notebook,
)
from vitlab_grader.grade import NotebookResult, grade, read_results
from vitlab_grader.ids import SOURCES, StudentIdError, common_root
from vitlab_grader.isolation import DEFAULT_LIMITS, Limits
from vitlab_grader.report import (
    ANOMALIES,
    CSV_COLUMNS,
    summary,
    write_csv,
    write_feedback,
    write_gradebook,
    write_json,
)
from vitlab_grader.student import make_student

EXAMPLES = """examples:
  python -m vitlab_grader validate notebooks/
  python -m vitlab_grader student notebooks/ --out student/ --secret hidden.key
  python -m vitlab_grader grade submissions/*.ipynb --release student/ --secret hidden.key --out results.csv \
      --json results.json
  python -m vitlab_grader grade submissions/ --release student/ --out results.csv --gradebook gradebook.csv \
      --feedback feedback/ --cell-timeout 60 --timeout 300
  python -m vitlab_grader grade submissions/ --release student/ --out results.csv --json results.json --resume

More in the book's page "For instructors" (book/instructors.md)."""


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def validate(args: argparse.Namespace) -> int:
    import nbformat

    failed = 0
    for path, _ in find_notebooks(args.sources):
        report = inspect_notebook(nbformat.read(path, as_version=4))
        problems = list(report.errors)
        if args.strict:
            problems += report.warnings
            problems += [] if report.exercises else ["no exercises (how to tag them: book/instructors.md)"]
        found = f"{_plural(len(report.exercises), 'exercise')}, {_plural(report.questions, 'question')}"
        print(f"{path}: {found}" + (f", {_plural(len(problems), 'problem')}" if problems else ""))
        for ex in report.exercises:
            cells = f"cells {ex.stub_cell}, {ex.solution_cell}, {ex.check_cell}"
            worth = f"{ex.points:g} point{'' if ex.points == 1 else 's'}"
            print(f"  {ex.function} -> vitlab.checks.{ex.check}  ({cells}; {worth})")
        for line in problems:
            print(f"  error: {line}")
        for line in [] if args.strict else report.warnings:
            print(f"  warning: {line}")
        failed += bool(problems)
    if failed:
        print(f"{_plural(failed, 'notebook')} with problems")
    return 1 if failed else 0


def student(args: argparse.Namespace) -> int:
    from vitlab_grader.release import write_secret

    if args.secret and Path(args.secret).resolve().is_relative_to(Path(args.out).resolve()):
        raise AssignmentError(f"--secret {args.secret} is inside --out: students would get it; keep it elsewhere")
    try:
        copies = make_student(args.sources, args.out, vitlab_ref=args.vitlab_ref)
    except AssignmentError as exc:
        print(f"error: nothing written:\n{exc}", file=sys.stderr)
        return 1
    if args.secret:
        new = write_secret(args.secret)
        print(f"hidden cases: {'a new' if new else 'the'} secret in {args.secret}; keep it, give it to grade "
              "--secret and gradescope --secret, never to students")  # fmt: skip
    for copy in copies:
        print(
            f"{copy.source} -> {copy.target}: {_plural(len(copy.exercises), 'exercise')}, removed "
            f"{_plural(copy.solutions_removed, 'solution')} and {_plural(copy.answers_removed, 'answer')}"
        )
    return 0


def _replace(path: str | Path, write: Any) -> None:
    """``write(temporary path)``, then it takes ``path``'s place at once: a killed run keeps the last one written."""
    target = Path(path)
    temporary = target.with_name(f".{target.name}.partial")
    write(temporary)
    os.replace(temporary, target)


def _secret(args: argparse.Namespace) -> bytes | None:
    """The release's secret from ``--secret``, or ``None`` (and a warning: public cases only)."""
    from vitlab_grader.release import read_secret

    if args.secret:
        return read_secret(args.secret)
    print("warning: no --secret: the public cases only (a table of their outputs would score full marks)",
          file=sys.stderr)  # fmt: skip
    return None


def _check_version(release: Sequence[str | Path]) -> None:
    """Warn when the release pins another vitlab than the one grading (its checks may differ)."""
    import vitlab
    from vitlab_grader.release import pinned_version, read_release

    pinned = {v for r in read_release(release) if (v := pinned_version(r.notebook)) is not None}
    if pinned - {vitlab.__version__}:
        print(f"warning: the release was made with vitlab {', '.join(sorted(pinned))}; grading with "
              f"{vitlab.__version__}, whose checks may differ", file=sys.stderr)  # fmt: skip


def grade_command(args: argparse.Namespace) -> int:
    import re

    from tqdm import tqdm

    if args.id_pattern is not None:
        try:
            re.compile(args.id_pattern)
        except re.error as exc:
            raise AssignmentError(f"--id-pattern is not a regular expression: {exc}") from exc
    if args.cell_timeout is not None and args.cell_timeout <= 0:
        raise AssignmentError("--cell-timeout must be > 0 seconds")
    _check_lms(args)
    if (args.resume or args.only_failed) and not args.json:
        raise AssignmentError("--resume and --only-failed read the results of the run in --json: give --json")
    paths = [path for path, _ in find_notebooks(args.submissions)]
    for output in (args.out, args.json, args.gradebook):  # the folders, before hours of grading
        if output:
            Path(output).parent.mkdir(parents=True, exist_ok=True)
    settings = {"cell_timeout": args.cell_timeout, "all_or_nothing": args.all_or_nothing}
    ids = {"id_source": args.id_source, "id_pattern": args.id_pattern, "sandbox": not args.no_sandbox}
    secret = _secret(args)
    _check_version(args.release)
    limits = Limits(
        memory=int(args.memory_limit * 2**20) if args.memory_limit else None,
        processes=args.process_limit or None,
        nice=args.nice,
    )
    kept: dict[str, NotebookResult] = {}
    if args.resume or args.only_failed:
        if Path(args.json).is_file():
            kept = {r.notebook: r for r in read_results(args.json)}
        if args.only_failed:  # a result that is not fully graded (ERROR) is graded again
            kept = {name: r for name, r in kept.items() if r.graded}
    given = {str(p) for p in paths}
    results = [kept[str(p)] for p in paths if str(p) in kept]
    todo = [p for p in paths if str(p) not in kept]
    if kept:
        print(f"{_plural(len(results), 'notebook')} kept from {args.json}; {len(todo)} to grade", flush=True)
    record = {"release": [str(r) for r in args.release], "hidden_cases": secret is not None, **settings, **ids}

    def save() -> None:  # after each notebook: a killed run keeps what it graded
        _replace(args.out, lambda p: write_csv(results, p))
        if args.json:
            _replace(args.json, lambda p: write_json(results, p, args.timeout, **record))

    # the progress bar on stderr (not drawn when it is no terminal); the summaries above it
    progress = tqdm(total=len(todo), unit="notebook", desc="grading", disable=None, dynamic_ncols=True)
    try:
        root = common_root(paths) if paths else None
        for result in grade(todo, args.release, timeout=args.timeout, jobs=args.jobs, root=root, limits=limits,
                            secret=secret, **settings, **ids):  # fmt: skip
            progress.write(summary(result), file=sys.stdout)
            progress.update()
            results.append(result)
            save()
    except (StudentIdError, ValueError) as exc:
        raise AssignmentError(f"student ids: {exc}") from exc
    finally:
        progress.close()
    order = {str(p): i for i, p in enumerate(paths)}
    results.sort(key=lambda r: order.get(r.notebook, len(order)))
    results = [r for r in results if r.notebook in given]
    # every kernel is gone by now: only the grader writes the results
    save()
    written = [args.out]
    if args.json:
        written.append(args.json)
    if args.gradebook:
        _write_gradebook(args, results)
        written.append(args.gradebook)
    if args.feedback:
        files = _write_feedback(args, results)
        written.append(f"{_plural(len(files), 'feedback file')} in {args.feedback}")
    passed, total = sum(r.passed for r in results), sum(r.total for r in results)
    score, best = sum(r.score for r in results), sum(r.max_score for r in results)
    noted = sum(bool(r.anomalies or r.flags) for r in results)
    failed = sum(not r.graded for r in results)
    print(
        f"{_plural(len(results), 'notebook')} graded: {passed}/{total} exercises passed, "
        f"{score:g}/{best:g} points; {_plural(noted, 'notebook')} with anomalies or flags; "
        f"{_plural(failed, 'notebook')} not fully graded (ERROR: no score; --only-failed grades them again); "
        f"written: {', '.join(map(str, written))}"
    )
    sandboxes = sorted({r.sandbox for r in results if r.sandbox})
    if sandboxes:
        print(f"sandbox: {', '.join(sandboxes)}" + ("; file isolation unavailable" if "none" in sandboxes else ""))
    shares = sorted({r.cpu_share for r in results if r.cpu_share})
    if shares:
        print(f"CPU share per kernel: {', '.join(shares)}")
    return 0


def gradescope_command(args: argparse.Namespace) -> int:
    from vitlab_grader.gradescope import build

    if args.cell_timeout is not None and args.cell_timeout <= 0:
        raise AssignmentError("--cell-timeout must be > 0 seconds")
    secret = _secret(args)
    out = build(args.release, args.out, timeout=args.timeout, cell_timeout=args.cell_timeout,
                all_or_nothing=args.all_or_nothing, visibility=args.visibility, secret=secret)  # fmt: skip
    shipped = ", the hidden cases' secret" if secret else ""
    print(f"{out}: setup.sh, run_autograder, the release{shipped}; upload it as the assignment's autograder "
          "(never to students)")  # fmt: skip
    return 0


def _check_lms(args: argparse.Namespace) -> None:
    """The LMS flags, before hours of grading."""
    if args.lms is None:
        if args.roster or args.assignment or args.points is not None:
            raise AssignmentError("--roster, --assignment and --points go with --lms")
        return
    if not args.gradebook:
        raise AssignmentError(f"--lms {args.lms} writes the gradebook: give --gradebook FILE")
    if args.lms == "canvas" and not args.assignment:
        raise AssignmentError("--lms canvas needs --assignment NAME (the gradebook column)")
    if args.points is not None and args.points <= 0:
        raise AssignmentError("--points must be > 0")
    if args.roster and not Path(args.roster).is_file():
        raise AssignmentError(f"--roster {args.roster}: no such file")


def _write_gradebook(args: argparse.Namespace, results: list) -> None:
    from vitlab_grader.lms import write_canvas, write_moodle

    if args.lms == "canvas":
        notes = write_canvas(
            results, args.gradebook, assignment=args.assignment, points=args.points, roster=args.roster
        )
    elif args.lms == "moodle":
        notes = write_moodle(results, args.gradebook, points=args.points, worksheet=args.roster,
                             anomalies_to=args.anomalies)  # fmt: skip
    else:
        write_gradebook(results, args.gradebook, args.id_column)
        return
    for note in notes:
        print(f"{args.lms}: {note}")


def _write_feedback(args: argparse.Namespace, results: list) -> list:
    from vitlab_grader.lms import write_moodle_feedback

    if args.lms == "moodle":
        return write_moodle_feedback(results, args.feedback, args.feedback_format, args.anomalies)
    return write_feedback(results, args.feedback, args.feedback_format, args.anomalies)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vitlab_grader",
        description="The instructor's workflow: check the chapters, make student copies, grade submissions.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("validate", help="list each notebook's exercises and what breaks the format")
    p.add_argument("sources", nargs="+", metavar="SRC", help="instructor notebooks or folders of them")
    p.add_argument("--strict", action="store_true", help="also fail on warnings and on notebooks with no exercises")
    p.set_defaults(run=validate)

    p = commands.add_parser("student", help="write student copies: no solutions, answers, outputs or metadata")
    p.add_argument("sources", nargs="+", metavar="SRC", help="instructor notebooks or folders of them")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the student notebooks")
    p.add_argument("--secret", metavar="FILE", help="the hidden cases' secret, written if FILE does not exist "
                   "(keep it outside --out: students must never get it)")  # fmt: skip
    p.add_argument("--vitlab-ref", metavar="REF", help="the git ref the setup cell installs vitlab at "
                   "(default: v<vitlab's version>, a tag of the course repository)")  # fmt: skip
    p.set_defaults(run=student)

    p = commands.add_parser("grade", help="run submissions against the release's checks; score them")
    p.add_argument("submissions", nargs="+", metavar="SUBMISSION", help="notebooks or folders of them")
    p.add_argument(
        "--release",
        required=True,
        nargs="+",
        metavar="RELEASE",
        help="the student copies `student` wrote (files or folders): their check cells, points and order count",
    )
    p.add_argument("--out", required=True, metavar="CSV", help=f"results, columns: {', '.join(CSV_COLUMNS)}")
    p.add_argument("--secret", metavar="FILE", help="the release's secret (student --secret): also grade every "
                   "check's hidden cases")  # fmt: skip
    p.add_argument("--json", metavar="JSON", help="also write the results, with each notebook's summary, as JSON")
    p.add_argument("--timeout", type=float, default=300, help="seconds for a whole notebook (default 300)")
    p.add_argument(
        "--cell-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds for one cell; a cell past it is interrupted and the run goes on (default: none)",
    )
    p.add_argument("--jobs", type=int, default=1, help="notebooks run at the same time (default 1)")
    p.add_argument(
        "--all-or-nothing",
        action="store_true",
        help="an exercise scores its points only if every case passes (default: points x fraction passed)",
    )
    p.add_argument("--gradebook", metavar="CSV", help="also write one row per student: id, a score per exercise, total")
    p.add_argument(
        "--id-column",
        default="student_id",
        metavar="NAME",
        help="the gradebook's id column header, e.g. 'SIS User ID' (Canvas), 'SID' (default student_id)",
    )
    p.add_argument(
        "--id-source",
        default="auto",
        choices=SOURCES,
        help="where a student's id comes from (default auto: a Moodle or Canvas export's names, a per-student "
        "folder, else the file name); two submissions with one id are an error, never merged",
    )
    p.add_argument(
        "--id-pattern",
        default=None,
        metavar="REGEX",
        help="regular expression searched in the submission's path (relative to the submissions' common folder) "
        "for the student id: group 'id', or group 1",
    )
    p.add_argument(
        "--no-sandbox",
        action="store_true",
        help="run kernels without the OS sandbox (folder, environment and processes are still isolated)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run whose results are in --json: notebooks already there are kept, the rest graded",
    )
    p.add_argument(
        "--only-failed",
        action="store_true",
        help="with the results in --json: grade again only the notebooks not fully graded (ERROR), keep the rest",
    )
    p.add_argument(
        "--memory-limit",
        type=float,
        default=DEFAULT_LIMITS.memory / 2**20 if DEFAULT_LIMITS.memory else 0,
        metavar="MIB",
        help="memory each kernel may allocate, MiB (RLIMIT_DATA; 0: none; default %(default)g)",
    )
    p.add_argument(
        "--process-limit",
        type=int,
        default=DEFAULT_LIMITS.processes or 0,
        metavar="N",
        help="processes and threads of each kernel's sandbox (RLIMIT_NPROC; 0: none; default %(default)s)",
    )
    p.add_argument(
        "--nice", type=int, default=DEFAULT_LIMITS.nice, help="the kernels' lower CPU priority (default %(default)s)"
    )
    p.add_argument("--feedback", metavar="DIR", help="also write one feedback file per submission into DIR")
    p.add_argument(
        "--feedback-format", choices=("md", "html"), default="md", help="feedback as Markdown or HTML (default md)"
    )
    p.add_argument(
        "--anomalies",
        choices=ANOMALIES,
        default="instructor",
        help="who reads the anomalies and flags: the instructor only (the report, JSON and gradebook; default) "
        "or the student too (the feedback, Moodle's feedback comments)",
    )
    p.add_argument(
        "--lms",
        choices=("canvas", "moodle"),
        default=None,
        help="write --gradebook as the LMS imports it: Canvas's grade-import CSV or Moodle's offline grading "
        "worksheet (and --feedback named for Moodle's feedback-zip upload)",
    )
    p.add_argument(
        "--roster",
        metavar="CSV",
        help="with --lms canvas: Canvas's gradebook export (names, SIS ids, sections, non-submitters); "
        "with --lms moodle: the downloaded grading worksheet",
    )
    p.add_argument("--assignment", metavar="NAME", help="with --lms canvas: the assignment's gradebook column")
    p.add_argument(
        "--points", type=float, default=None, help="with --lms: scale each total to these points (default: raw sum)"
    )
    p.set_defaults(run=grade_command)

    p = commands.add_parser("gradescope", help="build a Gradescope autograder zip that grades against the release")
    p.add_argument("--release", required=True, nargs="+", metavar="RELEASE", help="the student copies `student` wrote")
    p.add_argument("--out", required=True, metavar="ZIP", help="the autograder zip to write")
    p.add_argument("--secret", metavar="FILE", help="the release's secret (student --secret): shipped in the zip: "
                   "every check's hidden cases are graded")  # fmt: skip
    p.add_argument(
        "--timeout", type=float, default=480, help="seconds for a whole notebook (default 480: Gradescope's 10 minutes)"
    )
    p.add_argument("--cell-timeout", type=float, default=None, metavar="SECONDS", help="seconds for one cell")
    p.add_argument("--all-or-nothing", action="store_true", help="an exercise scores only if every case passes")
    p.add_argument(
        "--visibility",
        choices=("hidden", "after_due_date", "after_published", "visible"),
        default="visible",
        help="when students see the tests' results (Gradescope's visibility; default visible)",
    )
    p.set_defaults(run=gradescope_command)

    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except AssignmentError as exc:
        parser.error(str(exc))
    return 2  # parser.error exits; this line is for type checkers


if __name__ == "__main__":
    sys.exit(main())
