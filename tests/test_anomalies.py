"""Anomalies that are true: judged from what the student's own cells do, never from a word.

Static facts on chapter 9's real release (its Colab setup cell imports ``subprocess`` and
reads ``sys.modules``; its import cell imports vitlab's ``Pooling``): an honest submission
full of Colab habits has nothing to report, and each true anomaly is found however the
code reaches it. The check references' tripwires are armed in this process and disarmed
after. The kernel-running cases are in test_grading_attacks.py.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from conftest import ROOT
from vitlab_grader import anomalies as scan
from vitlab_grader.grade import NotebookResult
from vitlab_grader.report import feedback_html, feedback_markdown
from vitlab_grader.specs import check_spec

CHECK, FUNCTION = "pit_pooling_stage", "pit_pool_tokens"


@pytest.fixture(scope="module")
def chapter(tmp_path_factory: pytest.TempPathFactory) -> tuple[nbformat.NotebookNode, str]:
    """Chapter 9's student copy, as ``student`` writes it, and the instructor's solution of the exercise."""
    from vitlab_grader import make_student

    (copy,) = make_student([ROOT / "notebooks" / "09_pit.ipynb"], tmp_path_factory.mktemp("release"))
    instructor = nbformat.read(ROOT / "notebooks" / "09_pit.ipynb", as_version=4)
    solution = next(c.source for c in instructor.cells if "solution" in c.metadata.get("tags", []))
    return nbformat.read(copy.target, as_version=4), solution


def submit(chapter: tuple[nbformat.NotebookNode, str], answer: str | None = None, *extra: str) -> list[Any]:
    """The student copy with the exercise's stub replaced by ``answer`` (the solution if ``None``) and ``extra``
    cells added at the end; its code cells, as the grader reads them (check cells left out)."""
    release, solution = chapter
    notebook = nbformat.from_dict(release)
    stub = next(c for c in notebook.cells if "exercise" in c.metadata.get("tags", []))
    stub.source = solution if answer is None else answer
    notebook.cells += [new_code_cell(text) for text in extra]
    return [c for c in notebook.cells if c.cell_type == "code" and "check" not in c.metadata.get("tags", [])]


def judge(chapter: tuple[nbformat.NotebookNode, str], cells: list[Any]) -> dict[str, list[str]]:
    """What the grader notes about the cells: its anomalies, the check-internal names used, the copied names."""
    written = scan.student_cells(cells, chapter[0].cells)
    names = scan.names_of([c.source for c in cells])
    references = scan.reference_objects(check_spec(CHECK).reference, CHECK)
    return {
        "suspicious": scan.suspicious(written, names),
        "from_checks": scan.from_checks(written, names),
        "copied": scan.copied(written, names, FUNCTION, references),
    }


HABITS = [
    "!pip install -q einops timm\n!python -m pip install torchinfo\n!nvidia-smi\n!ls\n"
    "!wget -q https://example.org/flowers.zip\n!unzip -q flowers.zip",
    "from google.colab import drive\n\ndrive.mount('/content/drive')",
    "import sys\nfrom pathlib import Path\n\nimport numpy as np\nimport torch\n\n"
    "IN_COLAB = 'google.colab' in sys.modules\nroot = Path.home() / 'data' if not IN_COLAB else Path('~/data')\n"
    "cache = Path('~/.cache').expanduser()\nlabel = '~/data'.replace('~', 'home')\n"
    "tokens = torch.stack([torch.zeros(3), torch.ones(3)])\ngrid = np.stack([np.zeros(2), np.ones(2)])\n"
    "torch.save(tokens, 'tokens.pt')\ntorch.save(tokens, '/content/drive/MyDrive/tokens.pt')\n"
    "with open('notes.txt', 'w') as f:\n    f.write(str(root))",
    "pool = Pooling(4, 8, stride=2)  # trying vitlab's layer in a scratch cell, not in the answer\nprint(pool)",
]


@pytest.mark.parametrize("ids", [True, False])
def test_honest_work_with_colab_habits_and_the_setup_cell_has_nothing_to_report(chapter: Any, ids: bool) -> None:
    cells = submit(chapter, None, *HABITS)
    for cell in cells if not ids else []:  # saved without cell ids (nbformat 4.4): the release's cells by content
        cell.pop("id", None)
    setup = cells[0].source
    assert "import subprocess" in setup and "sys.modules" in setup  # the release's own: not the student's
    assert judge(chapter, cells) == {"suspicious": [], "from_checks": [], "copied": []}


CHAPTERS = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("name", CHAPTERS)
def test_every_chapters_own_solutions_handed_in_have_nothing_to_report(tmp_path: Path, name: str) -> None:
    """Each chapter's student copy with the instructor's solutions pasted into its stubs: no anomaly, no flag."""
    from vitlab_grader import make_student
    from vitlab_grader.release import read_release

    (copy,) = make_student([ROOT / "notebooks" / name], tmp_path)
    release = read_release([copy.target])[0]
    solutions = [c.source for c in nbformat.read(ROOT / "notebooks" / name, as_version=4).cells
                 if "solution" in c.metadata.get("tags", [])]  # fmt: skip
    notebook = nbformat.read(copy.target, as_version=4)
    stubs = [c for c in notebook.cells if "exercise" in c.metadata.get("tags", [])]
    for stub, solution in zip(stubs, solutions, strict=True):
        stub.source = solution
    cells = [c for c in notebook.cells if c.cell_type == "code" and "check" not in c.metadata.get("tags", [])]
    written = scan.student_cells(cells, release.notebook["cells"])
    names = scan.names_of([c.source for c in cells])
    assert scan.suspicious(written, names) == [] and scan.from_checks(written, names) == []
    for check in release.checks:
        references = scan.reference_objects(check_spec(check.check).reference, check.check)
        assert scan.copied(written, names, check.function, references) == [], check.check


@pytest.mark.parametrize(
    ("code", "found"),
    [
        ("from inspect import currentframe as here\n\ndef peek():\n    return here()", "inspect.currentframe"),
        ("import sys as s\n\nlocals_above = s._getframe(1)", "sys._getframe"),
        ("import inspect\n\nfor record in inspect.stack():\n    pass", "inspect.stack"),
        ("def up(frame):\n    return frame.f_back", ".f_back"),
    ],
)
def test_a_frame_walk_is_found_through_any_alias(chapter: Any, code: str, found: str) -> None:
    assert f"walks the call stack ({found})" in judge(chapter, submit(chapter, None, code))["suspicious"]


@pytest.mark.parametrize(
    "code",
    [
        "import importlib\n\nhidden = importlib.import_module('vitlab.che' + 'cks.pit')\nref = hidden._stage",
        "import importlib as il\n\nname = f\"vitlab.{'checks'}.pit\"\n"
        "ref = getattr(il.import_module(name), '_sta' + 'ge')",
        "ref = __import__('vitlab.checks.pit', fromlist=['x'])._stage",
        "ref = sys.modules['.'.join(['vitlab', 'checks', 'pit'])]._stage",
    ],
)
def test_a_check_reference_is_found_however_its_module_is_named(chapter: Any, code: str) -> None:
    assert "vitlab.checks.pit._stage" in judge(chapter, submit(chapter, None, code))["from_checks"]


def test_a_sys_modules_lookup_is_reported_but_a_membership_test_is_not(chapter: Any) -> None:
    found = judge(chapter, submit(chapter, None, "m = sys.modules.get('vitlab')"))["suspicious"]
    assert found == ["reads or changes sys.modules"]
    assert judge(chapter, submit(chapter, None, "print('vitlab' in sys.modules)"))["suspicious"] == []


def test_the_setup_cells_constructs_in_a_students_own_cell_are_reported(chapter: Any) -> None:
    own = "import subprocess\n\nsubprocess.run(['ls', '..'])"
    assert judge(chapter, submit(chapter, None, own))["suspicious"] == ["starts processes (subprocess.run)"]
    cells = submit(chapter)
    cells[0].source += "\nimport os\nos.system('cat ../*.ipynb')"  # the setup cell, edited: only the edit counts
    assert judge(chapter, cells)["suspicious"] == ["starts processes (os.system)"]


@pytest.mark.parametrize(
    "answer",
    [
        # vitlab's own class (imported by the release's own cell) submitted as the answer
        f"{FUNCTION} = Pooling",
        # ... or doing the answer's work, reached through a helper and a computed attribute
        f"""def layer(c):
    return getattr(vitlab.models.pit, 'Pool' + 'ing')(c, 2 * c, stride=2)


