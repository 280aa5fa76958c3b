"""The machinery every exercise check shares.

A check runs the student's function on a few fixed, seeded cases (CPU tensors), compares
each answer with the reference, and stops at the first case that differs. Before it
reports the difference it compares the answer with the *known wrong answers* (the bugs
of ERRATA.md and other classic slips); an answer that matches one is named in words.

It prints exactly one line and returns a :class:`CheckResult`, truthy only when passed:

* ``PASS name: all 4 cases match the reference``
* ``FAIL name [case 2/4: ...]: what differs``
* ``TODO name: not implemented yet``

A check never raises because of the student's code: a wrong answer, a crash, or
``NotImplementedError`` become a failed result, so a notebook keeps running. Printing is
the point of these functions (they are the output of a notebook cell); the rest of
``vitlab`` never prints.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

Status = Literal["passed", "failed", "not implemented"]


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check; ``bool(result)`` is ``result.passed``.

    Attributes:
        name: the check's name, e.g. ``"scaled_dot_product_attention"``.
        status: ``"passed"``, ``"failed"`` or ``"not implemented"``.
        message: the line the check printed.
        case: the label of the case that failed (``None`` when passed).
        erratum: the ERRATA.md number of the recognised wrong answer, if any.
    """

    name: str
    status: Status
    message: str
    case: str | None = None
    erratum: int | None = None

    @property
    def passed(self) -> bool:
        return self.status == "passed"

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
        return CheckResult(name, "failed", f"FAIL {name}: expected a function to check, got {type(fn).__name__}")
    answers: dict[int, Any] = {}
    for number, case in enumerate(cases):
        where = f"case {number + 1}/{len(cases)}: {case.label}"
        expected = _call(reference, case)
        try:
            answers[number] = _call(fn, case)
        except NotImplementedError:
            at = "" if number == 0 else f" [{where}]"
            return CheckResult(name, "not implemented", f"TODO {name}{at}: not implemented yet", case=case.label)
        except Exception as exc:  # noqa: BLE001 - any crash of the student's code is a failed check
            return CheckResult(name, "failed", f"FAIL {name} [{where}]: raised {_one_line(exc)}", case=case.label)
        what = problem(answers[number], expected, expect)
        if what is None:
            continue
        wrong = _known_wrong(number, answers, fn, cases, known_wrong, expect)
        if wrong is not None:
            tag = f"ERRATA {wrong.erratum}" if wrong.erratum is not None else "a known mistake"
            message = f"FAIL {name} [{where}]: {tag}: {wrong.message}"
            return CheckResult(name, "failed", message, case=case.label, erratum=wrong.erratum)
        return CheckResult(name, "failed", f"FAIL {name} [{where}]: {what}", case=case.label)
    return CheckResult(name, "passed", f"PASS {name}: all {len(cases)} cases match the reference")


def run_check(
    name: str,
    fn: Any,
    cases: Sequence[Case],
    reference: Callable[..., Any],
    *,
    known_wrong: Sequence[KnownWrong] = (),
    expect: Expect = Expect(),
) -> CheckResult:
    """Run ``fn`` on every case against ``reference``; print one line; return the result.

    The known wrong answers are tried on the first case that differs; the one the answer
    matches is reported (the first in order that matches on every case, if several match
    on that one).
    """
    result = _evaluate(name, fn, cases, reference, known_wrong, expect)
    print(result.message)
    return result
