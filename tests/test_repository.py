"""The repository as a reader gets it: executed notebooks, table of contents, requirements, citations."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from conftest import ROOT, output_text, toc_files

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
COLAB_GUARD = 'if "google.colab" in sys.modules:'
COLAB_INSTALL = "vitlab @ git+https://github.com/vitlab-course/vit-lab@main"
# A chapter prints shapes after each step, shows a figure and a model summary: far more than this.
MIN_CELLS_WITH_OUTPUT = 5
# Outputs that differ from machine to machine make nbval fail elsewhere.
MACHINE_PATH = re.compile(r"/home/|/root/|/tmp/|/work/|/Users/")
# Cells that download weights start with the %%needs_internet magic (vitlab/notebook.py):
# executed everywhere (offline they print why they did not run), skipped by nbval (their
# output depends on the network), and their output is left out of the book, where a
# "Needs internet" box stands instead.
INTERNET_TAGS = {"needs-internet", "nbval-skip", "remove-output"}
INTERNET_MAGIC = "%%needs_internet "
LEARNING_GOALS = "**Learning goals.** After this chapter you can:"
# The book's column shows about 79 characters of code at 1280 px (notebooks/ruff.toml).
CODE_COLUMNS = 79
# Alt text a screen reader would read out as noise: a file name, or nothing.
FILENAME_ALT = re.compile(r"^\S*\.(png|jpe?g|svg|gif)$|^\s*$", re.IGNORECASE)


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def source(cell: dict) -> str:
    return "".join(cell["source"])


def test_toc_lists_every_notebook_and_nothing_missing() -> None:
    listed = {f for f in toc_files() if f.startswith("notebooks/")}
    present = {f"notebooks/{p.stem}" for p in NOTEBOOKS}
    assert not present - listed, f"notebooks missing from _toc.yml: {sorted(present - listed)}"
    assert not listed - present, f"_toc.yml lists notebooks that do not exist: {sorted(listed - present)}"


def test_toc_entries_exist() -> None:
    missing = [f for f in toc_files() if not any((ROOT / f).with_suffix(s).exists() for s in (".md", ".ipynb"))]
    assert not missing, f"_toc.yml entries with no .md or .ipynb file: {missing}"


def tags(cell: dict) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def mystnb(cell: dict) -> dict:
    return cell.get("metadata", {}).get("mystnb", {})


def is_appendix(path: Path) -> bool:
    return int(path.name.split("_")[0]) > 13


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_executed(path: Path) -> None:
    code = [c for c in load(path)["cells"] if c["cell_type"] == "code"]
    empty = [i for i, c in enumerate(code) if not source(c).strip()]
    assert not empty, f"empty code cells (indices among code cells): {empty}"
    counts = [c["execution_count"] for c in code]
    assert counts == list(range(1, len(code) + 1)), (
        f"execution counts {counts}: run the whole notebook top to bottom (make execute)"
    )
    with_output = sum(1 for c in code if c["outputs"])
    assert with_output >= MIN_CELLS_WITH_OUTPUT, (
        f"{with_output} code cells with output, expected >= {MIN_CELLS_WITH_OUTPUT}"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_outputs_are_clean(path: Path) -> None:
    for number, cell in enumerate(load(path)["cells"]):
        for output in cell.get("outputs", []):
            text = output_text(output)
            where = f"cell {number}"
            assert output["output_type"] != "error", f"{where} stores an error: {text[-300:]}"
            if output["output_type"] == "stream" and output["name"] == "stderr":
                assert "Warning" not in text, f"{where} stores a warning: {text[:300]}"
            match = MACHINE_PATH.search(text)
            assert match is None, f"{where} prints a machine path ({match and match.group()}): {text[:300]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_markdown_has_no_control_characters(path: Path) -> None:
    # A cell written from a Python string without r"" turns "\times" into a tab + "imes",
    # "\frac" into a form feed + "rac", "\beta" into a backspace + "eta": broken math.
    for number, cell in enumerate(load(path)["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        text = source(cell)
        match = re.search(r"[\x00-\x09\x0b-\x1f\x7f]", text)
        assert match is None, (
            f"cell {number} has control character {match and match.group()!r} "
            f"near {text[max(0, match.start() - 30) : match.end() + 10]!r} (an escaped backslash lost?)"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_starts_with_colab_setup_then_title(path: Path) -> None:
    notebook = load(path)
    assert notebook["metadata"]["kernelspec"]["name"] == "python3"
    first, second = notebook["cells"][:2]
    assert first["cell_type"] == "code", "the first cell must be the Colab setup code cell"
    assert COLAB_GUARD in source(first) and COLAB_INSTALL in source(first), "first cell is not the Colab setup cell"
    assert not first["outputs"], "the Colab setup cell must print nothing outside Colab"

    assert "remove-cell" in tags(first), "the Colab setup cell must carry the tag remove-cell (title first)"
    chapter = int(path.name.split("_")[0])
    titles = [
        (i, token)
        for i, cell in enumerate(notebook["cells"])
        if cell["cell_type"] == "markdown"
        for token in MarkdownIt("commonmark").parse(source(cell))
        if token.type == "heading_open" and token.tag == "h1"
    ]
    assert len(titles) == 1, f"{len(titles)} '#' titles in cells {[i for i, _ in titles]}, expected exactly 1"
    assert titles[0][0] == 1, f"the '#' title is in cell {titles[0][0]}, expected cell 1 (after the Colab cell)"
    prefix = "# Appendix: " if is_appendix(path) else f"# Chapter {chapter}: "
    assert source(second).lstrip().startswith(prefix), f"title must read '{prefix}...'"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_states_its_learning_goals_in_one_form(path: Path) -> None:
    title = source(load(path)["cells"][1])
    assert LEARNING_GOALS in title, f"the title cell must say {LEARNING_GOALS!r} followed by a list"
    after = title.split(LEARNING_GOALS, 1)[1].lstrip("\n")
    assert after.startswith(("- ", "* ")), "the learning goals must be a bullet list right after that line"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_image_output_has_alt_text(path: Path) -> None:
    """myst-nb writes the cell's `mystnb: image: alt:` into the <img>; without it a screen
    reader reads out the image's file name."""
    missing = []
    for number, cell in enumerate(load(path)["cells"]):
        images = [o for o in cell.get("outputs", []) if any(k.startswith("image/") for k in o.get("data", {}))]
        alt = str(mystnb(cell).get("image", {}).get("alt", ""))
        if images and (FILENAME_ALT.match(alt) or len(alt.split()) < 4):
            missing.append(number)
    assert not missing, f"cells {missing} show an image with no meaningful alt text (metadata mystnb.image.alt)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_code_fits_the_column(path: Path) -> None:
    long = [
        f"cell {number}: {line[:50]}... ({len(line)} chars)"
        for number, cell in enumerate(load(path)["cells"])
        if cell["cell_type"] == "code"
        for line in source(cell).splitlines()
        if len(line) > CODE_COLUMNS
    ]
    assert not long, f"code lines wider than the book's column ({CODE_COLUMNS}):\n" + "\n".join(long[:10])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_hidden_solutions_say_what_they_hide(path: Path) -> None:
    unlabelled = [
        number
        for number, cell in enumerate(load(path)["cells"])
        if cell["cell_type"] == "code" and "hide-input" in tags(cell) and "code_prompt_show" not in mystnb(cell)
    ]
    assert not unlabelled, f"hidden cells {unlabelled} would say 'Show code cell source': set mystnb.code_prompt_show"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_only_internet_cells_are_skipped(path: Path) -> None:
    """A cell that downloads weights starts with %%needs_internet and carries all three tags;
    no other cell carries any of them (a cell nbval skips tests nothing); the notebook loads
    the magic before it, and a note box precedes the first."""
    cells = load(path)["cells"]
    for number, cell in enumerate(cells):
        found = tags(cell) & INTERNET_TAGS
        magic = cell["cell_type"] == "code" and source(cell).startswith(INTERNET_MAGIC)
        if not found and not magic:
            continue
        assert found == INTERNET_TAGS, f"cell {number} has {sorted(found)}, expected all of {sorted(INTERNET_TAGS)}"
        assert magic, f"internet cell {number} must start with {INTERNET_MAGIC!r}"
    first = next((i for i, c in enumerate(cells) if tags(c) & INTERNET_TAGS), None)
    if first is not None:
        before = cells[:first]
        assert any("%load_ext vitlab.notebook" in source(c) for c in before if c["cell_type"] == "code"), (
            "load the magic (%load_ext vitlab.notebook) before the first internet cell"
        )
        notes = "".join(source(c) for c in before if c["cell_type"] == "markdown")
        assert "Needs internet" in notes, "the internet cells must follow a 'Needs internet' note box"


