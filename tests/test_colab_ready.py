"""Colab readiness: every chapter's setup cell, and the install path it relies on.

The setup cell (first cell of every notebook) installs ``vitlab`` from the repository set
in ``_config.yml``, only on Colab, and leaves Colab's preinstalled torch alone.
test_repository.py checks that the cell is there and stores no output; this file checks
what it does, and proves the path end to end: ``vitlab`` built as a wheel and installed into a
fresh virtual environment that holds only a stand-in for Colab's torch, with what the setup
cell installs on Colab (the wheel in place of the repository), builds and runs every family.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import types
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, fresh_environment_skip_reason

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# Colab ships torch preinstalled and the setup cell never reinstalls it. We stand in for it
# with a CPU build that pip finds on this machine's disk (a plain `torch` would pull a
# multi-GB CUDA build). PyPI's torchvision 0.28.0, the one release made for torch 2.13, is
# built against the CUDA torch and does not import beside the CPU build ("operator
# torchvision::nms does not exist"), hence chapters without torchvision. For a pair that
# imports, set e.g. VITLAB_COLAB_TORCH="torch==2.14.1 torchvision==0.29.1" (5 GB, slower).
COLAB_TORCH = os.environ.get("VITLAB_COLAB_TORCH", "torch==2.13.0").split()
# Install flags that would replace Colab's torch, or a requirement naming it.
REINSTALL_FLAGS = {"-U", "--upgrade", "--force-reinstall", "--ignore-installed", "-I"}
TORCH_PACKAGES = {"torch", "torchvision", "torchaudio"}
# What the fresh environment runs: where vitlab comes from, every family's tiny model on a batch
# of digits-sized images, and one exercise check (its PASS line).
SMOKE = """
import torch, vitlab, vitlab.checks, vitlab.layers
from vitlab.family import FAMILIES, tiny_model
print(vitlab.__file__)
for family in FAMILIES:
    logits = tiny_model(family).eval()(torch.randn(2, 1, 32, 32))
    assert logits.shape == (2, 10), (family, logits.shape)
vitlab.checks.patchify(vitlab.layers.patchify)
"""


def setup_cell(path: Path) -> str:
    return "".join(json.loads(path.read_text(encoding="utf-8"))["cells"][0]["source"])


def repository_requirement() -> str:
    """``vitlab @ git+<url>@<branch>`` from _config.yml's ``repository`` section."""
    repository = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    return f"vitlab @ git+{repository['url']}@{repository['branch']}"


def run_cell(
    code: str, monkeypatch: pytest.MonkeyPatch, on_colab: bool, downloads: list | None = None
) -> list[tuple[list, dict]]:
    """Execute a setup cell with ``subprocess.run`` (returned) and ``urllib.request.urlretrieve``
    (appended to ``downloads`` as ``(url, filename)``) recorded, not run."""
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: calls.append((list(args[0]), kwargs)))
    sink = [] if downloads is None else downloads
    monkeypatch.setattr(urllib.request, "urlretrieve", lambda url, filename: sink.append((url, filename)))
    if on_colab:
        monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(compile(code, "<setup cell>", "exec"), {})
    return calls


