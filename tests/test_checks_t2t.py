"""vitlab.checks.t2t_token_count and soft_split: right answers pass, each known mistake is
named where it first shows, and the references are what T2T-ViT's soft splits compute.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from test_checks import assert_named_mistake, assert_passes, run  # run: one printed line and a CheckResult
from torch import Tensor, nn

import vitlab

# ---------------------------------------------------------------- right answers, written independently


def count_ok(size: int, kernel: int, stride: int, padding: int) -> int:
    return math.floor((size + 2 * padding - kernel) / stride) + 1


def count_by_listing(size: int, kernel: int, stride: int, padding: int) -> int:
    return len(range(0, size + 2 * padding - kernel + 1, stride))  # the window starts


def split_ok(x: Tensor, kernel: int, stride: int, padding: int) -> Tensor:
    x = F.pad(x, (padding,) * 4)
    windows = x.unfold(2, kernel, stride).unfold(3, kernel, stride)  # (B, C, h, w, k, k)
    return rearrange(windows, "B C h w k1 k2 -> B (h w) (C k1 k2)")


@pytest.mark.parametrize("fn", [count_ok, count_by_listing], ids=["floor", "range"])
def test_token_count_right_answers_pass(capsys: pytest.CaptureFixture[str], fn: Any) -> None:
    assert_passes(capsys, "t2t_token_count", fn)
    assert [fn(*c) for c in ((224, 7, 4, 2), (56, 3, 2, 1), (28, 3, 2, 1))] == [56, 28, 14]  # the paper's grids


W = pytest.param  # (student function, words, erratum, first failing case)
COUNT_WRONG = [
    W(lambda n, k, s, p: (n + 2 * p - k) / (k - s) + 1, "the note's formula, (size", 9, "size=224,", id="note"),
    W(lambda n, k, s, p: (n + 2 * p - k) // (k - s) + 1, "divides by the overlap", 9, "size=224,", id="overlap"),
    W(lambda n, k, s, p: (n + 2 * p - k) / (k - s), "formula for the width", 9, "size=224,", id="note_width"),
    W(lambda n, k, s, p: (n + 2 * p - k) / s + 1, "not floored", None, "size=224,", id="no_floor"),
    W(lambda n, k, s, p: (n + 2 * p - k) // s, "+ 1 is missing", None, "size=224,", id="no_plus_one"),
    W(lambda n, k, s, p: n // s, "size // stride", None, "size=16,", id="size_over_stride"),
    W(lambda n, k, s, p: (n + p - k) // s + 1, "padding is counted once", None, "size=224,", id="padding"),
]  # fmt: skip


@pytest.mark.parametrize(("fn", "words", "erratum", "where"), COUNT_WRONG)
def test_token_count_mistakes_are_named(
    capsys: pytest.CaptureFixture[str], fn: Any, words: str, erratum: int | None, where: str
) -> None:
    assert_named_mistake(capsys, "t2t_token_count", fn, words, erratum)
    _, line = run(capsys, "t2t_token_count", fn)
    assert f"/10: {where}" in line  # the first case where the mistake shows


def test_size_over_stride_is_not_called_a_missing_plus_one(capsys: pytest.CaptureFixture[str]) -> None:
    # size // stride gives T2T's 56, 28, 14; the case (16, 3, 2, 0) tells it from "no + 1".
    _, line = run(capsys, "t2t_token_count", lambda n, k, s, p: n // s)
    assert "+ 1 is missing" not in line and "size // stride" in line


def test_soft_split_right_answers_pass_and_say_the_check_cannot_see_unfold(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for fn in (split_ok, lambda x, k, s, p: nn.Unfold(k, stride=s, padding=p)(x).transpose(1, 2)):
        result, line = run(capsys, "soft_split", fn)
        assert result and line.startswith("PASS soft_split: all 3 cases match the reference")
        assert "cannot tell whether you used F.unfold" in line


@pytest.mark.parametrize(
    ("fn", "words"),
    [
        W(lambda x, k, s, p: F.unfold(x, k, stride=s, padding=p), "transpose it to tokens", id="no_transpose"),
        W(lambda x, k, s, p: split_ok(x, k, s, 0), "padding is missing", id="no_padding"),
    ],
)
def test_soft_split_mistakes_are_named(capsys: pytest.CaptureFixture[str], fn: Any, words: str) -> None:
    assert_named_mistake(capsys, "soft_split", fn, words)
    _, line = run(capsys, "soft_split", fn)
    assert "cannot tell" not in line  # the note is for a pass only


def test_the_reference_count_is_the_models_grid() -> None:
    cfg = vitlab.get_config("t2t_vit_14")
    n, grids = cfg.img_size, []
    for k, s, p in ((7, 4, 2), (3, 2, 1), (3, 2, 1)):
        n = count_ok(n, k, s, p)
        grids.append(n)
    assert grids == list(cfg.grid_sizes)
    tokens = nn.Unfold(7, stride=4, padding=2)(torch.zeros(1, 3, 224, 224)).shape[-1]
    assert tokens == grids[0] ** 2
