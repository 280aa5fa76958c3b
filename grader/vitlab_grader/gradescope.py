"""A Gradescope autograder: ``python -m vitlab_grader gradescope --release student/ --out autograder.zip``.

Gradescope's autograder specification (gradescope-autograders.readthedocs.io, "Autograder
Specifications"): the zip holds at its root ``setup.sh`` (run once, as root, when the
image is built: it installs the dependencies) and ``run_autograder`` (run per submission
with ``/autograder`` as the working folder). The zip is unpacked into
``/autograder/source``; the student's files are in ``/autograder/submission``; the
autograder writes ``/autograder/results/results.json``; what it prints goes to
``/autograder/results/stdout``, shown to the instructor only.

The zip this module builds:

- ``setup.sh``: a virtual environment ``/autograder/venv`` with CPU torch and the
  grader's dependencies at the versions the instructor runs (``requirements.txt``), then
  the instructor's own ``vitlab`` and ``vitlab_grader`` from ``packages/`` (the code
  that wrote the release: the checks cannot change between release and grading);
- ``run_autograder``: ``python -m vitlab_grader.gradescope --root /autograder``;
- ``release/``: the student notebooks and the files they ship; ``settings.json``: the
  time limits, partial credit and visibility;
- ``hidden.key``, given the release's secret: every check's hidden cases are graded
  (:func:`vitlab_grader.release.hidden_spec`). It is in the autograder only, which
  Gradescope never shows to students, and outside ``release/``.

``results.json`` has one test per exercise of the release (``name``, ``score``,
``max_score``, ``status``, ``output``: the check's message, ``visibility``), and the
submission's feedback (:func:`vitlab_grader.report.feedback_markdown`) as its ``output``
(``output_format`` ``md``). An exercise the grader could not grade scores 0 on Gradescope,
whose scores are numbers, but its output says it was not graded and why, and
``extra_data.unscored`` lists it for the instructor; a release notebook with no
submission has its exercises at 0, "not submitted".

Try it offline: lay a folder out as ``/autograder`` (``source/`` unpacked from the zip,
``submission/``), then ``VITLAB_GRADER_PYTHON=python ./run_autograder --root folder``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
import zipfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

VISIBILITY = ("hidden", "after_due_date", "after_published", "visible")
# What the grader, vitlab and the chapters' notebooks import in the container, pinned to the
# versions here (torch and torchvision come from PyTorch's CPU index, in setup.sh).
REQUIREMENTS = (
    "einops", "numpy", "tqdm", "nbformat", "nbclient", "jupyter_client", "ipykernel",
    "matplotlib", "scikit-image", "scikit-learn", "timm", "torchinfo", "graphviz", "altair",
)  # fmt: skip
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
SECRET_FILE = "hidden.key"  # the release's secret in the zip (/autograder/source/hidden.key)

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends python3 python3-venv python3-pip graphviz  # graphviz: the diagrams
python3 -m venv /autograder/venv
PIP=/autograder/venv/bin/pip
"$PIP" install --upgrade pip
"$PIP" install --index-url {torch_index} "torch=={torch}" {torchvision}
"$PIP" install -r /autograder/source/requirements.txt
"$PIP" install --no-deps /autograder/source/packages/vitlab /autograder/source/packages/vitlab_grader
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for every submission, in /autograder; the arguments are for offline tries.
PYTHON="${VITLAB_GRADER_PYTHON:-/autograder/venv/bin/python}"
exec "$PYTHON" -m vitlab_grader.gradescope "$@"
"""

PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "{version}"
requires-python = ">=3.10"

[tool.setuptools.packages.find]
include = ["{package}*"]

[tool.setuptools.package-data]
"*" = ["*"]
"""


def _version(distribution: str, fallback: str = "0+local") -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return fallback


def _package_files(package: str) -> dict[str, bytes]:
    """The files of an imported package, by path below its folder's parent (``vitlab/layers/mlp.py``)."""
    import importlib

    module = importlib.import_module(package)
    folder = Path(module.__file__ or "").parent
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and not path.name.startswith("."):
            files[path.relative_to(folder.parent).as_posix()] = path.read_bytes()
    return files