def {FUNCTION}(tokens, grid_size, conv_weight, conv_bias, fc_weight, fc_bias):
    pool = layer(tokens.shape[-1])
    pool.conv.weight.data, pool.conv.bias.data = conv_weight, conv_bias
    pool.fc.weight.data, pool.fc.bias.data = fc_weight, fc_bias
    return pool(tokens, grid_size)[0]""",
    ],
)
def test_vitlabs_own_class_as_the_answer_is_flagged(chapter: Any, answer: str) -> None:
    assert judge(chapter, submit(chapter, answer))["copied"] == ["vitlab.models.pit.Pooling"]


@pytest.mark.parametrize(
    ("code", "path"),
    [
        ("from pathlib import Path\n\n(Path.home() / '.ipython/profile_default/startup/0.py').write_text('x')",
         "~/.ipython/profile_default/startup/0.py"),
        ("target = '/etc/hosts'\nwith open(target, 'a') as f:\n    f.write('x')", "/etc/hosts"),
        ("import shutil\nimport os.path\n\nshutil.copy('a.pt', os.path.join('..', 'classmate.ipynb'))",
         "../classmate.ipynb"),
        ("torch.save({}, '/tmp/answers.pt')", "/tmp/answers.pt"),
    ],
)  # fmt: skip
def test_a_write_outside_the_folder_is_found(chapter: Any, code: str, path: str) -> None:
    assert judge(chapter, submit(chapter, None, code))["suspicious"] == [f"writes outside its folder ({path!r})"]


def test_a_write_into_the_graders_work_folder_is_found(chapter: Any) -> None:
    code = "import os\n\nos.remove('.vitlab-grader/references-called')"  # the tripwires' record
    found = judge(chapter, submit(chapter, None, code))["suspicious"]
    assert found == ["writes into the grader's work folder ('.vitlab-grader/references-called')"]


def test_a_shell_command_other_than_an_install_is_reported(chapter: Any) -> None:
    found = judge(chapter, submit(chapter, None, "!pip install -q timm\n!cat ../*.ipynb"))["suspicious"]
    assert found == ["runs a shell command (cat)"]


# ---------------------------------------------------------------- tripwires


@pytest.fixture(scope="module")
def cases() -> dict[str, Any]:
    """Cases as the grader writes them for the kernel, made before any wire is armed."""
    return {name: check_spec(name).cases for name in ("split_heads", "encoder_block")}


@pytest.fixture
def armed(tmp_path: Path, cases: dict[str, Any]) -> Iterator[Path]:
    """The tripwires armed in this process, recording into ``tmp_path``; every function restored after."""
    import vitlab.checks  # noqa: F401 - every check module

    saved = [
        (f, f.__code__, f.__defaults__, f.__kwdefaults__)
        for name, module in list(sys.modules.items())
        if name.startswith("vitlab.checks.") and module is not None
        for f in vars(module).values()
        if isinstance(f, types.FunctionType)
    ]
    (tmp_path / ".vitlab-grader").mkdir()
    try:
        exec(scan.arm_line(str(tmp_path)))  # noqa: S102 - the grader's own start-up line, as the kernel runs it
        yield tmp_path
    finally:
        for f, code, defaults, kwdefaults in saved:
            f.__code__, f.__defaults__, f.__kwdefaults__ = code, defaults, kwdefaults


def test_a_check_reference_reached_any_way_computes_nothing_and_is_recorded(armed: Path, cases: Any) -> None:
    import codecs
    import gc
    import importlib

    import torch

    from vitlab.checks._core import collect_answers

    name = codecs.decode("ivgyno.purpxf.nggragvba", "rot13")  # no string the code could read
    module = importlib.import_module(name)
    hidden = next(f for f in gc.get_referrers(module.__dict__) if getattr(f, "__name__", "") == "_reference")
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(RuntimeError, match="not available while the notebook is graded"):
        hidden(q, q, q)
    assert scan.read_tripped(armed) == ["vitlab.checks.attention._reference"]
    # the grader's cell's own machinery still works
    assert collect_answers(lambda x, num_heads: x, cases["split_heads"]).cases[0].error is None
    assert scan.read_tripped(armed) == ["vitlab.checks.attention._reference"]


def test_an_honest_answer_trips_no_wire(armed: Path, cases: Any) -> None:
    """The encoder block's cases hold a hand-made block (a class of vitlab.checks) whose parts an answer runs."""
    from vitlab.checks._core import collect_answers

    def block_answer(x: Any, block: Any) -> Any:
        x = x + block.attn(block.norm1(x))
        return x + block.mlp(block.norm2(x))

    answers = collect_answers(block_answer, cases["encoder_block"])
    assert all(a.error is None for a in answers.cases)
    assert scan.read_tripped(armed) == []


