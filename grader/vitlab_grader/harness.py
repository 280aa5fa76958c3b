"""The grader's side of a check inside a student's kernel: run the answer, return it as data.

The grader (:mod:`vitlab_grader.grade`) puts a cell where the release has a check
cell. It calls :func:`answer_cases` with the path of the cases (written by the grader),
the path for the answers, and the student's function. The student's function runs on
every case (:func:`vitlab.checks._core.collect_answers`) and what it returned is saved
with :func:`torch.save` as plain data: tensors, numbers, strings and ``None`` in dicts
and lists, which the grader reads back with ``torch.load(weights_only=True)``. Whether
the answers are right is decided in the grader's process, never here: the references are
never computed in the student's kernel.

Everything in this module runs with the student's code in the same process, so nothing
here is trusted: what it returns is the student's answer, no more.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

import vitlab
from vitlab.checks._core import Answer, Answers, collect_answers

VERSION = 1  # the layout of an answers file


def unsupported(type_name: str) -> Any:
    """A stand-in for an answer that cannot travel as data (e.g. a NumPy array), of a class named ``type_name``.

    The check compares it like any answer of a type it does not expect, and its message
    names the student's type: ``expected a torch.Tensor, got ndarray``.
    """
    return type(type_name, (), {"__slots__": ()})()


def encode_value(value: Any) -> tuple[Any, str]:
    """``(data, type name)``: a tensor or a number as plain data, anything else as ``None`` and its type's name."""
    name = type(value).__name__
    if isinstance(value, Tensor):
        if value.is_meta or value.layout != torch.strided or value.is_quantized:  # no values to send
            where = "meta" if value.is_meta else str(value.layout).removeprefix("torch.")
            return None, f"{where} Tensor"
        return value.detach().cpu().clone().as_subclass(Tensor), "Tensor"
    if value is None or isinstance(value, (bool, str)):
        return value, name
    if isinstance(value, numbers.Integral):
        return int(value), name
    if isinstance(value, numbers.Real):
        return float(value), name
    return None, name


def encode(answers: Answers) -> dict[str, Any]:
    """An :class:`Answers` as plain data (see the module docstring)."""
    cases = []
    for found in answers.cases:
        data, type_name = encode_value(found.value)
        cases.append({
            "value": data, "type": type_name, "error": found.error, "where": found.where,
            "not_implemented": found.not_implemented, "changed": list(found.changed),
        })  # fmt: skip
    return {
        "version": VERSION, "cases": cases, "gradient": answers.gradient,
        "gradient_case": answers.gradient_case, "function": answers.function, "calls": list(answers.calls),
    }  # fmt: skip


def _text(data: dict[str, Any], key: str, optional: bool = False) -> Any:
    value = data.get(key)
    if (value is None and optional) or isinstance(value, str):
        return value
    raise ValueError(f"{key!r} must be a string{' or None' if optional else ''}, got {type(value).__name__}")


TENSOR_LIMIT = 64 * 2**20  # bytes: the largest tensor an answer may be (its values, as the grader compares them)


def _check_tensor(value: Tensor) -> None:
    """A tensor the grader can compare without surprises: values on the CPU, strided, within :data:`TENSOR_LIMIT`."""
    if value.is_meta or value.device.type != "cpu" or value.layout != torch.strided or value.is_quantized:
        raise ValueError(f"an answer's tensor must hold values on the CPU, got {value.device.type} {value.layout}")
    if value.numel() * value.element_size() > TENSOR_LIMIT:
        raise ValueError(f"an answer's tensor takes {value.numel() * value.element_size()} bytes, more than "
                         f"the {TENSOR_LIMIT} the grader compares")  # fmt: skip


