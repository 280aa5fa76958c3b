"""The repository as a reader gets it: executed notebooks, table of contents, requirements, citations."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
COLAB_GUARD = 'if "google.colab" in sys.modules:'
COLAB_INSTALL = "vitlab @ git+https://github.com/vitlab-course/vit-lab@main"
# A chapter prints shapes after each step, shows a figure and a model summary: far more than this.
MIN_CELLS_WITH_OUTPUT = 5
# Outputs that differ from machine to machine make nbval fail elsewhere.
MACHINE_PATH = re.compile(r"/home/|/root/|/tmp/|/work/|/Users/")
BIB_KEYS = {
    "dosovitskiy2021vit", "vaswani2017attention", "touvron2021deit", "zhou2021deepvit",
    "touvron2021cait", "yuan2021t2t", "chen2021crossvit", "heo2021pit", "graham2021levit",
    "wu2021cvt", "huang2016stochastic", "hendrycks2016gelu", "ba2016layernorm", "he2022mae",
    "abnar2020rollout", "hinton2015distilling", "howard2019mobilenetv3", "he2016resnet",
}  # fmt: skip


def toc_files() -> list[str]:
    """Every ``file:`` entry of _toc.yml (the root first), without suffix."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc.get("parts", []) + toc.get("chapters", []))
    return [str(Path(f).with_suffix("")) for f in files]


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def source(cell: dict) -> str:
    return "".join(cell["source"])


def output_text(output: dict) -> str:
    if output["output_type"] == "stream":
        return "".join(output["text"])
    if output["output_type"] == "error":
        return "\n".join(output["traceback"])
    return "".join(output.get("data", {}).get("text/plain", ""))


def test_toc_lists_every_notebook_and_nothing_missing() -> None:
    listed = {f for f in toc_files() if f.startswith("notebooks/")}
    present = {f"notebooks/{p.stem}" for p in NOTEBOOKS}
    assert not present - listed, f"notebooks missing from _toc.yml: {sorted(present - listed)}"
    assert not listed - present, f"_toc.yml lists notebooks that do not exist: {sorted(listed - present)}"


def test_toc_entries_exist() -> None:
    missing = [f for f in toc_files() if not any((ROOT / f).with_suffix(s).exists() for s in (".md", ".ipynb"))]
    assert not missing, f"_toc.yml entries with no .md or .ipynb file: {missing}"


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
    assert with_output >= MIN_CELLS_WITH_OUTPUT, f"{with_output} code cells with output, expected >= {MIN_CELLS_WITH_OUTPUT}"


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
            f"near {text[max(0, match.start() - 30):match.end() + 10]!r} (an escaped backslash lost?)"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_starts_with_colab_setup_then_title(path: Path) -> None:
    notebook = load(path)
    assert notebook["metadata"]["kernelspec"]["name"] == "python3"
    first, second = notebook["cells"][:2]
    assert first["cell_type"] == "code", "the first cell must be the Colab setup code cell"
    assert COLAB_GUARD in source(first) and COLAB_INSTALL in source(first), "first cell is not the Colab setup cell"
    assert not first["outputs"], "the Colab setup cell must print nothing outside Colab"

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
    assert source(second).lstrip().startswith(f"# Chapter {chapter}: "), f"title must read '# Chapter {chapter}: ...'"


@pytest.mark.parametrize("name", ["requirements.txt", "requirements-dev.txt"])
def test_requirements_have_no_exact_pins(name: str) -> None:
    lines = [line.split("#")[0].strip() for line in (ROOT / name).read_text().splitlines()]
    pinned = [line for line in lines if "==" in line]
    assert not pinned, f"{name} pins exact versions (readers install on Colab and elsewhere): {pinned}"


def test_bibliography_has_exactly_the_course_keys() -> None:
    keys = set(re.findall(r"^@\w+\{([^,\s]+),", (ROOT / "book/references.bib").read_text(), re.MULTILINE))
    assert keys == BIB_KEYS, f"extra: {sorted(keys - BIB_KEYS)}, missing: {sorted(BIB_KEYS - keys)}"


def test_every_citation_is_in_the_bibliography() -> None:
    texts = {p: p.read_text(encoding="utf-8") for p in [*NOTEBOOKS, *(ROOT / "book").glob("*.md")]}
    unknown = {
        f"{p.relative_to(ROOT)}: {key}"
        for p, text in texts.items()
        for keys in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", text)
        for key in keys.split(",")
        if key.strip() not in BIB_KEYS
    }
    assert not unknown, f"citations with no entry in book/references.bib: {sorted(unknown)}"


def test_ci_runs_the_readme_test_command() -> None:
    assert "make test" in (ROOT / "README.md").read_text()
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == "make test", f".ci/run must end by running `make test`, it ends with {ci[-1]!r}"
