"""Shared test helpers. Test modules import them from here (``from conftest import ...``),
never from each other.

- the repository: ``ROOT``, ``toc_files``, ``output_text`` and
  ``fresh_environment_skip_reason`` (the fresh-environment test of test_colab_ready.py);
- models: random images, perturbed weights, reference models and a logits comparison,
  parameter counts on the meta device;
- a fabricated Hugging Face cache (``write_snapshot``, ``add_timm_repo``);
- the checks of ``vitlab.checks``: ``run``, ``assert_passes``, ``assert_named_mistake``.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

import nbformat
import pytest
import torch
import yaml
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

import vitlab
import vitlab.checks as checks
from vitlab.checks import CheckResult

ROOT = Path(__file__).resolve().parents[1]


# Under pytest-xdist (`make test`: -n 2 --dist loadgroup) each test goes to whichever worker
# is free, except these files, whose tests share one worker, one after the other: the book's
# tests (one build of the book for both: book_build.py), and the tests that start Jupyter
# kernels with timeouts (the grader and its sandbox), so that two of them never compete for
# the same two cores; test_assignments.py's kernels mostly wait on hanging cells, so that file
# is a group of its own, beside the others. Each notebook (nbval: its cells run in order in one
# kernel) is a group too.
XDIST_GROUPS = {
    "test_book.py": "book",
    "test_browser.py": "book",
    "test_quiz.py": "book",
    "test_browser_explorer.py": "book",
    "test_assignments.py": "kernels-waiting",
    "test_grading_attacks.py": "kernels",
    "test_isolation.py": "kernels",
    "test_grade_robustness.py": "kernels",
    "test_gradescope.py": "kernels",
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slow: left out of `make test-fast`: the book, the browser, notebook runs, the grader's kernels,"
        " and tests of more than ~5 s of CPU time (the reference logits of every preset: one per family stays)",
    )
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Two workers on two cores: one torch thread each instead of two threads each
        # fighting over both cores, and so for the notebook kernels and subprocesses they
        # start (OMP_NUM_THREADS): a waiting OpenMP thread spins, so two threads per kernel
        # beside the other worker cost CPU for nothing. Every notebook under `-n 2` here:
        # 170 s with torch's default of two threads, 111 s with one; the same outputs.
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


def xdist_scope(nodeid: str) -> str:
    """The work unit of a test under `--dist loadgroup`: its group (``XDIST_GROUPS``), its
    notebook (nbval), or the test alone."""
    path = nodeid.split("::", 1)[0]
    group = XDIST_GROUPS.get(path.rsplit("/", 1)[-1])
    if group is not None:
        return group
    return path if path.endswith(".ipynb") else nodeid


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: no error where xdist is missing
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup`, with the groups named here by file instead of by ``xdist_group``
    marks: pytest-xdist 3.8 passes a mark's group to the scheduler by editing the node id,
    which pytest 9.2 no longer allows, so marked tests were spread like any other
    (pytest-xdist issue #1386). Any other ``--dist`` keeps pytest-xdist's scheduler."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling  # a dev requirement; only imported under xdist

    class FileGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return FileGroupScheduling(config, log)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


# ---------------------------------------------------------------- the repository


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


def output_text(output: dict) -> str:
    """The text of one stored notebook output (stream, error traceback or text/plain)."""
    if output["output_type"] == "stream":
        return "".join(output["text"])
    if output["output_type"] == "error":
        return "\n".join(output["traceback"])
    return "".join(output.get("data", {}).get("text/plain", ""))


def index_unreachable() -> str | None:
    """Why pip cannot reach its package index, or None when it can."""
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple/")
    try:
        urllib.request.urlopen(urllib.request.Request(index, method="HEAD"), timeout=10).close()
    except OSError as error:
        return f"no package index ({index}: {error})"
    return None


def fresh_environment_skip_reason() -> str | None:
    """Why the fresh-environment test is skipped, or None when it runs. On CI it always runs."""
    return None if os.environ.get("CI", "").lower() in {"1", "true", "yes"} else index_unreachable()


# ---------------------------------------------------------------- models


def random_images(batch: int = 2, size: int | tuple[int, int] = 224, channels: int = 3, seed: int = 0) -> torch.Tensor:
    """Deterministic N(0, 1) images. Shape: (batch, channels, H, W)."""
    h, w = (size, size) if isinstance(size, int) else size
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, channels, h, w, generator=generator)


@torch.no_grad()
def perturb_(module: torch.nn.Module, seed: int = 0, std: float = 0.02) -> torch.nn.Module:
    """Add noise to every parameter and BatchNorm statistic, in place.

    Random inits hide conversion bugs: zero biases, LayerScale at 1e-5 and fresh
    BatchNorm statistics make a swapped or dropped tensor invisible in the logits.
    """
    generator = torch.Generator().manual_seed(seed)
    for param in module.parameters():
        param.add_(torch.randn(param.shape, generator=generator) * std)
    for sub in module.modules():
        if isinstance(sub, torch.nn.modules.batchnorm._BatchNorm) and sub.running_mean is not None:
            sub.running_mean.add_(torch.randn(sub.running_mean.shape, generator=generator) * 0.1)
            sub.running_var.mul_(0.5 + torch.rand(sub.running_var.shape, generator=generator))
    return module


def count_on_meta(name: str, **overrides) -> int:
    """Parameter count of a preset built on the meta device (shapes only: no memory, instant)."""
    with torch.device("meta"):
        return vitlab.count_parameters(vitlab.create_model(name, **overrides))


def require_reference(module: str) -> ModuleType:
    """Import a reference implementation (``timm``, ``transformers``): skip the test where it
    is missing, or fail with ``VITLAB_REQUIRE_REFERENCES=1`` (CI), so that the reference
    comparisons cannot silently stop running."""
    if os.environ.get("VITLAB_REQUIRE_REFERENCES") == "1":
        return importlib.import_module(module)
    return pytest.importorskip(module)


def timm_model(name: str, perturb: bool = True, **kwargs) -> torch.nn.Module:
    """A randomly initialised timm model (no download), in eval mode.

    With ``perturb`` (the default) every parameter and BatchNorm statistic is moved off
    its initial value, so that a weight-conversion test can fail.
    """
    timm = require_reference("timm")
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **kwargs).eval()
    return perturb_(model) if perturb else model


def load_reference(name: str, reference: torch.nn.Module, source: str = "timm", **overrides) -> torch.nn.Module:
    """A vitlab model carrying ``reference``'s weights (strict load), in eval mode."""
    model = vitlab.create_model(name, **overrides).eval()
    state_dict = vitlab.convert_state_dict(name, reference.state_dict(), source)
    model.load_state_dict(state_dict, strict=True)
    return model


