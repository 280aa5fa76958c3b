"""The LeViT chapter's shrink-attention check: right answers pass, each known wrong answer is named."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

import vitlab
from conftest import run as check_line
from vitlab.checks import CheckResult
from vitlab.checks.levit import _shrink_index


def index_by_loops(resolution: int, stride: int) -> Tensor:
    """Written as the official code does it: loops over query and key positions."""
    keys = list(itertools.product(range(resolution), range(resolution)))
    queries = list(itertools.product(range(0, resolution, stride), repeat=2))
    rows = [[abs(qy - ky) * resolution + abs(qx - kx) for ky, kx in keys] for qy, qx in queries]
    return torch.tensor(rows, dtype=torch.long)


def index_by_broadcasting(resolution: int, stride: int) -> Tensor:
    """The chapter's solution style: meshgrid and broadcasting."""
    axis, q_axis = torch.arange(resolution), torch.arange(0, resolution, stride)
    keys = torch.stack(torch.meshgrid(axis, axis, indexing="ij")).flatten(1)
    queries = torch.stack(torch.meshgrid(q_axis, q_axis, indexing="ij")).flatten(1)
    offsets = (queries[:, :, None] - keys[:, None, :]).abs()
    return offsets[0] * resolution + offsets[1]


def with_one_change(change: str) -> Callable[[int, int], Tensor]:
    def fn(resolution: int, stride: int) -> Tensor:
        r, s = resolution, stride
        n_q = -(-r // s)
        q_axis = {
            "floor": torch.arange(r // s) * s,
            "unstrided": torch.arange(n_q),
            "centred": (torch.arange(0, r, s) + s // 2).clamp(max=r - 1),
            "plus_one": torch.arange((r + 1) // s) * s,
        }.get(change, torch.arange(0, r, s))
        axis = torch.arange(r)
        indexing = "xy" if change == "xy" else "ij"
        keys = torch.stack(torch.meshgrid(axis, axis, indexing=indexing)).flatten(1)
        queries = torch.stack(torch.meshgrid(q_axis, q_axis, indexing=indexing)).flatten(1)
        offsets = queries[:, :, None] - keys[:, None, :]
        offsets = offsets if change == "signed" else offsets.abs()
        index = offsets[0] * (n_q if change == "query_side" else r) + offsets[1]
        return index.T if change == "transposed" else index

    return fn


def run(capsys: pytest.CaptureFixture[str], fn: Callable[..., Any]) -> tuple[CheckResult, str]:
    """The check's result and the one line it printed."""
    return check_line(capsys, "levit_shrink_bias_indices", fn)


@pytest.mark.parametrize("fn", [index_by_loops, index_by_broadcasting])
def test_right_answers_pass(capsys: pytest.CaptureFixture[str], fn: Callable[..., Tensor]) -> None:
    result, line = run(capsys, fn)
    assert result.passed, line
    assert line == "PASS levit_shrink_bias_indices: all 5 cases match the reference"


@pytest.mark.parametrize(
    ("change", "words", "pitfall"),
    [
        ("floor", "r // stride queries per side", None),
        ("unstrided", "top-left corner of the key map", None),
        ("centred", "middle of each stride x stride cell", None),
        ("query_side", "numbered with the query map's side", None),
        ("xy", "x and y offsets are swapped", 13),
        ("transposed", "the index is (keys, queries)", None),
        ("plus_one", "(r + 1) // stride queries per side", None),
        ("signed", "the offsets are signed", None),
    ],
)
def test_wrong_answers_are_named(
    capsys: pytest.CaptureFixture[str], change: str, words: str, pitfall: int | None
) -> None:
    result, line = run(capsys, with_one_change(change))
    assert not result.passed
    assert line.startswith("FAIL levit_shrink_bias_indices [case ")
    tag = f"Pitfall {pitfall}: " if pitfall is not None else "a known mistake: "
    assert tag in line and words in line, line
    assert result.pitfall == pitfall


def test_a_random_answer_fails_without_a_name(capsys: pytest.CaptureFixture[str]) -> None:
    g = torch.Generator().manual_seed(0)

    def random_index(resolution: int, stride: int) -> Tensor:
        n_q = -(-resolution // stride)
        return torch.randint(0, resolution**2, (n_q**2, resolution**2), generator=g)

    result, line = run(capsys, random_index)
    assert not result.passed and "known mistake" not in line and "Pitfall" not in line


def test_the_reference_is_the_models_index() -> None:
    """The check's reference is the index LeViT-128S's shrink attentions hold."""
    model = vitlab.create_model("levit_128s")
    for stage, side in zip(model.stages[1:], (14, 7), strict=True):
        layer = stage.downsample.attn_downsample
        torch.testing.assert_close(index_by_loops(side, 2), layer.attention_bias_idxs)
        torch.testing.assert_close(_shrink_index(side, 2), layer.attention_bias_idxs)  # written in the check


def test_uint8_indices_are_named_a_mask(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, lambda r, s: index_by_loops(r, s).to(torch.uint8))
    assert not result.passed and "torch.uint8, which PyTorch reads as a mask" in line, line
    result, line = run(capsys, lambda r, s: index_by_loops(r, s).to(torch.int16))
    assert not result.passed and "indexes with torch.long" in line, line


def test_not_implemented_and_crash(capsys: pytest.CaptureFixture[str]) -> None:
    def todo(*args: object) -> Tensor:
        raise NotImplementedError

    result, line = run(capsys, todo)
    assert result.status == "not implemented" and line.startswith("TODO")
    result, line = run(capsys, lambda *a: 1 / 0)
    assert not result.passed and "ZeroDivisionError" in line
