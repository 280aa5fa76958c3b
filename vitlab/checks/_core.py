"""The machinery every exercise check shares.

A check is a :class:`CheckSpec`: seeded CPU cases, the reference, the *known wrong
answers* (the course's pitfalls and classic slips) and what an answer must be
(:class:`Expect`). Checking has two steps that never share a stack:
:func:`collect_answers` runs the student's function on fresh copies of the inputs (and one
case again with gradients and a backward pass); :func:`evaluate` only then computes the
references and compares. :func:`run_check` does both and prints one line (``PASS ...``,
``FAIL name [case 2/4: ...]: ...`` or ``TODO ...``); it never raises because of the
student's code. The grader (``vitlab_grader``) gets the spec through a :class:`SpecRequest`,
runs step 1 in the student's kernel and step 2 in its own process. Under :func:`hidden_cases`
the checks build other cases of the same kinds and sizes (the grader's hidden cases).

With ``VITLAB_CHECK_DATA=1`` in IPython the line is shown as display data instead, next to
:meth:`CheckResult.to_dict` as :data:`DATA_MIME` (the grader never reads it).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import hashlib
import inspect
import math
import numbers
import os
import random
import sysconfig
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch
from torch import Tensor, nn

Status = Literal["passed", "failed", "not implemented"]

DATA_MIME = "application/vnd.vitlab.check+json"  # the MIME type of a result as data
DATA_VERSION = 1  # the version of CheckResult.to_dict's layout
DATA_ENV = "VITLAB_CHECK_DATA"  # "1": show results as display data (see the module docstring)
DETACHED = "detached: no gradient reaches the inputs"  # Answers.gradient for an answer autograd cannot reach


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check; ``bool(result)`` is ``result.passed``.

    ``message`` is the line the check printed, ``case`` the label of the case that failed,
    ``pitfall`` the number of the recognised wrong answer in book/pitfalls.md;
    ``cases_passed`` of ``cases_total`` matched the reference (``None``: not counted).
    """

    name: str
    status: Status
    message: str
    case: str | None = None
    pitfall: int | None = None
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
        return {"version": DATA_VERSION, **dataclasses.asdict(self), "fraction": self.fraction}

    def __bool__(self) -> bool:
        return self.passed

    def _ipython_display_(self) -> None:
        """Show nothing as a cell's value (a trailing ``;`` is not seen when nbval runs a cell)."""


@dataclass(frozen=True)
class Case:
    """One call of the student's function: ``fn(*args, **kwargs)``; ``label`` names it."""

    label: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class KnownWrong:
    """A common wrong answer: ``fn`` computes it from the same arguments, ``message`` says what
    is right, ``pitfall`` is its number in book/pitfalls.md if it is one."""

    fn: Callable[..., Any]
    message: str
    pitfall: int | None = None


@dataclass(frozen=True)
class Expect:
    """What an answer must be: a tensor or one number, integer-valued or not, and how close
    (``atol``, ``rtol`` as in :func:`torch.isclose` and :func:`math.isclose`)."""

    kind: Literal["tensor", "number"] = "tensor"
    integer: bool = False
    rtol: float = 1e-4
    atol: float = 1e-5
    index: bool = False  # an index tensor: torch.long or torch.int only (uint8 and bool index as masks)


WHOLE = Expect(kind="number", integer=True, rtol=0.0, atol=1e-9)  # a count: exactly a whole number


@dataclass(frozen=True)
class CheckSpec:
    """Everything a check needs but the student's function: what :func:`run_check` is given."""

    name: str
    cases: tuple[Case, ...]
    reference: Callable[..., Any]
    known_wrong: tuple[KnownWrong, ...] = ()
    expect: Expect = Expect()
    pass_note: str = ""


@dataclass(frozen=True)
class Answer:
    """What the student's function did on one case: returned ``value``, or raised ``error``
    (``"TypeError: ..."``) at ``where`` (``"line 3 of fn: return q @ k"``); ``changed`` names the
    inputs it changed in place (``"x"``, ``"argument 2"``)."""

    value: Any = None
    error: str | None = None
    where: str = ""
    not_implemented: bool = False
    changed: tuple[str, ...] = ()


