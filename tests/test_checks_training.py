"""vitlab.checks.warmup_cosine and mean_pool_rollout: a right answer passes, each known mistake is named.

The "student" functions are written independently of the checks' references (other ops, other
groupings); the references are checked against vitlab.train.warmup_cosine and vitlab.rollout.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

from conftest import assert_named_mistake, assert_passes, run  # run: one printed line and a CheckResult

NAMES = ["warmup_cosine", "mean_pool_rollout"]

# ---------------------------------------------------------------- right answers


def schedule_ok(step: int, *, total_steps: int, warmup_steps: int, min_ratio: float = 0.0) -> float:
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    done = min(step - warmup_steps, total_steps - warmup_steps)  # steps of the cosine so far
    t = done / (total_steps - warmup_steps)
    return min_ratio + (1 - min_ratio) * (1 + math.cos(math.pi * t)) / 2


def residual_maps(maps: list[Tensor], *, renormalise: bool = True) -> list[Tensor]:
    N = maps[0].shape[-1]
    mats = [a.sum(1) / a.shape[1] + torch.eye(N) for a in maps]  # A + I, rows summing to 2
    return [m / m.sum(-1, keepdim=True) for m in mats] if renormalise else mats


def rollout_ok(maps: list[Tensor]) -> Tensor:
    return functools.reduce(lambda r, m: torch.bmm(m, r), residual_maps(maps))


def mean_pool_ok(maps: list[Tensor]) -> Tensor:
    R = rollout_ok(maps)
    return R.sum(dim=1) / R.shape[1]


SOLUTIONS: dict[str, Callable[..., Any]] = {"warmup_cosine": schedule_ok, "mean_pool_rollout": mean_pool_ok}

# ---------------------------------------------------------------- known wrong answers


def schedule_with(**change: Callable[..., float]) -> Callable[..., float]:
    """schedule_ok with its warmup or cosine part replaced."""

    def fn(step: int, *, total_steps: int, warmup_steps: int, min_ratio: float = 0.0) -> float:
        if step < warmup_steps:
            return change.get("warmup", lambda s, w: (s + 1) / w)(step, warmup_steps)
        cosine = change.get("cosine", lambda s, T, w, m: schedule_ok(s, total_steps=T, warmup_steps=w, min_ratio=m))
        return cosine(step, total_steps, warmup_steps, min_ratio)

    return fn


def half_cos(t: float) -> float:
    return (1 + math.cos(math.pi * min(t, 1.0))) / 2


W = pytest.param  # (check, student function, words the message must contain)
WRONG = [
    W("warmup_cosine", schedule_with(warmup=lambda s, w: s / w), "the first step does not train", id="from_zero"),
    W("warmup_cosine", schedule_with(cosine=lambda s, T, w, m: m + (1 - m) * half_cos(s / T)),
      "progress counts from step 0", id="progress_from_zero"),
    W("warmup_cosine", schedule_with(cosine=lambda s, T, w, m: m + half_cos((s - w) / (T - w))),
      "the peak is 1 + min_ratio", id="min_unscaled"),
    W("warmup_cosine", schedule_with(cosine=lambda s, T, w, m: m + (1 - m) * math.cos(math.pi * (s - w) / (T - w))),
      "a negative learning rate", id="full_cosine"),
    W("warmup_cosine", schedule_with(cosine=lambda s, T, w, m: half_cos((s - w) / (T - w))), "the cosine ends at 0",
      id="no_min_ratio"),
    W("warmup_cosine", lambda s, *, total_steps, warmup_steps, min_ratio=0.0: schedule_ok(
        s, total_steps=total_steps, warmup_steps=0, min_ratio=min_ratio), "there is no warmup", id="no_warmup"),
    W("mean_pool_rollout", lambda maps: rollout_ok(maps)[:, 0], "the class token's rollout", id="class_row"),
    W("mean_pool_rollout", lambda maps: rollout_ok(maps).mean(dim=-1), "the columns are averaged", id="columns"),
    W("mean_pool_rollout", lambda maps: functools.reduce(lambda r, a: a @ r, [a.mean(1) for a in maps]).mean(1),
      "the residual is left out", id="no_residual"),
    W("mean_pool_rollout", lambda maps: functools.reduce(torch.bmm, residual_maps(maps)).mean(1), "wrong order",
      id="order"),
    W("mean_pool_rollout", lambda maps: residual_maps(maps)[-1].mean(1), "only the last block", id="last_only"),
    W("mean_pool_rollout", lambda maps: functools.reduce(
        lambda r, a: (a + torch.eye(a.shape[-1])) / 2 @ r, maps[1:], (maps[0] + torch.eye(maps[0].shape[-1])) / 2
    ).mean(1).mean(1), "each head is rolled out on its own", id="per_head"),
]  # fmt: skip


# ---------------------------------------------------------------- both checks


@pytest.mark.parametrize("name", NAMES)
def test_correct_solution_passes(capsys: pytest.CaptureFixture[str], name: str) -> None:
    assert_passes(capsys, name, SOLUTIONS[name])


@pytest.mark.parametrize(("name", "fn", "words"), WRONG)
def test_known_wrong_answer_fails_with_its_message(
    capsys: pytest.CaptureFixture[str], name: str, fn: Callable[..., Any], words: str
) -> None:
    assert_named_mistake(capsys, name, fn, words)


@pytest.mark.parametrize("name", NAMES)
def test_crash_wrong_type_and_missing_return_fail(capsys: pytest.CaptureFixture[str], name: str) -> None:
    result, line = run(capsys, name, lambda *args, **kwargs: 1 / 0)
    assert not result and re.fullmatch(rf"FAIL {name} \[case 1/\d+: .+\]: raised ZeroDivisionError: division by zero",
                                       line)  # fmt: skip
    result, line = run(capsys, name, lambda *args, **kwargs: torch.zeros(3, 1))
    assert not result and line.endswith(
        "expected shape (1, 4), got (3, 1)" if name == "mean_pool_rollout" else "got a tensor of shape (3, 1)"
    )
    result, line = run(capsys, name, lambda *args, **kwargs: None)
    assert not result and line.endswith("returned None (is a `return` missing?)")


def test_the_schedule_keywords_are_required(capsys: pytest.CaptureFixture[str]) -> None:
    """The check passes the arguments after ``step`` by keyword, as vitlab.train.fit does."""
    result, line = run(capsys, "warmup_cosine", lambda step, total, warmup, min_ratio=0.0: 1.0)
    assert not result and "raised TypeError" in line and "total_steps" in line


def test_unexplained_wrong_answers_say_what_differs(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, "mean_pool_rollout", lambda maps: mean_pool_ok(maps) + 0.01)
    assert not result and "values differ from the reference: max error" in line
    result, line = run(capsys, "warmup_cosine", lambda step, **kwargs: schedule_ok(step, **kwargs) + 0.1)
    assert not result and re.search(r"\[case 1/\d+: step=0, .+\]: expected \S+, got \S+$", line), line


def schedule_in(dtype: torch.dtype, *, off_by_one: bool = False) -> Callable[..., Tensor]:
    """The schedule computed with tensors of ``dtype``; ``off_by_one``: the cosine spans one step fewer."""

    def fn(step: int, *, total_steps: int, warmup_steps: int, min_ratio: float = 0.0) -> Tensor:
        s = torch.tensor(step, dtype=dtype)
        if step < warmup_steps:
            return (s + 1) / warmup_steps
        span = total_steps - warmup_steps - (1 if off_by_one else 0)
        t = torch.clamp((s - warmup_steps) / span, max=1.0)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + torch.cos(math.pi * t))

    return fn


def test_a_float32_schedule_passes(capsys: pytest.CaptureFixture[str]) -> None:
    """float32 is a fair way to compute a multiplier: it is off by about 1e-7 where the cosine nears 0."""
    assert_passes(capsys, "warmup_cosine", schedule_in(torch.float32))
    assert_passes(capsys, "warmup_cosine", schedule_in(torch.float64))


@pytest.mark.parametrize(
    "fn", [schedule_in(torch.float16), schedule_in(torch.float32, off_by_one=True)], ids=["float16", "off_by_one"]
)
def test_a_schedule_that_is_off_still_fails(capsys: pytest.CaptureFixture[str], fn: Callable[..., Tensor]) -> None:
    result, line = run(capsys, "warmup_cosine", fn)
    assert not result and re.search(r": expected \S+, got \S+$", line), line


def test_checks_leave_the_global_rng_alone(capsys: pytest.CaptureFixture[str]) -> None:
    state = torch.random.get_rng_state()
    run(capsys, "mean_pool_rollout", mean_pool_ok)
    assert torch.equal(state, torch.random.get_rng_state())


def test_the_references_are_vitlabs_schedule_and_rollout() -> None:
    """The references written in the checks agree with vitlab.train.warmup_cosine and vitlab.rollout."""
    from vitlab.checks import training
    from vitlab.rollout import attention_rollout
    from vitlab.train import warmup_cosine

    for total, warmup, low in training._SCHEDULES:
        for step in range(total + 1):
            kwargs = {"total_steps": total, "warmup_steps": warmup, "min_ratio": low}
            assert training._warmup_cosine(step, **kwargs) == warmup_cosine(step, **kwargs)
    maps = [torch.randn(2, 3, 5, 5, generator=torch.Generator().manual_seed(i)).softmax(-1) for i in range(3)]
    torch.testing.assert_close(training._mean_pool_relevance(maps), attention_rollout(maps).mean(dim=1))
