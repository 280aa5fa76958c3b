"""vitlab.checks.mean_pool_rollout (chapter 12, exercise 2): a right answer passes, each known mistake is named.

The right answer is written independently of the check's reference (vitlab.rollout):
A + I renormalised (the same as 0.5 A + 0.5 I for softmax rows), a loop of batched products.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

from conftest import run as check_line
from vitlab.checks import CheckResult


def block_matrices(maps: list[Tensor], *, residual: bool = True) -> list[Tensor]:
    N = maps[0].shape[-1]
    mats = [a.sum(1) / a.shape[1] + (torch.eye(N) if residual else 0) for a in maps]
    return [m / m.sum(-1, keepdim=True) for m in mats]


def rollout(maps: list[Tensor], *, residual: bool = True, reverse: bool = False) -> Tensor:
    mats = block_matrices(maps, residual=residual)
    result = mats[0]
    for m in mats[1:]:
        result = torch.bmm(result, m) if reverse else torch.bmm(m, result)
    return result


def mean_pool_ok(maps: list[Tensor]) -> Tensor:
    R = rollout(maps)
    return R.sum(dim=1) / R.shape[1]


def run(capsys: pytest.CaptureFixture[str], fn: Callable[..., Any]) -> tuple[CheckResult, str]:
    """The check's result and the one line it printed."""
    return check_line(capsys, "mean_pool_rollout", fn)


def test_a_right_answer_passes(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, mean_pool_ok)
    assert result and line.startswith("PASS mean_pool_rollout: all 4 cases"), line


@pytest.mark.parametrize(
    ("fn", "words"),
    [
        pytest.param(lambda maps: rollout(maps)[:, 0], "the class token's rollout", id="class_row"),
        pytest.param(lambda maps: rollout(maps).mean(dim=-1), "the columns are averaged", id="columns"),
        pytest.param(lambda maps: rollout(maps, residual=False).mean(dim=1), "residual is left out", id="residual"),
        pytest.param(lambda maps: rollout(maps, reverse=True).mean(dim=1), "wrong order", id="order"),
        pytest.param(lambda maps: block_matrices(maps)[-1].mean(dim=1), "only the last block", id="last_block"),
    ],
)
def test_known_mistakes_are_named(capsys: pytest.CaptureFixture[str], fn: Callable[..., Any], words: str) -> None:
    result, line = run(capsys, fn)
    assert not result and line.startswith("FAIL mean_pool_rollout") and words in line, line


def test_an_unexplained_answer_and_a_stub_fail(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, lambda maps: mean_pool_ok(maps) + 0.01)
    assert not result and line.startswith("FAIL mean_pool_rollout [case 1/4"), line

    def stub(maps: list[Tensor]) -> Tensor:
        raise NotImplementedError

    result, line = run(capsys, stub)
    assert not result and line == "TODO mean_pool_rollout: not implemented yet"
