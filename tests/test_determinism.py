"""Notebooks are deterministic and warning-free.

``make test`` runs nbval once: a fresh execution against the stored outputs. Here every
chapter runs a second time, in a new kernel and a new process (so a new hash seed), and
nbval must accept it again: an output that depends on unseeded randomness, set order or
timing fails one of the two runs sooner or later.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import COLAB_CHAPTERS, fresh_environment_skip_reason, output_text

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
NBVAL = ["--nbval", "--nbval-current-env", "--nbval-sanitize-with", str(ROOT / "tests" / "nbval_sanitize.cfg")]
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


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_second_execution_matches_stored_outputs(path: Path) -> None:
    if path.name in COLAB_CHAPTERS and fresh_environment_skip_reason() is None:
        pytest.skip("runs a second time in test_colab_ready.py's fresh environment")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *NBVAL, str(path)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    output = result.stdout[-4000:] + result.stderr[-2000:]
    assert result.returncode == 0, f"second execution of {path.name} differs:\n{output}"