@dataclass(frozen=True)
class Answers:
    """The answers to every case (:func:`collect_answers`); ``gradient``: why the run of case
    ``gradient_case`` with gradients failed, or ``None``; ``function``: ``module.qualname``;
    ``calls``: the vitlab functions the answer ran (recorded only by the instructor's grader)."""

    cases: tuple[Answer, ...]
    gradient: str | None = None
    gradient_case: int | None = None
    function: str = ""
    calls: tuple[str, ...] = ()


_HIDDEN: contextvars.ContextVar[bytes | None] = contextvars.ContextVar("vitlab_hidden_cases", default=None)
T = TypeVar("T")


@contextlib.contextmanager
def hidden_cases(key: bytes) -> Iterator[None]:
    """Checks called inside build hidden cases: :func:`generator`'s seeds and :func:`vary`'s rows come from ``key``."""
    token = _HIDDEN.set(key)
    try:
        yield
    finally:
        _HIDDEN.reset(token)


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed`` (mixed with the key of :func:`hidden_cases`): the same inputs everywhere."""
    if (key := _HIDDEN.get()) is not None:
        seed = int.from_bytes(hashlib.blake2b(str(seed).encode(), key=key[:64], digest_size=8).digest(), "big") >> 1
    return torch.Generator().manual_seed(seed)


def vary(public: Sequence[T], draw: Callable[[random.Random], T]) -> Sequence[T]:
    """A check's table of arguments; under :func:`hidden_cases`, as many rows from ``draw``, none a public one."""
    if (key := _HIDDEN.get()) is None:
        return public
    rng = random.Random(key)
    return tuple(row for row in (draw(rng) for _ in range(100 * len(public))) if row not in public)[: len(public)]


def randn(seed: int, *size: int) -> Tensor:
    """Standard normal CPU tensor from a generator seeded with ``seed``."""
    return torch.randn(size, generator=generator(seed))


def shape(x: Tensor) -> str:
    """``(2, 3, 4)`` for labels and messages."""
    return str(tuple(x.shape))


def _fmt(x: float, digits: int = 4) -> str:
    if float(x).is_integer() and abs(x) >= 1e4:
        return f"{int(x):,}"  # parameter counts: 5,717,416, not 5.717e+06
    return f"{x:.{digits}g}"


def _pair(expected: float, got: float) -> tuple[str, str]:
    """``expected`` and ``got`` with as few digits as show that they differ (4 at least)."""
    for digits in range(4, 18):
        a, b = _fmt(expected, digits), _fmt(got, digits)
        if a != b:
            return a, b
    return repr(float(expected)), repr(float(got))


def _clone(x: Any) -> Any:
    """Fresh copies of every tensor and module, so that no call can change what the next one gets."""
    if isinstance(x, Tensor):
        return x.clone()
    if isinstance(x, nn.Module):
        return copy.deepcopy(x)
    if isinstance(x, (tuple, list)):
        return type(x)(_clone(v) for v in x)
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    return x


def _same(before: Any, after: Any) -> bool:
    """Whether a call left an input as it was: tensors equal, a module's parameters equal (not its buffers)."""
    if isinstance(before, Tensor):
        if not isinstance(after, Tensor) or before.shape != after.shape or before.dtype != after.dtype:
            return False
        if not before.is_floating_point():
            return bool(torch.equal(before, after))
        return bool(torch.isclose(before.detach(), after.detach(), rtol=0, atol=0, equal_nan=True).all())
    if isinstance(before, nn.Module):
        mine, theirs = dict(before.named_parameters()), dict(after.named_parameters())
        return mine.keys() == theirs.keys() and all(_same(mine[k], theirs[k]) for k in mine)
    if isinstance(before, (tuple, list)):
        return len(before) == len(after) and all(_same(b, a) for b, a in zip(before, after, strict=True))
    if isinstance(before, dict):
        return before.keys() == after.keys() and all(_same(before[k], after[k]) for k in before)
    return True


