"""How long each chapter takes to run, alone, in a fresh kernel: the "under a minute" budget.

    .venv/bin/python benchmarks/chapter_times.py            # every notebook, one at a time
    .venv/bin/python benchmarks/chapter_times.py 04 05      # the notebooks whose names start so

Each notebook runs top to bottom in its own new kernel (nbclient, as `make execute` does),
one after the other, never side by side: notebooks executed in parallel record inflated
times, and so do the execution timestamps stored in a notebook, which this script ignores.
Cells that need the internet (``%%needs_internet``, vitlab/notebook.py) run as in
`make execute`: offline, a failed download ends them at once. The wall time includes the
kernel's start and the imports, which is what a reader waits for. The notebooks on disk are not changed.

Budget (issue: every chapter <= 60 s, all of them <= 6 minutes, on a 2-core machine); the
script exits with status 1 when a notebook is over it, so it can gate a release, but no
test runs it: a timing is a measurement, not an assertion.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
CHAPTER_BUDGET_S = 60.0
TOTAL_BUDGET_S = 360.0


def run_once(path: Path) -> float:
    """Seconds to run ``path`` top to bottom in a fresh kernel (started in the notebooks folder)."""
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    start = time.perf_counter()
    client.execute()
    return time.perf_counter() - start


def machine() -> str:
    import os

    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{platform.processor() or platform.machine()}, {cores} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} torch threads"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefixes", nargs="*", help="run only the notebooks whose names start with these")
    args = parser.parse_args(argv)
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    if args.prefixes:
        notebooks = [p for p in notebooks if p.name.startswith(tuple(args.prefixes))]
    if not notebooks:
        parser.error(f"no notebook starts with {args.prefixes}")

    print(f"machine: {machine()}")
    print(f"{'notebook':<28} {'seconds':>8}  budget")
    times = {}
    for path in notebooks:
        times[path.name] = seconds = run_once(path)
        verdict = "ok" if seconds <= CHAPTER_BUDGET_S else f"OVER {CHAPTER_BUDGET_S:.0f} s"
        print(f"{path.name:<28} {seconds:8.1f}  {verdict}", flush=True)
    total = sum(times.values())
    verdict = "ok" if total <= TOTAL_BUDGET_S else f"OVER {TOTAL_BUDGET_S:.0f} s"
    print(f"{'total':<28} {total:8.1f}  {verdict}")
    over = [n for n, s in times.items() if s > CHAPTER_BUDGET_S] or total > TOTAL_BUDGET_S
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
