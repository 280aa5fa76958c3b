"""Notebooks store no warnings.

``make test`` runs every notebook once (nbval): a fresh execution in a new kernel against
the outputs stored by ``make execute`` in another, so an output that depends on unseeded
randomness, set order or timing fails it sooner or later. Running each chapter a second
time would prove little more and double the suite's longest part.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import output_text

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# What Python's warnings module writes ("UserWarning: ..." and the source line it shows).
WARNING = re.compile(r"\b\w*Warning: |warnings\.warn\(")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_outputs_hold_no_warnings(path: Path) -> None:
    # Stricter than test_repository.py's check: nothing on stderr at all, and no warning
    # text anywhere (a warning printed to stdout, or shown as a cell's value, counts too).
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    for number, cell in enumerate(cells):
        for output in cell.get("outputs", []):
            text = output_text(output)
            assert output.get("name") != "stderr", f"cell {number} writes to stderr: {text[:300]}"
            match = WARNING.search(text)
            assert match is None, f"cell {number} stores a warning ({match and match.group()}): {text[:300]}"