def decode(data: Any, cases: int) -> Answers:
    """The :class:`Answers` in what :func:`encode` wrote (read by the grader).

    Raises:
        ValueError: not what :func:`encode` writes for ``cases`` cases.
    """
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValueError(f"expected a dict with version {VERSION}, got {type(data).__name__}")
    found = data.get("cases")
    if not isinstance(found, list) or len(found) != cases:
        raise ValueError(f"expected a list of {cases} answers, got {type(found).__name__} of {len(found or ())}")
    answers = []
    for case in found:
        if not isinstance(case, dict):
            raise ValueError(f"expected an answer as a dict, got {type(case).__name__}")
        value, type_name = case.get("value"), _text(case, "type")
        if isinstance(value, Tensor):
            _check_tensor(value)
            value = value.as_subclass(Tensor)
        elif value is None and type_name != "NoneType":
            value = unsupported(type_name)
        elif not (value is None or isinstance(value, (bool, int, float, str))):
            raise ValueError(f"an answer's value must be a tensor, a number or a string, got {type(value).__name__}")
        changed = case.get("changed")
        if not isinstance(changed, list) or not all(isinstance(c, str) for c in changed):
            raise ValueError("'changed' must be a list of strings")
        answers.append(Answer(
            value, _text(case, "error", optional=True), _text(case, "where"),
            bool(case.get("not_implemented")), tuple(changed),
        ))  # fmt: skip
    gradient_case = data.get("gradient_case")
    if gradient_case is not None and (not isinstance(gradient_case, int) or not 0 <= gradient_case < cases):
        raise ValueError(f"'gradient_case' must be a case number below {cases} or None, got {gradient_case!r}")
    calls = data.get("calls", [])
    if not isinstance(calls, list) or len(calls) > CALLS_LIMIT or not all(isinstance(c, str) for c in calls):
        raise ValueError(f"'calls' must be a list of at most {CALLS_LIMIT} strings")
    return Answers(
        tuple(answers), _text(data, "gradient", optional=True), gradient_case, _text(data, "function"), tuple(calls)
    )


CALLS_LIMIT = 256  # the most vitlab functions an answers file may name
_PACKAGE = os.path.dirname(vitlab.__file__) + os.sep
_CHECKS = os.path.join(_PACKAGE, "checks") + os.sep


def _in_vitlab(frame: Any) -> bool:
    """Whether a frame runs vitlab's code (its checks left out: they run the answer)."""
    return frame.f_code.co_filename.startswith(_PACKAGE) and not frame.f_code.co_filename.startswith(_CHECKS)


def _traced(run: Callable[[], Answers]) -> Answers:
    """``run()``, with ``calls`` set to the vitlab functions the answer called itself
    (``module.qualname``; not those they call in turn) and ``sys.setprofile`` if the answer turned
    the record off. Python's profile hook sees a function however it was reached: an alias,
    ``importlib``, ``sys.modules``, a wrapper."""
    calls: dict[str, None] = {}

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and _in_vitlab(frame):
            caller = frame.f_back
            while caller is not None:
                if _in_vitlab(caller):
                    return  # what vitlab runs for a vitlab function the answer called
                caller = caller.f_back
            qualname = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)  # Python 3.11+
            calls.setdefault(f"{frame.f_globals.get('__name__')}.{qualname}", None)
        elif event == "c_call" and arg in (sys.setprofile, threading.setprofile, sys.settrace) and running:
            calls.setdefault(f"sys.{arg.__name__}", None)

    running = True

    threading.setprofile(profile)  # threads the answer starts
    sys.setprofile(profile)
    try:
        answers = run()
    finally:
        running = False  # the calls below are this function's own
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return dataclasses.replace(answers, calls=tuple(calls)[:CALLS_LIMIT])


def answer_cases(inputs: str, output: str, function: Callable[[], Any]) -> None:
    """Run the student's function on the cases in ``inputs``; save its answers to ``output``.

    ``function`` returns the student's function (a ``lambda`` around its name, so that an
    undefined name is reported as the answer's error instead of failing the cell).
    """
    # Written by the grader: Case objects with modules. The student's own process unpickles it.
    cases = torch.load(inputs, weights_only=False)  # unsafe on purpose
    try:
        fn = function()
    except Exception as exc:  # noqa: BLE001 - a name the student did not define
        found = Answer(error=f"{type(exc).__name__}: {exc}")
        torch.save(encode(Answers(tuple(found for _ in cases))), output)
        return
    if not callable(fn):
        found = Answer(error=f"TypeError: the answer is a {type(fn).__name__}, not a function")
        torch.save(encode(Answers(tuple(found for _ in cases))), output)
        return
    torch.save(encode(_traced(lambda: collect_answers(fn, cases))), output)
