"""The machinery every exercise check shares.

A check runs the student's function on a few fixed, seeded cases (CPU tensors) and
compares each answer with the reference. It runs every case (the fraction that match is
the partial credit a grader gives) and reports the first case that differs. Before it
reports the difference it compares the answer with the *known wrong answers* (the
course's pitfalls and other classic slips); an answer that matches one is named in words.

It prints exactly one line and returns a :class:`CheckResult`, truthy only when passed:

* ``PASS name: all 4 cases match the reference``
* ``FAIL name [case 2/4: ...]: what differs``
* ``TODO name: not implemented yet``

A check never raises because of the student's code: a wrong answer, a crash, or
``NotImplementedError`` become a failed result, so a notebook keeps running. Printing is
the point of these functions (they are the output of a notebook cell); the rest of
``vitlab`` never prints.

Results as data: when the environment variable ``VITLAB_CHECK_DATA`` is ``1`` (the
grader, ``python -m vitlab.assignments grade``, sets it for the kernels it starts) and
the check runs in IPython, the line is shown as display data instead of printed: the
same line as ``text/plain`` next to :meth:`CheckResult.to_dict` as
``application/vnd.vitlab.check+json`` (:data:`DATA_MIME`). Without it a check prints
to stdout, so the outputs stored in the course notebooks stay as they are (nbval
compares a stdout stream and a ``text/plain`` display as different outputs).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

Status = Literal["passed", "failed", "not implemented"]

DATA_MIME = "application/vnd.vitlab.check+json"  # the MIME type of a result as data
DATA_VERSION = 1  # the version of CheckResult.to_dict's layout
DATA_ENV = "VITLAB_CHECK_DATA"  # "1": show results as display data (see the module docstring)


# The two classic slips of folding a token sequence (B, H*W, C) into a map (B, C, H, W),
# named in the same words by every check whose exercise does it.
SCRAMBLING_RESHAPE = (
    "the tokens were reshaped straight to (B, C, H, W), which scrambles them; fold them with "
    "rearrange(x, 'B (H W) C -> B C H W', H=H, W=W) (a transpose, then a reshape)"
)
SWAPPED_GRID = (
    "the grid's height and width are swapped ('B (W H) C'): the tokens are numbered row by row, 'B (H W) C' with H rows"
)


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check; ``bool(result)`` is ``result.passed``.

    Attributes:
        name: the check's name, e.g. ``"scaled_dot_product_attention"``.
        status: ``"passed"``, ``"failed"`` or ``"not implemented"``.
        message: the line the check printed.
        case: the label of the case that failed (``None`` when passed).
        erratum: the pitfall number of the recognised wrong answer, if any.
        cases_passed: how many cases matched the reference (``None``: not counted).
        cases_total: how many cases the check ran (``None``: not counted).
    """

    name: str
    status: Status
    message: str
    case: str | None = None
    erratum: int | None = None
    cases_passed: int | None = None
    cases_total: int | None = None

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def fraction(self) -> float:
        """The share of cases that matched, 0 to 1: the partial credit (1 or 0 if not counted)."""
        if self.cases_total:
            return (self.cases_passed or 0) / self.cases_total
        return 1.0 if self.passed else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data, the same on every run and device (no floats but the fraction)."""
        return {
            "version": DATA_VERSION,
            "name": self.name,
            "status": self.status,
            "message": self.message,
            "case": self.case,
            "pitfall": self.erratum,
            "cases_passed": self.cases_passed,
            "cases_total": self.cases_total,
            "fraction": self.fraction,
        }

    def __bool__(self) -> bool:
        return self.passed

    def _ipython_display_(self) -> None:
        """Show nothing as a cell's value: the check already printed its one line.

        (A trailing ``;`` is not enough: nbval runs cells without history, and IPython
        then cannot see the ``;``.)
        """


@dataclass(frozen=True)
class Case:
    """One call of the student's function: ``fn(*args, **kwargs)``; ``label`` names it."""

    label: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class KnownWrong:
    """A wrong answer seen in the source notes or in class, and how to fix it.

    ``fn`` takes the same arguments as the student's function and returns the wrong
    answer; ``message`` says in words what was done and what is right.
    """

    fn: Callable[..., Any]
    message: str
    erratum: int | None = None


