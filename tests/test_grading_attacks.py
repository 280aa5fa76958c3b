"""Submissions that try to get a grade without the work: each scores its honest work and is reported.

A tiny release (two exercises: ``token_count``, 1 point, checked by ``t2t_token_count``;
``attention``, 2 points, checked by ``scaled_dot_product_attention``). Every attack
notebook answers ``token_count`` honestly and leaves ``attention`` a stub, so its honest
work is worth 1 point; then it attacks, one kind per notebook (the kinds of issue 19):

1. replace the check, its comparison, or the whole ``vitlab.checks`` module;
2. print a PASS line, or show the checks' data from a ``post_run_cell`` hook;
3. walk up the stack to the reference's answer;
4. edit points, add or duplicate check cells, delete or re-point one;
5. run another chapter's check;
6. submit vitlab's own function, by name or reached by a computed one (keeps its score, flagged);
7. read a classmate's notebook or the instructor's solutions, overwrite a classmate's
   file, start a detached process that outlives the kernel;
8. read the grader's environment;
9. call the check's private reference through a name no scan can read, or through ``sys.modules``
   (a tripwire in the kernel: it computes nothing, and the call is reported).

All of them are graded in one ``grade`` run with the release's secret (kernels are the slow
part: a few seconds each), beside a table of the public cases' outputs (what the hidden cases
are for). The in-place and float probes at the end need no kernel.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell

import vitlab.checks
from conftest import (
    ATTENTION,
    ATTENTION_RIGHT,
    ATTENTION_STUB,
    TOKEN,
    cell_of,
    honest,
    release_notebook,
)
from vitlab_grader import make_student
from vitlab_grader.__main__ import main

SECRET = "VITLAB_TEST_GRADER_SECRET"  # set in the grader's environment; no kernel may see it
PASS_LINE = "PASS scaled_dot_product_attention: all 5 cases match the reference"


def fill(text: str, paths: dict[str, Path]) -> str:
    """``text`` with ``{name}`` replaced by the path ``paths[name]``."""
    for name, path in paths.items():
        text = text.replace("{" + name + "}", str(path))
    return text


def before_last_check(*sources: str) -> Any:  # the grader runs a notebook up to its last check
    def change(notebook: nbformat.NotebookNode, paths: dict[str, Path]) -> None:
        at = cell_of(notebook, f"checks.{ATTENTION}(")
        notebook.cells[at:at] = [new_code_cell(fill(text, paths)) for text in sources]

    return change


def replace_stub(text: str) -> Any:
    def change(notebook: nbformat.NotebookNode, paths: dict[str, Path]) -> None:
        notebook.cells[cell_of(notebook, ATTENTION_STUB)].source = fill(text, paths)

    return change


def edit_points(notebook: nbformat.NotebookNode, paths: dict[str, Path]) -> None:
    notebook.cells[cell_of(notebook, f"checks.{TOKEN}(")].metadata["vitlab"] = {"points": 100}


def add_and_duplicate_checks(notebook: nbformat.NotebookNode, paths: dict[str, Path]) -> None:
    passing = notebook.cells[cell_of(notebook, f"checks.{TOKEN}(")]
    notebook.cells.append(nbformat.from_dict({**passing, "id": "copy-of-the-passing-check"}))
    notebook.cells.append(new_code_cell(f"vitlab.checks.{TOKEN}(token_count);", metadata={"tags": ["check"]}))
    notebook.cells.append(new_code_cell("print('extra')", metadata={"tags": ["check"], "vitlab": {"points": 50}}))


def delete_failing_check(notebook: nbformat.NotebookNode, paths: dict[str, Path]) -> None:
    del notebook.cells[cell_of(notebook, f"checks.{ATTENTION}(")]


def repoint_check(notebook: nbformat.NotebookNode, paths: dict[str, Path]) -> None:
    cell = notebook.cells[cell_of(notebook, f"checks.{ATTENTION}(")]
    cell.source = f"import vitlab.checks.attention\n\nvitlab.checks.{ATTENTION}(vitlab.checks.attention._reference);"


FAKE_RESULT = (
    "{'text/plain': '" + PASS_LINE + "', 'application/vnd.vitlab.check+json': {'version': 1, 'name': '" + ATTENTION
    + "', 'status': 'passed', 'message': '" + PASS_LINE + "', 'cases_passed': 5, 'cases_total': 5, 'fraction': 1.0}}"
)  # fmt: skip
STACK_WALK = """def attention(q, k, v, mask=None):
    import inspect

    frame = inspect.currentframe().f_back
    while frame is not None:  # any tensor shaped like the answer in a frame above: the reference's?
        for value in frame.f_locals.values():
            for item in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(item, type(q)) and item.shape == v.shape and not any(item is t for t in (q, k, v)):
                    return item
        frame = frame.f_back
    raise NotImplementedError"""
READ_OTHERS = """import json