def assert_same_logits(
    model: torch.nn.Module, reference: torch.nn.Module, images: torch.Tensor, atol: float = 1e-4
) -> None:
    """Both models in eval mode, fp32, CPU: the same logits within ``atol``."""
    with torch.no_grad():
        expected = reference(images)
        got = model(images)
    if hasattr(expected, "logits"):  # HuggingFace output object
        expected = expected.logits
    assert got.shape == expected.shape, f"shape {tuple(got.shape)} vs reference {tuple(expected.shape)}"
    torch.testing.assert_close(got, expected, atol=atol, rtol=0)


# ---------------------------------------------------------------- a fabricated Hugging Face cache

COMMIT = hashlib.sha1(b"vitlab fabricated snapshot").hexdigest()  # any 40-hex commit id


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def write_snapshot(hub_cache: Path, repo_id: str, files: dict[str, Path]) -> Path:
    """Put ``files`` (name in the repo -> file on disk) in ``hub_cache`` as huggingface_hub does.

    Large (LFS) files are stored under their sha256, small ones under their git blob sha1;
    the snapshot holds relative symlinks to the blobs. Returns the snapshot folder.
    """
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, path in files.items():
        data = path.read_bytes()
        is_lfs = name.endswith((".safetensors", ".bin"))
        blob = hashlib.sha256(data).hexdigest() if is_lfs else _git_blob_sha1(data)
        (repo / "blobs" / blob).write_bytes(data)
        (snapshot / name).symlink_to(Path("..", "..", "blobs", blob))
    return snapshot


def add_timm_repo(hub_cache: Path, name: str, work: Path) -> torch.nn.Module:
    """The repository of timm's default pretrained tag of ``name``, with perturbed random weights.

    Written by timm's own ``save_for_hf`` (``config.json`` + ``model.safetensors``, the
    files of the ``timm/...`` repositories), plus a README. Returns the saved model.
    """
    timm = require_reference("timm")
    cfg = timm.models.get_pretrained_cfg(name)
    torch.manual_seed(0)
    model = perturb_(timm.create_model(name, pretrained=False)).eval()
    out = work / cfg.hf_hub_id.replace("/", "--")
    timm.models.save_for_hf(model, str(out), safe_serialization=True)
    (out / "README.md").write_text(f"---\ntags:\n- timm\n---\n# {cfg.hf_hub_id} (fabricated for a test)\n")
    write_snapshot(hub_cache, cfg.hf_hub_id, {p.name: p for p in out.iterdir()})
    return model


