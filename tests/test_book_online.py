"""``make book-online`` (book/_scripts/online_book.py), tested offline both ways.

A two-page book whose one notebook has a ``%%needs_internet`` cell, stored as an offline
run stores it ("Not run here"). With a fabricated Hugging Face cache in the hub's real
layout (tests/test_pretrained.py writes it) the script runs the cell for real and the HTML
shows what it printed, not the line; with an empty cache and ``HF_HUB_OFFLINE=1`` it stops
with exit status 1 and names the model.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("timm")
pytest.importorskip("huggingface_hub")

from conftest import add_timm_repo  # noqa: E402 - after the importorskips

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "book" / "_scripts" / "online_book.py"
MODEL = "vit_tiny_patch16_224"
BOX = "Not run here"

pytestmark = pytest.mark.slow


def _cell(cell_type: str, source: str, outputs: list | None = None, tags: list[str] | None = None) -> dict:
    cell: dict = {
        "cell_type": cell_type,
        "id": hashlib.sha1(source.encode()).hexdigest()[:8],
        "metadata": {},
        "source": source,
    }
    if cell_type == "code":
        cell |= {"execution_count": 1, "outputs": outputs or []}
    if tags:
        cell["metadata"]["tags"] = tags
    return cell


def write_book(root: Path) -> None:
    """A minimal Jupyter Book: a landing page and one chapter with a stored offline output."""
    (root / "notebooks").mkdir(parents=True)
    (root / "_config.yml").write_text(
        "title: Online test\nonly_build_toc_files: true\nexecute:\n  execute_notebooks: 'off'\n", encoding="utf-8"
    )
    (root / "_toc.yml").write_text(
        "format: jb-book\nroot: intro\nchapters:\n- file: notebooks/chapter\n", encoding="utf-8"
    )
    (root / "intro.md").write_text("# Online test\n\nA book with one chapter.\n", encoding="utf-8")
    offline = {"name": "stdout", "output_type": "stream", "text": f"{BOX}: a download failed (OSError).\n"}
    code = (
        f"%%needs_internet {MODEL}\n"
        "import torch, vitlab\n"
        f"model = vitlab.create_model('{MODEL}', pretrained=True).eval()\n"
        "torch.manual_seed(0)\n"
        "with torch.no_grad():\n"
        "    logits = model(torch.randn(1, 3, 224, 224))\n"
        "print('trained logits shape', tuple(logits.shape))\n"
    )
    notebook = {
        "cells": [
            _cell("markdown", "# Chapter\n\nWith trained weights."),
            _cell("code", "%load_ext vitlab.notebook"),
            _cell("code", code, [offline], ["needs-internet", "nbval-skip", "remove-output"]),
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (root / "notebooks" / "chapter.ipynb").write_text(json.dumps(notebook, indent=1), encoding="utf-8")


def run_script(root: Path, hf_home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_CACHE": str(hf_home / "hub"), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, str(SCRIPT), "--root", str(root)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)


def test_the_script_is_importable_and_stages_only_the_books_sources(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("online_book", SCRIPT)
    assert spec is not None and spec.loader is not None
    online_book = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(online_book)
    staged = online_book.stage(ROOT, tmp_path / "staged")
    names = {p.name for p in staged.iterdir()}
    assert {"_config.yml", "_toc.yml", "book", "notebooks"} <= names
    assert not names & {".git", ".venv", "vitlab", "tests", "_build"}, names
    assert online_book.needs_internet(staged / "notebooks" / "03_vit_encoder.ipynb")
    assert not online_book.needs_internet(staged / "notebooks" / "01_patches.ipynb")


def test_with_the_weights_cached_the_html_shows_the_cells_output(tmp_path: Path) -> None:
    root, hf_home = tmp_path / "book", tmp_path / "hf_home"
    write_book(root)
    add_timm_repo(hf_home / "hub", MODEL, tmp_path / "saved")
    result = run_script(root, hf_home)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    page = (root / "_build" / "html" / "notebooks" / "chapter.html").read_text(encoding="utf-8")
    assert "trained logits shape (1, 1000)" in page
    assert BOX not in page
    stored = json.loads((root / "notebooks" / "chapter.ipynb").read_text(encoding="utf-8"))
    assert BOX in json.dumps(stored), "the sources are never changed: only the staged copy runs online"


def test_with_an_empty_cache_offline_it_fails_and_names_the_model(tmp_path: Path) -> None:
    root, hf_home = tmp_path / "book", tmp_path / "hf_home"
    write_book(root)
    (hf_home / "hub").mkdir(parents=True)
    result = run_script(root, hf_home)
    assert result.returncode == 1
    assert f"book-online: FAILED: chapter.ipynb: the download of {MODEL} failed" in result.stderr
    assert not (root / "_build" / "html" / "notebooks" / "chapter.html").exists()