def _names(fn: Callable[..., Any], case: Case) -> list[str]:
    """The name of each input of ``case`` as ``fn`` calls it: positional ones, then keywords."""
    positional = [f"argument {i + 1}" for i in range(len(case.args))]
    try:
        bound = inspect.signature(fn).bind(*case.args, **case.kwargs)
    except (TypeError, ValueError):  # no signature, or one that does not fit: positions
        return positional + list(case.kwargs)
    names = list(bound.arguments)
    return [names[i] if i < len(names) else positional[i] for i in range(len(case.args))] + list(case.kwargs)


def _changed(fn: Callable[..., Any], case: Case, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, ...]:
    """The inputs that the call of ``fn`` on copies ``args``, ``kwargs`` of the case's changed in place."""
    names = _names(fn, case)
    given = [*case.args, *case.kwargs.values()]
    after = [*args, *kwargs.values()]
    return tuple(name for name, b, a in zip(names, given, after, strict=True) if not _same(b, a))


_LIBRARY = tuple(
    str(Path(p).resolve())
    for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    | {str(Path(__file__).resolve().parents[1]), str(Path(torch.__file__).resolve().parent)}
)


def _where(exc: BaseException) -> str:
    """``"line 3 of fn: return q @ k"``: the last frame of the student's own code (not torch's, not vitlab's)."""
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__)
        if f.filename != __file__ and not str(Path(f.filename).resolve()).startswith(_LIBRARY)
    ]  # fmt: skip
    if not frames:
        return ""
    last = frames[-1]
    return f"line {last.lineno} of {last.name}" + (f": {last.line.strip()}" if last.line else "")


def _exception(exc: BaseException, limit: int = 2000) -> str:
    """``"RuntimeError: ..."``, the whole message on one line (the shapes of a torch error are in its later lines)."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _float_tensors(x: Any) -> list[Tensor]:
    if isinstance(x, Tensor):
        return [x] if x.is_floating_point() else []
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _float_tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _float_tensors(v)]
    return []


def answer(fn: Callable[..., Any], case: Case) -> Answer:
    """Run ``fn`` on a fresh copy of the case's inputs (no gradients); what it did, as an :class:`Answer`."""
    args, kwargs = _clone(case.args), _clone(case.kwargs)
    try:
        with torch.no_grad():
            value = fn(*args, **kwargs)
    except NotImplementedError:
        return Answer(not_implemented=True)
    except Exception as exc:  # noqa: BLE001 - any crash of the student's code is a failed case
        return Answer(error=_exception(exc), where=_where(exc))
    return Answer(value=value, changed=_changed(fn, case, args, kwargs))


def _grad_inputs(case: Case) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Copies of the case's inputs, every float tensor requiring gradients."""
    args, kwargs = _clone(case.args), _clone(case.kwargs)
    for tensor in _float_tensors((args, kwargs)):
        tensor.requires_grad_(True)
    return args, kwargs


def _gradient_problem(fn: Callable[..., Any], case: Case) -> str | None:
    """Why ``fn`` fails on ``case`` with float inputs that require gradients, then a backward pass, or ``None``."""
    args, kwargs = _grad_inputs(case)
    try:
        with torch.enable_grad():
            value = fn(*args, **kwargs)
    except NotImplementedError:
        return None  # reported by the run without gradients
    except Exception as exc:  # noqa: BLE001
        return f"with inputs that require gradients it raised {_exception(exc)}"
    if isinstance(value, Tensor) and value.is_floating_point() and not value.requires_grad:
        return DETACHED  # a failure only where the reference carries a gradient (evaluate decides)
    if not (isinstance(value, Tensor) and value.requires_grad):
        return None  # nothing to differentiate: a count
    try:
        value.sum().backward()
    except Exception as exc:  # noqa: BLE001
        return f"the backward pass raised {_exception(exc)}"
    return None


def collect_answers(fn: Callable[..., Any], cases: Sequence[Case]) -> Answers:
    """Step 1 of a check: the student's answers, all computed before any reference is; the first
    case with float inputs runs again with gradients and a backward pass."""
    found = tuple(answer(fn, case) for case in cases)
    graded = next((i for i, c in enumerate(cases) if _float_tensors((c.args, c.kwargs))), None)
    gradient = None
    if graded is not None and found[graded].error is None and not found[graded].not_implemented:
        gradient = _gradient_problem(fn, cases[graded])
    module, name = getattr(fn, "__module__", None) or "", getattr(fn, "__qualname__", None) or ""
    return Answers(found, gradient, graded, f"{module}.{name}" if module and name else name)


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
    return "expected {}, got {}".format(*_pair(expected, got))