# ---------------------------------------------------------------- who reads them


def test_the_feedback_keeps_the_anomalies_for_the_instructor_unless_asked() -> None:
    from vitlab_grader.grade import ExerciseResult

    row = ExerciseResult("s.ipynb", CHECK, FUNCTION, "PASS", "ok", 2.0, 1.0, 2.0, "s", "vitlab.models.pit.Pooling")
    noted = ["the code walks the call stack", "the code writes outside its folder ('<img src=x onerror=alert(1)>')"]
    result = NotebookResult("s.ipynb", student="s", exercises=[row], anomalies=noted)
    for feedback in (feedback_markdown, feedback_html):
        assert "call stack" not in feedback(result) and "Pooling" not in feedback(result)
        shown = feedback(result, "student")
        assert "call stack" in shown and "Pooling" in shown.replace("\\", "")
        assert "onerror" in shown and "<img" not in shown  # shown, and escaped
    with pytest.raises(ValueError, match="'instructor' or 'student'"):
        feedback_markdown(result, "everyone")


def test_every_vitlab_answer_named_for_a_check_exists() -> None:
    # A renamed layer would silently stop the copied-answer flag of its check.
    import vitlab.checks

    for check, names in scan.ANSWERED_BY.items():
        assert check in vitlab.checks.__all__, check
        assert all(callable(scan.resolve_object(name)) for name in names), (check, names)


def test_undoing_a_tripwire_is_found(chapter: Any) -> None:
    code = "import importlib\n\nimportlib.reload(vitlab.checks.pit)\n"
    code += "vitlab.checks.pit._pool.__code__ = (lambda: 0).__code__"
    found = judge(chapter, submit(chapter, None, code))["suspicious"]
    assert "reloads a module (importlib.reload)" in found and "replaces a function's code (.__code__)" in found