def requirement_name(spec: str) -> str:
    return re.split(r"[\s<>=!~;@\[]", spec, maxsplit=1)[0].lower()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_setup_cell_does_nothing_outside_colab(path: Path, monkeypatch: pytest.MonkeyPatch, capfd) -> None:
    calls = run_cell(setup_cell(path), monkeypatch, on_colab=False)
    assert calls == [], "the setup cell runs a command outside Colab"
    assert capfd.readouterr() == ("", ""), "the setup cell prints outside Colab"
    guarded = ast.parse(setup_cell(path)).body
    loose = [type(node).__name__ for node in guarded if not isinstance(node, (ast.Import, ast.If))]
    assert not loose, f"statements outside the Colab guard: {loose}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_setup_cell_on_colab_installs_vitlab_from_the_configured_repository(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = run_cell(setup_cell(path), monkeypatch, on_colab=True)
    assert len(calls) == 1, f"expected one pip call on Colab, got {len(calls)}"
    command, kwargs = calls[0]
    assert command[:4] == [sys.executable, "-m", "pip", "install"], f"not `python -m pip install`: {command[:4]}"
    assert kwargs.get("check") is True, "a failed install must stop the notebook (check=True)"
    assert repository_requirement() in command, (
        f"the cell must install {repository_requirement()!r} (_config.yml's repository url and branch)"
    )
    flags = REINSTALL_FLAGS.intersection(command[4:])
    torch_specs = [spec for spec in command[4:] if requirement_name(spec) in TORCH_PACKAGES]
    assert not flags and not torch_specs, f"the cell would reinstall Colab's torch: {sorted(flags) + torch_specs}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_setup_cell_on_colab_downloads_the_files_the_chapter_reads(
    path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Colab opens the notebook alone: each ``data/`` file its code names comes from the repository."""
    monkeypatch.chdir(tmp_path)  # the cell makes data/ in the working folder, as in Colab's /content
    downloads: list = []
    run_cell(setup_cell(path), monkeypatch, on_colab=True, downloads=downloads)
    read = sorted(set(re.findall(r"[\"'](data/[\w.]+)[\"']", path.read_text(encoding="utf-8").replace('\\"', '"'))))
    repository = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    raw = repository["url"].replace("https://github.com/", "https://raw.githubusercontent.com/")
    expected = [(f"{raw}/{repository['branch']}/notebooks/{name}", name) for name in read]
    assert sorted(downloads) == expected, f"the setup cell downloads {downloads}, the chapter reads {read}"
    assert all((ROOT / "notebooks" / name).is_file() for name in read), "a file the chapter reads is not in data/"
    assert (tmp_path / "data").is_dir() or not read


def test_vitlab_accepts_any_recent_torch() -> None:
    # pip keeps an installed torch that satisfies vitlab's requirement: only a lower bound
    # on torch lets Colab's preinstalled torch satisfy it whatever its version.
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_specs = [d for d in dependencies if requirement_name(d) in TORCH_PACKAGES]
    assert torch_specs and all(re.fullmatch(r"torch\s*>=\s*[\d.]+", d) for d in torch_specs), (
        f"vitlab's torch requirement must be a lower bound only, got {torch_specs}"
    )


# ---------------------------------------------------------------- the fresh environment


def run(command: list, timeout: int, **kwargs) -> str:
    """Run ``command``; on failure, fail with its output's tail. Returns stdout."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    if result.returncode:
        tail = (result.stdout + result.stderr)[-4000:]
        pytest.fail(f"`{' '.join(map(str, command))}` exited {result.returncode}:\n{tail}", pytrace=False)
    return result.stdout


@pytest.mark.slow
def test_wheel_runs_chapters_in_a_fresh_environment(tmp_path: Path) -> None:
    reason = fresh_environment_skip_reason()
    if reason:  # never on CI: there the test runs, and fails if it cannot
        pytest.skip(reason)
    # What `pip install git+<repository>` builds on Colab: a wheel, in an isolated build.
    source = tmp_path / "src"
    shutil.copytree(ROOT / "vitlab", source / "vitlab", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "setup.cfg", "setup.py"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, source / name)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", tmp_path / "dist", source], timeout=600)
    wheel = next((tmp_path / "dist").glob("vitlab-*.whl"))

    # A fresh environment from the base interpreter: nothing of the dev environment leaks in.
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}
    env["PYTHONNOUSERSITE"] = "1"
    try:
        run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", venv], timeout=300)
        pip = [python, "-m", "pip", "install", "--no-compile", "--progress-bar", "off"]
        run(pip + COLAB_TORCH, timeout=1200, env=env)  # "Colab's preinstalled torch"
        versions = "import importlib.metadata as m, sys; print(*(f'{n}=={m.version(n)}' for n in sys.argv[1:]))"
        preinstalled = run([python, "-c", versions, *map(requirement_name, COLAB_TORCH)], 60, env=env).split()
        (tmp_path / "constraints.txt").write_text("\n".join(preinstalled) + "\n")

        # What the setup cell installs on Colab, the wheel standing in for the repository.
        with pytest.MonkeyPatch.context() as patch:
            ((command, _),) = run_cell(setup_cell(NOTEBOOKS[0]), patch, on_colab=True)
        cell = [str(wheel) if arg == repository_requirement() else arg for arg in command[4:] if arg != "-q"]
        assert str(wheel) in cell, cell
        run(pip + ["-c", tmp_path / "constraints.txt", *cell], timeout=1200, env=env)
        after = run([python, "-c", versions, *map(requirement_name, COLAB_TORCH)], 60, env=env).split()
        assert after == preinstalled, f"the install replaced the preinstalled {preinstalled} by {after}"

        # Every notebook runs once per `make test` (nbval, in the dev environment); here the
        # installed wheel builds every family and runs a check, which is what a chapter does.
        where = tmp_path / "elsewhere"  # no vitlab/ folder here: imports resolve to the wheel
        where.mkdir()
        out = run([python, "-c", SMOKE], 600, env=env, cwd=where)
        assert out.splitlines()[0].startswith(str(venv)), f"vitlab imported from {out.splitlines()[0]}, not the wheel"
        assert "PASS patchify" in out, out
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # 1.6 GB; pytest keeps the last three tmp folders