def build(
    release: Sequence[str | Path],
    out: str | Path,
    *,
    timeout: float = 480,
    cell_timeout: float | None = None,
    all_or_nothing: bool = False,
    visibility: str = "visible",
    secret: bytes | None = None,
) -> Path:
    """Write the autograder zip (the module's docstring); its path.

    Raises:
        AssignmentError: the release cannot be read, or a notebook of it has no check.
        ValueError: an unknown ``visibility``.
    """
    import torch

    from vitlab_grader.exercises import AssignmentError, find_notebooks
    from vitlab_grader.release import read_release

    if visibility not in VISIBILITY:
        raise ValueError(f"visibility must be one of {', '.join(VISIBILITY)}, got {visibility!r}")
    releases = read_release(release)  # the release is valid before anything is written
    if unchecked := [r.name for r in releases if not r.checks]:
        raise AssignmentError(f"{', '.join(unchecked)}: no check cells in the release, nothing to grade on Gradescope")
    vitlab_version = _version("vitlab", __import__("vitlab").__version__)
    grader_version = _version("vitlab-grader")
    torch_version = torch.__version__.split("+")[0]
    vision = _version("torchvision", "").split("+")[0]
    torchvision = f'"torchvision=={vision}"' if vision else "torchvision"
    requirements = [f"{name}=={_version(name)}" for name in REQUIREMENTS if _version(name, "") != ""]
    settings = {"timeout": timeout, "cell_timeout": cell_timeout, "all_or_nothing": all_or_nothing,
                "visibility": visibility, "vitlab": vitlab_version, "vitlab_grader": grader_version,
                "hidden_cases": secret is not None}  # fmt: skip
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:

        def put(name: str, data: str | bytes, mode: int = 0o644) -> None:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)

        put("setup.sh", SETUP_SH.format(torch_index=TORCH_INDEX, torch=torch_version, torchvision=torchvision), 0o755)
        put("run_autograder", RUN_AUTOGRADER, 0o755)
        put("requirements.txt", "\n".join(requirements) + "\n")
        put("settings.json", json.dumps(settings, indent=1) + "\n")
        if secret is not None:
            put(SECRET_FILE, secret.hex() + "\n", 0o600)
        for package, distribution, version in (
            ("vitlab", "vitlab", vitlab_version), ("vitlab_grader", "vitlab-grader", grader_version),
        ):  # fmt: skip
            put(f"packages/{package}/pyproject.toml", PYPROJECT.format(name=distribution, version=version,
                                                                       package=package))  # fmt: skip
            for name, data in _package_files(package).items():
                put(f"packages/{package}/{name}", data)
        for path, relative in find_notebooks(release):
            put(f"release/{Path(relative).as_posix()}", Path(path).read_bytes())
        for item in releases:
            base = Path(item.name).parent
            for name, data in item.files.items():
                put(f"release/{(base / name).as_posix()}", data)
    return out


def _test(name: str, score: float, max_score: float, status: str, output: str, visibility: str) -> dict[str, Any]:
    return {"name": name, "score": score, "max_score": max_score, "status": status, "output": output,
            "output_format": "text", "visibility": visibility}  # fmt: skip


