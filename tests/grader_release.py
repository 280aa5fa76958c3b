"""The fabricated course notebook of the grader's tests, its student copy's submissions and answers.

Used by tests/test_assignments.py and tests/test_gradescope.py (``from grader_release import
...``: pytest puts ``tests/`` on the path), so that no test module imports another. Two "implement
it" exercises on real checks (``t2t_token_count``, ``scaled_dot_product_attention``) and one
question; instructor-only text carries :data:`MARKER` in every hiding place.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

MARKER = "qzx_instructor_only_7f3a"  # must never reach a student

TOKEN_STUB = '''def token_count(size, kernel, stride, padding):
    """Tokens along one side after a soft split."""
    # YOUR CODE HERE
    raise NotImplementedError'''
TOKEN_RIGHT = '''def token_count(size, kernel, stride, padding):
    """Tokens along one side after a soft split."""
    return (size + 2 * padding - kernel) // stride + 1'''
TOKEN_PITFALL_9 = """def token_count(size, kernel, stride, padding):
    return (size + 2 * padding - kernel) / (kernel - stride) + 1"""
TOKEN_WRONG_AT_224 = """def token_count(size, kernel, stride, padding):
    return 0 if size == 224 else (size + 2 * padding - kernel) // stride + 1"""
TOKEN_SYNTAX_ERROR = """def token_count(size, kernel stride, padding):
    return 0"""
TOKEN_HANGS = """def token_count(size, kernel, stride, padding):
    import time

    while True:  # a hang that leaves the CPU to the other notebooks
        time.sleep(0.1)"""
ATTENTION_STUB = '''def attention(q, k, v, mask=None):
    """softmax(q k^T / sqrt(d)) v. Shape: q, k, v (B, h, N, d) -> (B, h, N, d)."""
    # YOUR CODE HERE
    raise NotImplementedError'''
ATTENTION_RIGHT = '''def attention(q, k, v, mask=None):
    """softmax(q k^T / sqrt(d)) v. Shape: q, k, v (B, h, N, d) -> (B, h, N, d)."""
    logits = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    return logits.softmax(dim=-1) @ v'''
ATTENTION_PITFALL_1 = """def attention(q, k, v, mask=None):
    logits = q @ k.transpose(-2, -1)
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    emb_size = q.shape[1] * q.shape[-1]
    return torch.softmax(logits, dim=-1) / emb_size**0.5 @ v"""


def instructor_notebook() -> nbformat.NotebookNode:
    """Two exercises and a question; instructor-only text carries MARKER in every hiding place."""
    secret = {"note": MARKER}
    cells = [
        new_code_cell(
            "import torch\n\nimport vitlab.checks",
            metadata={"tags": ["hide-input"], "collapsed": False, "scrolled": True, "execution": {"start": MARKER}},
            outputs=[nbformat.v4.new_output("stream", name="stdout", text=f"{MARKER}\n")],
            execution_count=1,
        ),
        new_markdown_cell(
            "## Exercises\n\nImplement `token_count(size, kernel, stride, padding)`.\n\n![grid](attachment:grid.png)",
            attachments={"grid.png": {"image/png": "aGVsbG8="}, "old.png": {"image/png": MARKER}},
        ),
        new_code_cell(TOKEN_STUB, metadata={"tags": ["exercise"]}),
        new_code_cell(
            TOKEN_RIGHT + f"  # {MARKER}",
            metadata={"tags": ["solution", "hide-input"], "jupyter": {"source_hidden": True}, "secret": secret},
            outputs=[nbformat.v4.new_output("stream", name="stdout", text=MARKER)],
            execution_count=3,
        ),
        new_code_cell("vitlab.checks.t2t_token_count(token_count);", metadata={"tags": ["check"]}),
        new_markdown_cell("Implement `attention(q, k, v, mask=None)`."),
        new_code_cell(ATTENTION_STUB, metadata={"tags": ["exercise"]}),
        new_code_cell(ATTENTION_RIGHT, metadata={"tags": ["solution", "hide-input"]}),
        new_code_cell(
            "vitlab.checks.scaled_dot_product_attention(attention);",
            metadata={"tags": ["check"], "vitlab": {"points": 2}, "secret": secret},
        ),
        new_markdown_cell("Why is the division floored?"),
        new_markdown_cell(
            f"```{{dropdown}} Answer\nA window that does not fit is not a token. {MARKER}\n```",
            metadata={"tags": ["answer"]},
            attachments={"answer.png": {"image/png": MARKER}},
        ),
        new_markdown_cell("## References"),
        new_code_cell('print("the end")'),
    ]
    notebook = new_notebook(cells=cells)
    notebook.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        "instructor": secret,
        "widgets": {"state": MARKER},
    }
    return notebook


def write(notebook: nbformat.NotebookNode, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, path)
    return path


def submission(student: Path, token: str, attention: str, path: Path) -> Path:
    """The student copy with the two stubs replaced by a student's answers.

    Every check cell stores a stale ``PASS`` from the student's own run: the grader must
    not believe it.
    """
    notebook = nbformat.read(student, as_version=4)
    stubs = [cell for cell in notebook.cells if "exercise" in cell.metadata.get("tags", [])]
    stubs[0].source, stubs[1].source = token, attention
    for cell in notebook.cells:
        if "check" in cell.metadata.get("tags", []):
            name = cell.source.split("(")[0].split(".")[-1]
            stale = f"PASS {name}: all 9 cases match the reference\n"
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=stale)]
    return write(notebook, path)