def attention(q, k, v, mask=None):
    raise NotImplementedError

for path in ("{classmate}", "{instructor}"):  # a classmate's submission, the instructor's solutions
    try:
        cells = json.load(open(path))["cells"]
    except OSError:
        continue
    for cell in cells:
        text = "".join(cell["source"])
        if text.startswith("def attention") and "NotImplementedError" not in text:
            exec(text)"""
OVERWRITE = """import json

try:
    with open("{classmate}", "w") as f:  # the classmate's file, before it is graded
        f.write("overwritten")
except OSError:
    pass"""
DETACHED = """import subprocess, sys

code = "import time; time.sleep(4); open('{marker}', 'w').write('written after grading')"
subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"""
ENVIRONMENT = (
    "import os\n\n" + ATTENTION_RIGHT.replace("def attention(q, k, v, mask=None):",
    f"def attention(q, k, v, mask=None):\n    if not os.environ.get({SECRET!r}):\n        raise NotImplementedError")
)  # fmt: skip
COPIED = """from vitlab.layers.attention import explicit_attention

def attention(q, k, v, mask=None):
    return explicit_attention(q, k, v, scale=q.shape[-1] ** -0.5, mask=mask)[0]"""
# the same copy, reached by a name no scan can read, and the record of what ran turned off afterwards
COPIED_UNSEEN = """import codecs
import importlib
import sys

layers = importlib.import_module(codecs.decode("ivgyno.ynlref.nggragvba", "rot13"))


def attention(q, k, v, mask=None):
    out = getattr(layers, "explicit" + "_attention")(q, k, v, scale=q.shape[-1] ** -0.5, mask=mask)[0]
    sys.setprofile(None)
    return out"""
REFERENCE = "vitlab.checks.attention._reference"
COMPUTED_NAME = """import codecs
import importlib

hidden = importlib.import_module(codecs.decode("ivgyno.purpxf.nggragvba", "rot13"))  # no name to read
reference = getattr(hidden, codecs.decode("_ersrerapr", "rot13"))


def attention(q, k, v, mask=None):
    return reference(q, k, v, mask)"""
BY_SYS_MODULES = """import sys