@dataclass(frozen=True)
class Expect:
    """What an answer must be: a tensor or one number, integer-valued or not, and how close.

    ``atol`` and ``rtol`` as in :func:`torch.isclose`; a number matches when
    ``math.isclose(got, expected, rel_tol=rtol, abs_tol=atol)``.
    """

    kind: Literal["tensor", "number"] = "tensor"
    integer: bool = False
    rtol: float = 1e-4
    atol: float = 1e-5


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``: the same inputs on every machine."""
    return torch.Generator().manual_seed(seed)


def randn(seed: int, *size: int) -> Tensor:
    """Standard normal CPU tensor from a generator seeded with ``seed``."""
    return torch.randn(size, generator=generator(seed))


def shape(x: Tensor) -> str:
    """``(2, 3, 4)`` for labels and messages."""
    return str(tuple(x.shape))


def _fmt(x: float) -> str:
    if float(x).is_integer() and abs(x) >= 1e4:
        return f"{int(x):,}"  # parameter counts: 5,717,416, not 5.717e+06
    return f"{x:.4g}"


def _clone(x: Any) -> Any:
    """Fresh copies of every tensor, so an in-place edit by one call cannot leak into the next."""
    if isinstance(x, Tensor):
        return x.clone()
    if isinstance(x, (tuple, list)):
        return type(x)(_clone(v) for v in x)
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    return x


def _one_line(exc: BaseException, limit: int = 200) -> str:
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0].strip()}" if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _number_problem(got: Any, expected: float, expect: Expect) -> str | None:
    if isinstance(got, Tensor):
        if got.numel() != 1:
            return f"expected one number, got a tensor of shape {shape(got)}"
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        return f"expected a number, got {type(got).__name__}"
    got = float(got)
    if math.isclose(got, expected, rel_tol=expect.rtol, abs_tol=expect.atol):
        return None
    if expect.integer and not got.is_integer():
        return f"expected a whole number ({_fmt(expected)}), got {_fmt(got)}"
    return f"expected {_fmt(expected)}, got {_fmt(got)}"


def _tensor_problem(got: Any, expected: Tensor, expect: Expect) -> str | None:
    if not isinstance(got, Tensor):
        return f"expected a torch.Tensor, got {type(got).__name__}"
    if got.shape != expected.shape:
        return f"expected shape {shape(expected)}, got {shape(got)}"
    if expect.integer and (got.is_floating_point() or got.is_complex()):
        return f"expected an integer tensor (e.g. torch.long), got {got.dtype}"
    g = got.detach().cpu().double()
    e = expected.detach().cpu().double()
    close = torch.isclose(g, e, rtol=expect.rtol, atol=expect.atol, equal_nan=True)
    if bool(close.all()):
        return None
    error = torch.where(close, torch.zeros_like(g), (g - e).abs().nan_to_num(nan=math.inf))
    flat = int(error.argmax())
    if g.ndim == 0:
        return f"expected {_fmt(e.item())}, got {_fmt(g.item())}"
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), g.shape))
    return (
        f"values differ from the reference: max error {_fmt(error.max().item())} at index {index} "
        f"(expected {_fmt(e[index].item())}, got {_fmt(g[index].item())})"
    )


def problem(got: Any, expected: Any, expect: Expect) -> str | None:
    """What is wrong with ``got`` as an answer ``expected``, or ``None`` if it matches."""
    if got is None:
        return "returned None (is a `return` missing?)"
    if expect.kind == "number":
        return _number_problem(got, float(expected), expect)
    return _tensor_problem(got, expected, expect)


def _call(fn: Callable[..., Any], case: Case) -> Any:
    with torch.no_grad():
        return fn(*_clone(case.args), **_clone(case.kwargs))


def _matches_everywhere(
    wrong: KnownWrong, answers: dict[int, Any], fn: Callable[..., Any], cases: Sequence[Case], expect: Expect
) -> bool:
    """Whether the student's answer equals this wrong answer on every case where both run."""
    for number, case in enumerate(cases):
        try:
            if number not in answers:
                answers[number] = _call(fn, case)
            wrong_answer = _call(wrong.fn, case)
        except Exception:  # noqa: BLE001 - no evidence either way from this case
            continue
        if problem(answers[number], wrong_answer, expect) is not None:
            return False
    return True