def _tensor_problem(got: Any, expected: Tensor, expect: Expect) -> str | None:
    if not isinstance(got, Tensor):
        return f"expected a torch.Tensor, got {type(got).__name__}"
    if got.shape != expected.shape:
        return f"expected shape {shape(expected)}, got {shape(got)}"
    if expect.integer and (got.is_floating_point() or got.is_complex()):
        return f"expected an integer tensor (e.g. torch.long), got {got.dtype}"
    if expect.index and got.dtype in (torch.uint8, torch.bool):
        return (
            f"the indices are {got.dtype}, which PyTorch reads as a mask, not as positions (bias[:, idx] "
            "would pick entries by True/False); return torch.long"
        )
    if expect.index and got.dtype not in (torch.long, torch.int):
        return f"the indices are {got.dtype}; PyTorch indexes with torch.long (or torch.int): return torch.long"
    g = got.detach().cpu().double()
    e = expected.detach().cpu().double()
    close = torch.isclose(g, e, rtol=expect.rtol, atol=expect.atol, equal_nan=True)
    if bool(close.all()):
        return None
    error = torch.where(close, torch.zeros_like(g), (g - e).abs().nan_to_num(nan=math.inf))
    flat = int(error.argmax())
    if g.ndim == 0:
        return "expected {}, got {}".format(*_pair(e.item(), g.item()))
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), g.shape))
    expected_text, got_text = _pair(e[index].item(), g[index].item())
    return (
        f"values differ from the reference: max error {_fmt(error.max().item())} at index {index} "
        f"(expected {expected_text}, got {got_text})"
    )


def problem(got: Any, expected: Any, expect: Expect) -> str | None:
    """What is wrong with ``got`` as an answer ``expected``, or ``None`` if it matches."""
    if got is None:
        return "returned None (is a `return` missing?)"
    if expect.kind == "number":
        return _number_problem(got, float(expected), expect)
    return _tensor_problem(got, expected, expect)


def _carries_gradient(fn: Callable[..., Any], case: Case) -> bool:
    """Whether ``fn``'s output on the case, its float inputs requiring gradients, is differentiable."""
    args, kwargs = _grad_inputs(case)
    with torch.enable_grad():
        value = fn(*args, **kwargs)
    return isinstance(value, Tensor) and value.requires_grad


def _call(fn: Callable[..., Any], case: Case) -> Any:
    """The reference's or a known wrong answer's output on a copy of the case's inputs."""
    with torch.no_grad():
        return fn(*_clone(case.args), **_clone(case.kwargs))


def _known_wrong(failed: int, answers: Answers, spec: CheckSpec) -> KnownWrong | None:
    """The known wrong answer that the answer to case ``failed`` matches; of several, the first
    that matches on every case where both run."""
    candidates = [wrong for wrong in spec.known_wrong if _matches(wrong, answers, spec, failed, unknown=False)]
    for wrong in candidates if len(candidates) > 1 else ():
        if all(_matches(wrong, answers, spec, number) for number in range(len(spec.cases))):
            return wrong
    return candidates[0] if candidates else None


def _matches(wrong: KnownWrong, answers: Answers, spec: CheckSpec, number: int, unknown: bool = True) -> bool:
    """Whether the answer to case ``number`` is this wrong answer (``unknown`` where either does not run)."""
    if answers.cases[number].error is not None or answers.cases[number].not_implemented:
        return unknown
    try:
        wrong_answer = _call(wrong.fn, spec.cases[number])
    except Exception:  # noqa: BLE001 - no evidence either way from this case
        return unknown
    return problem(answers.cases[number].value, wrong_answer, spec.expect) is None


def _changed_message(changed: Sequence[str]) -> str:
    names = ", ".join(f"`{name}`" for name in changed)
    return (
        f"changed its input {names} in place: the caller's tensors must stay as they were "
        "(write x = x + y, not x += y or x[...] = ...)"
    )