def results_json(results: list[Any], releases: list[Any], visibility: str, seconds: float) -> dict[str, Any]:
    """Gradescope's ``results.json`` for one submission's graded notebooks (the module's docstring)."""
    from vitlab_grader.report import anomalies, clean, exercise_score, feedback_markdown, number, unscored

    tests: list[dict[str, Any]] = []
    unscored_notes: list[str] = []
    graded = {r.release for r in results if r.release}
    several = len(releases) > 1
    for result in results:
        prefix = f"{result.release}: " if several and result.release else ""
        if not result.exercises:
            why = clean(f"{result.status}: {result.error or 'nothing graded'}")
            name = clean(Path(result.notebook).name, lines=False)
            tests.append(_test(f"{name}: not graded", 0.0, 0.0, "failed", why, visibility))
            unscored_notes += [f"{name}: {note}" for note in unscored(result)]
            continue
        for row in result.exercises:
            score = exercise_score(row)
            cases = f"{row.fraction:.0%} of the cases" if score is not None else "not graded"
            head = f"{row.status}: {cases}, {number(score or 0.0)} / {number(row.points)} points"
            if score is None:
                head += " (not graded: the grader could not run this check; your instructor sees why)"
                unscored_notes.append(f"{row.exercise}: {row.status}: {clean(row.message, lines=False)}")
            output = f"{head}\n\n{clean(row.message)}"
            status = "passed" if row.status == "PASS" else "failed"
            name = f"{prefix}{row.exercise} ({clean(row.function, lines=False) or '-'})"
            tests.append(_test(name, float(score or 0.0), float(row.points), status, output, visibility))
    for release in releases:
        if release.name in graded:
            continue
        for check in release.checks:
            name = f"{release.name + ': ' if several else ''}{check.check} ({check.function})"
            output = f"not submitted: no notebook named after {release.name}.ipynb"
            tests.append(_test(name, 0.0, float(check.points), "failed", output, visibility))
    feedback = "\n\n".join(feedback_markdown(r) for r in results) or "No notebook (.ipynb) was submitted."
    return {
        "score": round(sum(t["score"] for t in tests), 4),
        "execution_time": round(seconds),
        "output": feedback,
        "output_format": "md",
        "visibility": visibility,
        "stdout_visibility": "hidden",
        # Gradescope stores extra_data without showing it to the student: the anomalies go there.
        "extra_data": {"unscored": unscored_notes, "anomalies": [note for r in results for note in anomalies(r)]},
        "tests": tests,
    }


def run(root: str | Path = "/autograder") -> dict[str, Any]:
    """Grade ``root/submission/*.ipynb`` against ``root/source/release``; write and return ``results.json``."""
    from vitlab_grader.grade import grade
    from vitlab_grader.release import read_release, read_secret
    from vitlab_grader.report import summary

    root = Path(root)
    start = time.monotonic()
    out = root / "results" / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = json.loads((root / "source" / "settings.json").read_text(encoding="utf-8"))
    visibility = settings.get("visibility", "visible")
    try:
        release = root / "source" / "release"
        releases = read_release([release])
        folder = root / "submission"
        paths = sorted(p for p in folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts and not p.is_symlink())
        results = []
        if paths:
            options = {"cell_timeout": settings.get("cell_timeout"), "all_or_nothing": settings.get("all_or_nothing")}
            key = root / "source" / SECRET_FILE
            options["secret"] = read_secret(key) if settings.get("hidden_cases") or key.exists() else None
            # one submission, one student: every file gets its own path as its id
            ids = {"id_source": "pattern", "id_pattern": r"^(?P<id>.+)$", "root": folder}
            for result in grade(paths, [release], timeout=settings.get("timeout", 480), **options, **ids):
                print(summary(result), flush=True)
                results.append(result)
        document = results_json(results, releases, visibility, time.monotonic() - start)
    except Exception as exc:  # noqa: BLE001 - Gradescope must get a results.json, whatever happened
        traceback.print_exc()
        document = {
            "score": 0.0, "execution_time": round(time.monotonic() - start), "visibility": visibility,
            "output": f"The autograder failed ({type(exc).__name__}); your instructor sees the details. "
                      "This is not a grade.",
            "stdout_visibility": "hidden", "extra_data": {"error": f"{type(exc).__name__}: {exc}"}, "tests": [],
        }  # fmt: skip
    out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return document


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run_autograder", description="Grade a Gradescope submission.")
    parser.add_argument("--root", default="/autograder", help="the folder laid out as /autograder (default)")
    args = parser.parse_args(argv)
    run(args.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