def attention(q, k, v, mask=None):
    return sys.modules["vitlab.checks.attention"]._reference(q, k, v, mask)"""


def combine(*changes: Any) -> Any:
    def change(notebook: nbformat.NotebookNode, paths: dict[str, Path]) -> None:
        for one in changes:
            one(notebook, paths)

    return change


REPLACE_CHECK = f"import vitlab.checks\n\nvitlab.checks.{ATTENTION} = lambda fn: print({PASS_LINE!r})"
REPLACE_COMPARISON = (
    "import vitlab.checks._core as core\n\ncore.problem = lambda *args, **kwargs: None\n"
    "core.evaluate = lambda spec, answers: None"
)
FAKE_MODULE = (
    "import sys, types\n\nfake = types.ModuleType('vitlab.checks')\n"
    f"fake.{ATTENTION} = lambda fn: print({PASS_LINE!r})\nsys.modules['vitlab.checks'] = fake"
)
# breaks the grader's cell in the kernel: its exercise is not graded (never scored) and the code is reported
FAKE_HARNESS = "import sys, types\n\nsys.modules['vitlab_grader.harness'] = types.ModuleType('vitlab_grader.harness')"
HOOK = (
    "from IPython.display import display\n\n"
    f"get_ipython().events.register('post_run_cell', lambda result: display({FAKE_RESULT}, raw=True))"
)

# name: (change to the honest notebook, words every one of which the report must contain)
ATTACKS: dict[str, tuple[Any, list[str]]] = {
    "1_replace_the_checks": (
        before_last_check(REPLACE_CHECK, REPLACE_COMPARISON, FAKE_MODULE),
        [
            f"replaces vitlab.checks.{ATTENTION}",
            "replaces vitlab.checks._core.problem",
            "uses vitlab.checks._core.problem",
            "reads or changes sys.modules",
        ],
    ),  # fmt: skip
    "1_break_the_graders_cell": (before_last_check(FAKE_HARNESS), ["reads or changes sys.modules"]),
    "2_show_a_pass": (
        before_last_check(f"print({PASS_LINE!r})", HOOK),
        ["writes a check's result line", "registers an IPython event hook", "shows data of the checks' MIME type"],
    ),
    "3_stack_walk": (replace_stub(STACK_WALK), ["walks the call stack"]),
    "4_edit_add_duplicate_repoint": (
        combine(edit_points, add_and_duplicate_checks, repoint_check),
        [
            f"{TOKEN}: the check cell's metadata changed (points 100 instead of 1)",
            f"{TOKEN}: the check cell is duplicated",
            "extra check cell",
            f"{ATTENTION}: the check cell was edited",
        ],
    ),  # fmt: skip
    "4_delete_failing": (delete_failing_check, [f"{ATTENTION}: the check cell was deleted"]),
    "5_other_chapter": (
        before_last_check(
            "vitlab.checks.patchify(lambda images, p: images)", "vitlab.checks.split_heads(lambda x, h: x)"
        ),
        ["extra check cell", "calls vitlab.checks.patchify", "calls vitlab.checks.split_heads"],
    ),
    "7_at_grading_time": (
        before_last_check(READ_OTHERS, OVERWRITE, DETACHED),
        ["writes outside its folder", "starts processes (subprocess.Popen)"],
    ),
    "8_environment": (replace_stub(ENVIRONMENT), ["reads or sets the environment (os.environ.get)"]),
    "9_reference_by_computed_name": (replace_stub(COMPUTED_NAME), [f"the code called {REFERENCE}"]),
    "9_reference_by_sys_modules": (
        replace_stub(BY_SYS_MODULES),
        [f"the code called {REFERENCE}", "reads or changes sys.modules", f"uses {REFERENCE} (from vitlab.checks)"],
    ),
}


@pytest.fixture(scope="module")
def attacked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("attacks")
    instructor = root / "instructor" / "ch.ipynb"
    instructor.parent.mkdir()
    nbformat.write(release_notebook(), instructor)
    (copy,) = make_student([instructor], root / "release")
    subs = root / "subs"
    subs.mkdir()
    paths = {
        "classmate": subs / "classmate_ch.ipynb", "instructor": instructor,
        "marker": root / "detached-marker.txt", "gradebook": root / "gradebook.csv",
    }  # fmt: skip
    full = honest(copy.target)
    full.cells[cell_of(full, ATTENTION_STUB)].source = ATTENTION_RIGHT
    nbformat.write(full, paths["classmate"])
    copied = honest(copy.target)
    copied.cells[cell_of(copied, ATTENTION_STUB)].source = COPIED
    nbformat.write(copied, subs / "6_copied_ch.ipynb")
    copied.cells[cell_of(copied, COPIED)].source = COPIED_UNSEEN
    nbformat.write(copied, subs / "6_copied_unseen_ch.ipynb")
    private = honest(copy.target)
    steal = "from vitlab.checks.attention import _reference as attention"
    private.cells[cell_of(private, ATTENTION_STUB)].source = steal
    nbformat.write(private, subs / "6_private_reference_ch.ipynb")
    nbformat.write(honest(copy.target), subs / "honest_ch.ipynb")
    lookup = honest(copy.target)
    lookup.cells[cell_of(lookup, ATTENTION_STUB)].source = LOOKUP.format(table=public_outputs(ATTENTION))
    nbformat.write(lookup, subs / "lookup_ch.ipynb")
    for name, (change, _) in ATTACKS.items():
        notebook = honest(copy.target)
        change(notebook, paths)
        nbformat.write(notebook, subs / f"{name}_ch.ipynb")
    (root / "hidden.key").write_text(HIDDEN_SECRET.hex() + "\n", encoding="ascii")
    os.environ[SECRET] = "hunter2"
    out = root / "results.json"
    argv = ["grade", str(subs), "--release", str(root / "release"), "--out", str(root / "r.csv"), "--json", str(out)]
    argv += ["--gradebook", str(paths["gradebook"]), "--feedback", str(root / "feedback"), "--timeout", "60"]
    argv += ["--secret", str(root / "hidden.key")]
    stdout = io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout):
            assert main([*argv, "--jobs", "2", "--id-source", "file"]) == 0
    finally:
        del os.environ[SECRET]
    graded = time.monotonic()
    results = {Path(n["notebook"]).name.removesuffix("_ch.ipynb"): n for n in json.loads(out.read_text())["notebooks"]}
    with open(paths["gradebook"], newline="", encoding="utf-8") as handle:
        gradebook = {row["student_id"]: row for row in csv.DictReader(handle)}
    return {
        "results": results, "paths": paths, "gradebook": gradebook, "feedback": root / "feedback", "graded": graded,
    }  # fmt: skip


def report(result: dict[str, Any]) -> str:
    return " | ".join([*result["anomalies"], *result["flags"]])


@pytest.mark.slow
def test_the_honest_notebooks_score_their_work_with_nothing_to_report(attacked: dict[str, Any]) -> None:
    results = attacked["results"]
    assert (results["honest"]["score"], results["honest"]["max_score"]) == (1, 3)
    assert results["classmate"]["score"] == 3  # graded from what was read before any kernel ran
    for name in ("honest", "classmate"):
        assert results[name]["anomalies"] == [] and results[name]["flags"] == [], report(results[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_an_attack_scores_its_honest_work_and_is_reported(attacked: dict[str, Any], name: str) -> None:
    result = attacked["results"][name]
    if name.startswith("7_") and result["sandbox"] == "none":  # no OS sandbox on this machine
        assert "file isolation unavailable" in result["isolation"]
    elif name == "1_break_the_graders_cell":  # the exercise after it: not graded, so never a score
        token, attention = result["exercises"]
        assert (token["score"], attention["status"], attention["score"]) == (1, "ERROR", None), attention
        assert "the grader's cell raised AttributeError" in attention["message"], attention
    else:
        assert result["score"] == 1, (result["exercises"], report(result))
    assert result["max_score"] == 3  # the release's points, whatever the notebook says
    assert [e["exercise"] for e in result["exercises"]] == [TOKEN, ATTENTION]  # the release's exercises only
    for words in ATTACKS[name][1]:
        assert words in report(result), report(result)
    row = attacked["gradebook"][f"{name}_ch"]  # the id: the file name
    total = "" if name == "1_break_the_graders_cell" else "1"  # an ungraded exercise: no total, never a guess
    assert row["total"] == total or name.startswith("7_") and result["sandbox"] == "none"
    assert ATTACKS[name][1][0] in row["anomalies"]


@pytest.mark.slow
def test_a_copied_reference_keeps_its_score_and_is_flagged_by_name(attacked: dict[str, Any]) -> None:
    copied = attacked["results"]["6_copied"]
    assert copied["score"] == 3
    assert copied["flags"] == [f"{ATTENTION}: vitlab.layers.attention.explicit_attention"]
    private = attacked["results"]["6_private_reference"]
    assert private["score"] == 1  # the check's own reference is a tripwire in the kernel: it computes nothing
    assert f"the answer is vitlab's own {REFERENCE}" in private["flags"][0]
    assert f"uses {REFERENCE} (from vitlab.checks)" in private["anomalies"]
    assert any(a.startswith(f"the code called {REFERENCE}") for a in private["anomalies"]), report(private)
    feedback = (attacked["feedback"] / "6_copied_ch.md").read_text(encoding="utf-8")
    assert "Score: **3 / 3**" in feedback and "explicit" not in feedback  # the flag is the instructor's
    # no name to scan: the harness's record of the vitlab functions the answer ran flags it
    unseen = attacked["results"]["6_copied_unseen"]
    assert unseen["score"] == 3
    ran = "the answer ran vitlab's own vitlab.layers.attention.explicit_attention"
    assert unseen["flags"] == [f"{ATTENTION}: {ran}"], report(unseen)
    assert any("called sys.setprofile" in a for a in unseen["anomalies"]), report(unseen)


@pytest.mark.slow
def test_the_report_says_which_isolation_each_run_got(attacked: dict[str, Any]) -> None:
    for result in attacked["results"].values():
        assert result["sandbox"] in ("bubblewrap", "unshare", "none")
        assert (result["sandbox"] == "none") == result["isolation"].startswith("file isolation unavailable")


# ---------------------------------------------------------------- answers that slipped through (no kernel)


def block_adds_in_place(x: torch.Tensor, block: Any) -> torch.Tensor:
    x += block.attn(block.norm1(x))
    return x + block.mlp(block.norm2(x))


def attention_softmax_in_place(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any = None) -> torch.Tensor:
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    scores.sub_(scores.amax(-1, keepdim=True)).exp_()
    scores /= scores.sum(-1, keepdim=True)
    return scores @ v


def class_token_into_x(x: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, h: int) -> torch.Tensor:
    from einops import rearrange
    from torch.nn import functional as F

    q = rearrange(F.linear(x[:, :1], wq), "B n (h d) -> B h n d", h=h)
    k = rearrange(F.linear(x, wk), "B n (h d) -> B h n d", h=h)
    v = rearrange(F.linear(x, wv), "B n (h d) -> B h n d", h=h)
    out = ((q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5).softmax(-1) @ v
    x[:, :1] = rearrange(out, "B h n d -> B n (h d)")  # the new class token written into the input
    return x[:, :1]


def naive_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any = None) -> torch.Tensor:
    logits = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    e = logits.exp()
    return e / e.sum(-1, keepdim=True) @ v


@pytest.mark.parametrize(
    ("check", "fn", "words"),
    [
        ("encoder_block", block_adds_in_place, "changed its input `x` in place"),
        (ATTENTION, attention_softmax_in_place, "with gradients]: the backward pass raised RuntimeError"),
        ("class_attention", class_token_into_x, "changed its input `x` in place"),
        (ATTENTION, naive_softmax_attention, "large logits"),
    ],
)
def test_answers_that_change_inputs_in_place_or_overflow_fail(
    capsys: pytest.CaptureFixture[str], check: str, fn: Any, words: str
) -> None:
    result = getattr(vitlab.checks, check)(fn)
    line = capsys.readouterr().out.strip()
    assert not result and result.status == "failed" and words in line, line


def test_the_in_notebook_check_never_has_the_reference_on_the_stack(capsys: pytest.CaptureFixture[str]) -> None:
    namespace: dict[str, Any] = {}
    exec(STACK_WALK, namespace)  # noqa: S102 - the attack's own function, defined here
    result = vitlab.checks.scaled_dot_product_attention(namespace["attention"])
    assert result.status == "not implemented", capsys.readouterr().out


def test_an_answer_that_changes_its_inputs_fails_in_the_kernel_harness_too() -> None:
    """The grader's side: the harness's answers carry the inputs a function changed."""
    from vitlab.checks._core import collect_answers, evaluate
    from vitlab_grader.harness import decode, encode
    from vitlab_grader.specs import check_spec

    spec = check_spec("encoder_block")
    answers = decode(encode(collect_answers(block_adds_in_place, spec.cases)), len(spec.cases))
    result = evaluate(spec, answers)
    assert result.status == "failed" and "changed its input `x` in place" in result.message
    assert result.cases_passed == 0


def test_an_answer_that_cannot_travel_as_data_is_named_by_its_type() -> None:
    """A NumPy array comes back from the kernel as its type's name only; the message names it."""
    import numpy as np

    from vitlab.checks._core import collect_answers, evaluate
    from vitlab_grader.harness import decode, encode
    from vitlab_grader.specs import check_spec

    spec = check_spec("split_heads")
    answers = decode(encode(collect_answers(lambda x, num_heads: np.zeros(3), spec.cases)), len(spec.cases))
    result = evaluate(spec, answers)
    assert result.status == "failed" and result.message.endswith("expected a torch.Tensor, got ndarray")