def evaluate(spec: CheckSpec, answers: Answers) -> CheckResult:
    """Step 2 of a check: compute the references and compare them with ``answers``.

    A case passes when its answer matches, its inputs were left as they were and, for the case
    run with gradients, the backward pass worked. Raises ``ValueError`` on a wrong answer count.
    """
    name, cases = spec.name, spec.cases
    if len(answers.cases) != len(cases):
        raise ValueError(f"{name}: expected {len(cases)} answers (one per case), got {len(answers.cases)}")
    first: CheckResult | None = None  # the result the first differing case gives
    passed = 0
    for number, (case, found) in enumerate(zip(cases, answers.cases, strict=True)):
        where = f"case {number + 1}/{len(cases)}: {case.label}"
        if found.not_implemented:
            if first is None:
                at = "" if number == 0 else f" [{where}]"
                first = CheckResult(name, "not implemented", f"TODO {name}{at}: not implemented yet", case=case.label)
            continue
        if found.error is not None:
            if first is None:
                at = f"; {found.where}" if found.where else ""
                first = CheckResult(name, "failed", f"FAIL {name} [{where}{at}]: raised {found.error}", case=case.label)
            continue
        expected = _call(spec.reference, case)
        differs = problem(found.value, expected, spec.expect)
        what = differs
        if what is None and found.changed:
            what = _changed_message(found.changed)
        elif what is None and answers.gradient == DETACHED and number == answers.gradient_case:
            if _carries_gradient(spec.reference, case):
                what = (
                    f"{DETACHED}: the answer was computed under torch.no_grad(), detached, or rebuilt with "
                    "torch.tensor(...), so a model could not train through it; compute it with torch operations"
                )
                where = f"{where}, with gradients"
        elif what is None and answers.gradient is not None and number == answers.gradient_case:
            what = f"{answers.gradient} (an in-place operation on a tensor that autograd needs breaks training)"
            where = f"{where}, with gradients"
        if what is None:
            passed += 1
            continue
        if first is not None:
            continue  # the message names the first differing case only
        wrong = _known_wrong(number, answers, spec) if differs is not None else None
        if wrong is not None:
            tag = f"Pitfall {wrong.pitfall}" if wrong.pitfall is not None else "a known mistake"
            message = f"FAIL {name} [{where}]: {tag}: {wrong.message}"
            first = CheckResult(name, "failed", message, case=case.label, pitfall=wrong.pitfall)
        else:
            first = CheckResult(name, "failed", f"FAIL {name} [{where}]: {what}", case=case.label)
    if first is None:
        note = f" {spec.pass_note.strip()}" if spec.pass_note.strip() else ""
        first = CheckResult(name, "passed", f"PASS {name}: all {len(cases)} cases match the reference{note}")
    return dataclasses.replace(first, cases_passed=passed, cases_total=len(cases))


def show(result: CheckResult) -> None:
    """Show a result's line: printed, or as display data with the result's JSON (see the module docstring)."""
    if os.environ.get(DATA_ENV) == "1":
        try:
            from IPython.core.getipython import get_ipython
            from IPython.display import display
        except ImportError:  # pragma: no cover - IPython comes with every kernel
            pass
        else:
            if get_ipython() is not None:
                display({"text/plain": result.message, DATA_MIME: result.to_dict()}, raw=True)
                return
    print(result.message)


class SpecRequest:
    """Give this to a check instead of a function: the check stores its :class:`CheckSpec` in ``spec``."""

    def __init__(self) -> None:
        self.spec: CheckSpec | None = None


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

    ``pass_note`` is added to a PASS line after a space. Given a :class:`SpecRequest`, it
    stores the spec there and returns without running or showing anything.
    """
    spec = CheckSpec(name, tuple(cases), reference, tuple(known_wrong), expect, pass_note)
    if isinstance(fn, SpecRequest):
        fn.spec = spec
        return CheckResult(name, "not implemented", f"TODO {name}: the spec was requested, nothing ran")
    if not callable(fn):
        message = f"FAIL {name}: expected a function to check, got {type(fn).__name__}"
        result = CheckResult(name, "failed", message, cases_passed=0, cases_total=len(spec.cases))
    else:
        result = evaluate(spec, collect_answers(fn, spec.cases))
    show(result)
    return result
