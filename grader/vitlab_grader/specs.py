"""A check's spec by name: the cases, reference and known wrong answers the grader compares with.

Every check of :mod:`vitlab.checks` is built on :func:`vitlab.checks._core.run_check`:
given a :class:`vitlab.checks._core.SpecRequest` instead of a function, it stores its spec
there and runs nothing, so no student function is called and nothing is printed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vitlab.checks._core import CheckSpec


def check_spec(name: str) -> CheckSpec:
    """The spec of the check called ``name`` in :mod:`vitlab.checks`, e.g. ``"split_heads"``.

    Raises:
        ValueError: no check of that name, or a check that is not built on ``run_check``.
    """
    import vitlab.checks  # imports PyTorch: not before it is needed (the grader's memory)
    from vitlab.checks._core import SpecRequest

    check = getattr(vitlab.checks, name, None)
    if name not in vitlab.checks.__all__ or name == "CheckResult" or not callable(check):
        raise ValueError(f"vitlab.checks has no check named {name!r}")
    request = SpecRequest()
    check(request)
    if request.spec is None:
        raise ValueError(f"vitlab.checks.{name} is not a check built on vitlab.checks._core.run_check")
    return request.spec