def test_warmup_cosine_in_float32_passes() -> None:
    def float32_schedule(step: int, *, total_steps: int, warmup_steps: int, min_ratio: float = 0.0) -> float:
        s = torch.tensor(float(step))
        if step < warmup_steps:
            return float((s + 1) / warmup_steps)
        progress = torch.clamp((s - warmup_steps) / max(total_steps - warmup_steps, 1), max=1.0)
        return float(min_ratio + (1 - min_ratio) * 0.5 * (1 + torch.cos(torch.pi * progress)))

    with contextlib.redirect_stdout(io.StringIO()):
        assert vitlab.checks.warmup_cosine(float32_schedule)


def test_a_failing_number_shows_enough_digits_to_differ() -> None:
    from vitlab.checks._core import Expect, problem

    message = problem(0.00030458, 0.00030459, Expect(kind="number", rtol=1e-9, atol=0))
    assert message == "expected 0.00030459, got 0.00030458"
    tensor = problem(torch.tensor([1.0, 2.000001]), torch.tensor([1.0, 2.0]), Expect(rtol=0, atol=1e-9))
    assert tensor is not None and "(expected 2, got 2.000001)" in tensor


# ---------------------------------------------------------------- hidden cases (issue 28, item 3)

HIDDEN_SECRET = bytes(range(32))  # a release's secret (tests only)