@pytest.mark.parametrize("name", ["requirements.txt", "requirements-dev.txt"])
def test_requirements_have_no_exact_pins(name: str) -> None:
    lines = [line.split("#")[0].strip() for line in (ROOT / name).read_text().splitlines()]
    pinned = [line for line in lines if "==" in line]
    assert not pinned, f"{name} pins exact versions (readers install on Colab and elsewhere): {pinned}"


def bib_keys() -> set[str]:
    return set(re.findall(r"^@\w+\{([^,\s]+),", (ROOT / "book/references.bib").read_text(), re.MULTILINE))


def cited_keys() -> set[str]:
    texts = [p.read_text(encoding="utf-8") for p in [*NOTEBOOKS, *(ROOT / "book").glob("*.md")]]
    return {
        key.strip()
        for text in texts
        for keys in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", text)
        for key in keys.split(",")
    }


def test_every_bibliography_entry_is_cited() -> None:
    unused = bib_keys() - cited_keys()
    assert not unused, f"book/references.bib entries no page cites: {sorted(unused)}"


def test_repository_names_no_file_it_lacks() -> None:
    """The course's inputs (the source notes' errata and reference numbers) live outside the
    repository; what it says about them is in book/pitfalls.md and book/reference_numbers.md."""
    outside = re.compile(r"\b(ERRATA|REFERENCE_NUMBERS|STYLE)\.md\b|\.\./shared\b")
    suffixes = {".py", ".md", ".ipynb", ".yml", ".toml", ".txt", ".cfg"}
    hits = []
    skipped = {".venv", ".git", "_build", "node_modules", "__pycache__", ".pytest_cache"}
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [name for name in subfolders if name not in skipped and not name.endswith(".egg-info")]
        for name in files:
            path = Path(folder) / name
            if path.suffix not in suffixes or path.resolve() == Path(__file__).resolve():
                continue
            for match in outside.finditer(path.read_text(encoding="utf-8", errors="replace")):
                hits.append(f"{path.relative_to(ROOT)}: {match.group()}")
    assert not hits, "files name files the repository does not contain:\n" + "\n".join(hits)


def test_every_citation_is_in_the_bibliography() -> None:
    texts = {p: p.read_text(encoding="utf-8") for p in [*NOTEBOOKS, *(ROOT / "book").glob("*.md")]}
    unknown = {
        f"{p.relative_to(ROOT)}: {key}"
        for p, text in texts.items()
        for keys in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", text)
        for key in keys.split(",")
        if key.strip() not in bib_keys()
    }
    assert not unknown, f"citations with no entry in book/references.bib: {sorted(unknown)}"


def test_ci_runs_the_readme_test_command() -> None:
    assert "make test" in (ROOT / "README.md").read_text()
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == "make test", f".ci/run must end by running `make test`, it ends with {ci[-1]!r}"
