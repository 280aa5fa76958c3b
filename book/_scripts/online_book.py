"""Build the book with the real outputs of the cells that need the internet (``make book-online``).

The notebooks are committed executed offline, so their ``%%needs_internet`` cells
(vitlab/notebook.py) store the line "Not run here: ... needs the internet". The published
book must show what those cells really print: the trained models' predictions, their
attention maps, their learned biases. This script

1. copies the book's sources (``_config.yml``, ``_toc.yml``, the pages and the notebooks;
   never the repository's own files) into a staging folder, so that the working tree
   is never changed;
2. runs every staged notebook that has a ``%%needs_internet`` cell from top to bottom in a
   fresh kernel, with ``VITLAB_REQUIRE_INTERNET=1``: a download that fails raises
   ``DownloadFailedError`` naming the model, and the script stops with exit status 1 and
   that name, so a published book never shows the "Not run here" line (a ``--gpu`` cell
   still says that it needs a GPU where CUDA is missing); then it drops the
   ``remove-output`` tag of those cells, which hides their offline output in ``make book``,
   so that the book shows what they printed;
3. builds the staged book's three editions (English, Korean, Chinese) with
   ``book/_scripts/editions.py``, each with ``jupyter-book build -W -n --keep-going``, into
   ``<out>/_build/html`` (English) and its ``ko/`` and ``zh/`` folders: the folder the
   publishing workflow uploads. Outputs are not translated, so the editions show the same
   online outputs.

The downloads are cached by ``huggingface_hub`` in ``HF_HOME`` (the workflow keeps that
folder between runs). Usage::

    python book/_scripts/online_book.py                 # the course: _build/html
    python book/_scripts/online_book.py --root DIR --out DIR

``make book`` stays offline and builds the stored outputs as they are.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import editions  # noqa: E402 (a sibling script, found through the line above)

ROOT = Path(__file__).resolve().parents[2]
MAGIC = "%%needs_internet"
# What the book is built from; everything else in the repository stays behind.
SKIP = {".git", ".venv", "_build", "node_modules", ".pytest_cache", "vitlab", "tests", "benchmarks", ".github", ".ci"}
CELL_TIMEOUT = 1800  # seconds; a chapter's slowest cell offline is well under a minute
_MODEL = re.compile(r"DownloadFailedError: the download for (\S+) failed")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # IPython colours the traceback it sends


class OnlineBuildError(RuntimeError):
    """A notebook could not run online, or the book did not build; the message says which and why."""


def stage(root: Path, staging: Path) -> Path:
    """Copy the book's sources in ``root`` to ``staging`` (emptied first); return ``staging``."""
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    for entry in root.iterdir():
        if entry.name in SKIP or entry.name.endswith(".egg-info"):
            continue
        if entry.is_dir():
            shutil.copytree(
                entry, staging / entry.name, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
            )
        else:
            shutil.copy2(entry, staging / entry.name)
    return staging


def needs_internet(notebook: Path) -> bool:
    """Whether a notebook has a ``%%needs_internet`` cell."""
    import nbformat

    cells = nbformat.read(notebook, as_version=4).cells
    return any(c.cell_type == "code" and c.source.lstrip().startswith(MAGIC) for c in cells)


def run_online(notebook: Path) -> float:
    """Run ``notebook`` in place, top to bottom, with the internet required; the seconds it took.

    Raises :class:`OnlineBuildError` naming the notebook and, for a failed download, the model.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(notebook, as_version=4)
    client = NotebookClient(
        nb, timeout=CELL_TIMEOUT, kernel_name="python3", resources={"metadata": {"path": str(notebook.parent)}}
    )
    env = {**os.environ, "VITLAB_REQUIRE_INTERNET": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    start = time.monotonic()
    try:
        client.execute(env=env)
    except CellExecutionError as error:
        text = _ANSI.sub("", str(error)).strip()
        found = _MODEL.search(text)
        what = f"the download of {found.group(1)} failed" if found else "a cell raised"
        last = text.splitlines()[-1] if text else type(error).__name__
        raise OnlineBuildError(f"{notebook.name}: {what}: {last}") from error
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.lstrip().startswith(MAGIC):
            tags = cell.metadata.get("tags", [])
            cell.metadata["tags"] = [t for t in tags if t != "remove-output"]
    nbformat.write(nb, notebook)
    return time.monotonic() - start


def build(root: Path, out: Path, staging: Path) -> Path:
    """Stage ``root``, run its internet notebooks online, build into ``out``; the html folder."""
    stage(root, staging)
    notebooks = sorted(p for p in (staging / "notebooks").glob("*.ipynb") if needs_internet(p))
    for notebook in notebooks:
        print(f"book-online: running {notebook.name} with the internet required", flush=True)
        print(f"book-online: {notebook.name} ran in {run_online(notebook):.0f} s", flush=True)
    try:
        return editions.build_all(staging, out)
    except editions.BuildError as error:
        raise OnlineBuildError(str(error)) from error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the book's sources (default: this repository)")
    parser.add_argument("--out", type=Path, default=None, help="where _build/html goes (default: --root)")
    parser.add_argument("--staging", type=Path, default=None, help="scratch copy (default: <out>/_build/online-src)")
    args = parser.parse_args(argv)
    out = (args.out or args.root).resolve()
    staging = (args.staging or out / "_build" / "online-src").resolve()
    try:
        html = build(args.root.resolve(), out, staging)
    except OnlineBuildError as error:
        print(f"book-online: FAILED: {error}", file=sys.stderr)
        return 1
    print(f"book-online: built {html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