def _inputs(case: Any) -> list[Any]:
    """A case's arguments, tensors as lists and modules as their parameters (to compare cases)."""

    def plain(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.tolist()
        if isinstance(x, torch.nn.Module):
            return [p.tolist() for p in x.parameters()]
        if isinstance(x, (tuple, list)):
            return [plain(v) for v in x]
        return x

    return plain([*case.args, *case.kwargs.values()])


@pytest.mark.parametrize("check", sorted(set(vitlab.checks.__all__) - {"CheckResult"}))
def test_every_check_has_hidden_cases_of_its_kinds_that_the_reference_passes(check: str) -> None:
    from vitlab.checks._core import collect_answers, evaluate
    from vitlab_grader.release import hidden_spec
    from vitlab_grader.specs import check_spec

    public, hidden = check_spec(check), hidden_spec(check, HIDDEN_SECRET)
    assert hidden.expect == public.expect and hidden.name == public.name
    seen = [_inputs(c) for c in public.cases]
    assert not any(_inputs(c) in seen for c in hidden.cases), "a hidden case is a public one"
    kinds = {tuple(type(a).__name__ for a in c.args) for c in public.cases}
    assert {tuple(type(a).__name__ for a in c.args) for c in hidden.cases} <= kinds
    assert abs(len(hidden.cases) - len(public.cases)) <= len(public.cases) // 2 and hidden.cases
    assert evaluate(hidden, collect_answers(hidden.reference, hidden.cases)).passed
    again, other = hidden_spec(check, HIDDEN_SECRET), hidden_spec(check, bytes(32))
    assert [_inputs(c) for c in again.cases] == [_inputs(c) for c in hidden.cases]  # per release: the same
    assert [_inputs(c) for c in other.cases] != [_inputs(c) for c in hidden.cases]  # another secret: others


def public_table(check: str) -> Any:
    """A student's function that returns the reference's outputs of the public cases, computed at home and
    keyed on the inputs' hash, and ``None`` for any other input."""
    import hashlib

    from vitlab.checks._core import _call
    from vitlab_grader.specs import check_spec

    def key(args: Any) -> str:
        return hashlib.sha256(repr(_inputs(type("C", (), {"args": args, "kwargs": {}}))).encode()).hexdigest()

    spec = check_spec(check)
    table = {key((*c.args, *c.kwargs.values())): _call(spec.reference, c) for c in spec.cases}

    def lookup(*args: Any, **kwargs: Any) -> Any:
        found = table.get(key((*args, *kwargs.values())))
        tensors = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
        return found + 0 * tensors[0].sum() if found is not None and tensors else found  # a gradient reaches it

    return lookup


@pytest.mark.parametrize("check", [TOKEN, ATTENTION])
def test_a_table_of_the_public_outputs_scores_the_public_cases_only(check: str) -> None:
    from vitlab.checks._core import collect_answers
    from vitlab_grader.grade import _HIDDEN_ONLY, _Run, _verdict
    from vitlab_grader.release import hidden_spec
    from vitlab_grader.specs import check_spec

    public, hidden = check_spec(check), hidden_spec(check, HIDDEN_SECRET)
    cases = [*public.cases, *hidden.cases]
    fraction = len(public.cases) / len(cases)

    def verdict(fn: Any, secret_cases: Any = hidden) -> tuple[str, str, float | None, str]:
        answers = collect_answers(fn, cases if secret_cases else public.cases)
        return _verdict(public, answers, _Run(finished={0}), 0, {}, str, secret_cases)

    status, message, got, _ = verdict(public_table(check))
    assert (status, got) == ("FAIL", pytest.approx(fraction)) and _HIDDEN_ONLY in message, message
    assert not any(c.label in message for c in hidden.cases), "a hidden case is shown"
    assert verdict(public_table(check), None)[:3:2] == ("PASS", 1.0)  # without the secret: full marks
    status, message, got, _ = verdict(public.reference)
    assert (status, got) == ("PASS", 1.0) and f"{len(hidden.cases)} hidden cases" in message
    wrong = {TOKEN: lambda n, k, s, p: (n + 2 * p - k) // (k - s) + 1, ATTENTION: lambda q, k, v, mask=None: v}
    status, message, got, _ = verdict(wrong[check])
    assert status == "FAIL" and "hidden cases failed too" in message and got is not None and got < fraction


LOOKUP = """import hashlib

import torch

TABLE = {table!r}  # the reference's outputs of the public cases, computed at home


def attention(q, k, v, mask=None):
    key = hashlib.sha256(repr([q.tolist(), k.tolist(), v.tolist()]
                              + ([] if mask is None else [mask.tolist()])).encode()).hexdigest()
    return v[..., :1] * 0 + torch.tensor(TABLE[key]) if key in TABLE else v  # a gradient reaches v
"""


def public_outputs(check: str) -> dict[str, Any]:
    """The reference's outputs of ``check``'s public cases as lists, keyed as ``LOOKUP`` keys them."""
    import hashlib

    from vitlab.checks._core import _call
    from vitlab_grader.specs import check_spec

    spec = check_spec(check)
    return {
        hashlib.sha256(repr(_inputs(c)).encode()).hexdigest(): _call(spec.reference, c).tolist() for c in spec.cases
    }


@pytest.mark.slow
def test_a_lookup_table_graded_with_the_secret_gets_the_public_points_and_is_reported(attacked: dict[str, Any]) -> None:
    hidden = attacked["results"]["lookup"]  # public cases alone: full marks (above)
    token, attention = hidden["exercises"]
    assert (hidden["score"], attention["status"], attention["fraction"]) == (2, "FAIL", 0.5), attention["message"]
    assert "5 of 5 hidden cases do not" in attention["message"]
    assert any(
        a.startswith(f"{ATTENTION}: every public case passes, but hidden cases fail") for a in hidden["anomalies"]
    )
    assert token["status"] == "PASS" and token["fraction"] == 1  # honest work: all cases


@pytest.mark.slow
def test_nothing_outlives_the_grading_and_no_file_outside_the_folder_changes(attacked: dict[str, Any]) -> None:
    """Last in the file: the tests above run while the detached process (4 s of sleep) would still be alive."""
    time.sleep(max(0.0, attacked["graded"] + 5 - time.monotonic()))  # by now it would have written its marker
    paths = attacked["paths"]
    assert not paths["marker"].exists(), "a process the kernel started ran after grading"
    if attacked["results"]["7_at_grading_time"]["sandbox"] != "none":
        assert paths["classmate"].read_text(encoding="utf-8").startswith("{")  # the sandbox cannot write there