# ---------------------------------------------------------------- vitlab.checks


def run(capsys: pytest.CaptureFixture[str], name: str, fn: Any) -> tuple[CheckResult, str]:
    """Run the check ``name`` on ``fn``; return its result and the one line it printed."""
    result = getattr(checks, name)(fn)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.endswith("\n"), f"expected exactly one line, got {out!r}"
    assert isinstance(result, CheckResult) and result.message == out.rstrip("\n")
    return result, out.rstrip("\n")


def assert_passes(capsys: pytest.CaptureFixture[str], name: str, fn: Any) -> None:
    """A right answer: a passed result, no case or pitfall, and a PASS line without floats
    (the same on every device)."""
    result, line = run(capsys, name, fn)
    assert result and result.passed and result.status == "passed"
    assert re.fullmatch(rf"PASS {name}: all \d+ cases match the reference( \(.+\))?", line), line
    assert result.fraction == 1.0
    assert result.case is None and result.pitfall is None


def assert_named_mistake(
    capsys: pytest.CaptureFixture[str], name: str, fn: Any, words: str, pitfall: int | None = None
) -> None:
    """A known wrong answer: a failed result whose line names the case, then the pitfall
    (``Pitfall n: ``) or ``a known mistake: ``, and contains ``words``."""
    result, line = run(capsys, name, fn)
    assert not result and result.status == "failed"
    assert line.startswith(f"FAIL {name} [case ")
    tag = f"Pitfall {pitfall}: " if pitfall is not None else "a known mistake: "
    assert tag in line and words in line, line
    assert result.pitfall == pitfall and result.case is not None and f"{result.case}]: {tag}" in line


# ---------------------------------------------------------------- a tiny release for the grader's tests
# Two exercises: ``token_count`` (1 point, checked by ``t2t_token_count``) and ``attention``
# (2 points, ``scaled_dot_product_attention``); test_grading_attacks.py and
# test_grade_robustness.py grade crafted submissions of it beside honest ones.

TOKEN, ATTENTION = "t2t_token_count", "scaled_dot_product_attention"
TOKEN_STUB = "def token_count(size, kernel, stride, padding):\n    raise NotImplementedError"
TOKEN_RIGHT = "def token_count(size, kernel, stride, padding):\n    return (size + 2 * padding - kernel) // stride + 1"
ATTENTION_STUB = "def attention(q, k, v, mask=None):\n    raise NotImplementedError"
ATTENTION_RIGHT = """def attention(q, k, v, mask=None):
    logits = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    return logits.softmax(dim=-1) @ v"""


def release_notebook() -> nbformat.NotebookNode:
    cells = [
        new_code_cell("import torch\n\nimport vitlab.checks"),
        new_markdown_cell("## Exercises\n\nImplement `token_count`."),
        new_code_cell(TOKEN_STUB, metadata={"tags": ["exercise"]}),
        new_code_cell(TOKEN_RIGHT, metadata={"tags": ["solution"]}),
        new_code_cell(f"vitlab.checks.{TOKEN}(token_count);", metadata={"tags": ["check"]}),
        new_markdown_cell("Implement `attention`."),
        new_code_cell(ATTENTION_STUB, metadata={"tags": ["exercise"]}),
        new_code_cell(ATTENTION_RIGHT, metadata={"tags": ["solution"]}),
        new_code_cell(f"vitlab.checks.{ATTENTION}(attention);", metadata={"tags": ["check"], "vitlab": {"points": 2}}),
    ]
    notebook = new_notebook(cells=cells)
    notebook.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    return notebook


def honest(release: Path) -> nbformat.NotebookNode:
    """The student copy with ``token_count`` answered and ``attention`` left a stub: 1 point of work."""
    notebook = nbformat.read(release, as_version=4)
    stub = next(c for c in notebook.cells if c.source == TOKEN_STUB)
    stub.source = TOKEN_RIGHT
    return notebook


def cell_of(notebook: nbformat.NotebookNode, text: str) -> int:
    return next(i for i, c in enumerate(notebook.cells) if text in c.source)