def _known_wrong(
    failed: int, answers: dict[int, Any], fn: Callable[..., Any], cases: Sequence[Case],
    known_wrong: Sequence[KnownWrong], expect: Expect,
) -> KnownWrong | None:  # fmt: skip
    """The known wrong answer the student's answer matches on the failing case.

    When several match there, the first that also matches on every other case wins
    (two mistakes can agree on one case and not on the next).
    """
    candidates = []
    for wrong in known_wrong:
        try:
            wrong_answer = _call(wrong.fn, cases[failed])
        except Exception:  # noqa: BLE001 - a wrong answer that cannot run on this case is not this one
            continue
        if problem(answers[failed], wrong_answer, expect) is None:
            candidates.append(wrong)
    if len(candidates) > 1:
        for wrong in candidates:
            if _matches_everywhere(wrong, answers, fn, cases, expect):
                return wrong
    return candidates[0] if candidates else None


def _evaluate(
    name: str,
    fn: Any,
    cases: Sequence[Case],
    reference: Callable[..., Any],
    known_wrong: Sequence[KnownWrong],
    expect: Expect,
) -> CheckResult:
    if not callable(fn):
        return CheckResult(
            name, "failed", f"FAIL {name}: expected a function to check, got {type(fn).__name__}",
            cases_passed=0, cases_total=len(cases),
        )  # fmt: skip
    answers: dict[int, Any] = {}
    first: CheckResult | None = None  # the result the first differing case gives
    passed = 0
    for number, case in enumerate(cases):
        where = f"case {number + 1}/{len(cases)}: {case.label}"
        expected = _call(reference, case)
        try:
            answers[number] = _call(fn, case)
        except NotImplementedError:
            if first is None:
                at = "" if number == 0 else f" [{where}]"
                first = CheckResult(name, "not implemented", f"TODO {name}{at}: not implemented yet", case=case.label)
            continue
        except Exception as exc:  # noqa: BLE001 - any crash of the student's code is a failed check
            if first is None:
                first = CheckResult(name, "failed", f"FAIL {name} [{where}]: raised {_one_line(exc)}", case=case.label)
            continue
        what = problem(answers[number], expected, expect)
        if what is None:
            passed += 1
            continue
        if first is not None:
            continue  # the message names the first differing case only
        wrong = _known_wrong(number, answers, fn, cases, known_wrong, expect)
        if wrong is not None:
            tag = f"Pitfall {wrong.erratum}" if wrong.erratum is not None else "a known mistake"
            message = f"FAIL {name} [{where}]: {tag}: {wrong.message}"
            first = CheckResult(name, "failed", message, case=case.label, erratum=wrong.erratum)
        else:
            first = CheckResult(name, "failed", f"FAIL {name} [{where}]: {what}", case=case.label)
    if first is None:
        first = CheckResult(name, "passed", f"PASS {name}: all {len(cases)} cases match the reference")
    return dataclasses.replace(first, cases_passed=passed, cases_total=len(cases))


def show(result: CheckResult) -> None:
    """Show a result's line: printed, or as display data with the result's JSON (see the module docstring)."""
    if os.environ.get(DATA_ENV) == "1":
        try:
            from IPython.core.getipython import get_ipython
            from IPython.display import display
        except ImportError:  # pragma: no cover - the grader's kernels always have IPython
            pass
        else:
            if get_ipython() is not None:
                display({"text/plain": result.message, DATA_MIME: result.to_dict()}, raw=True)
                return
    print(result.message)


def run_check(
    name: str,
    fn: Any,
    cases: Sequence[Case],
    reference: Callable[..., Any],
    *,
    known_wrong: Sequence[KnownWrong] = (),
    expect: Expect = Expect(),
    pass_note: str = "",
) -> CheckResult:
    """Run ``fn`` on every case against ``reference``; show one line; return the result.

    ``pass_note`` is added to a PASS line after a space, e.g. ``"(the check compares
    values only: it cannot tell whether you used F.unfold)"``. A check that builds its
    result another way (``_evaluate`` then :func:`dataclasses.replace`) shows it with
    :func:`show`, so that a grader still gets the result as data.

    Every case runs, so the result counts the cases that match (``cases_passed`` of
    ``cases_total``, the partial credit); the line names the first case that differs. The
    known wrong answers are tried on that case; the one the answer matches is reported
    (the first in order that matches on every case, if several match on that one).
    """
    result = _evaluate(name, fn, cases, reference, known_wrong, expect)
    if pass_note and result.passed:
        result = dataclasses.replace(result, message=f"{result.message} {pass_note.strip()}")
    show(result)
    return result
