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
from torch import Tensor, nn

import vitlab
import vitlab.checks
from conftest import assert_named_mistake, assert_passes, run  # run: one printed line and a CheckResult

# ---------------------------------------------------------------- right answers, written independently


def count_ok(size: int, kernel: int, stride: int, padding: int) -> int:
    return math.floor((size + 2 * padding - kernel) / stride) + 1


def count_by_listing(size: int, kernel: int, stride: int, padding: int) -> int:
    return len(range(0, size + 2 * padding - kernel + 1, stride))  # the window starts


def split_ok(x: Tensor, kernel: int, stride: int, padding: int) -> Tensor:
    x = F.pad(x, (padding,) * 4)
    windows = x.unfold(2, kernel, stride).unfold(3, kernel, stride)  # (B, C, h, w, k, k)
    return rearrange(windows, "B C h w k1 k2 -> B (h w) (C k1 k2)")


def windows_channels_last(x: Tensor, kernel: int, stride: int, padding: int) -> Tensor:
    """split_ok with each window flattened (k1 k2 c), as patchify does."""
    windows = F.pad(x, (padding,) * 4).unfold(2, kernel, stride).unfold(3, kernel, stride)
    return rearrange(windows, "B C h w k1 k2 -> B (h w) (k1 k2 C)")


def pad(x: Tensor, padding: int, mode: str) -> Tensor:
    return F.pad(x, (padding,) * 4, mode=mode)


def tf_same(x: Tensor, kernel: int, stride: int) -> Tensor:
    """TensorFlow's padding="SAME": ceil(n / stride) windows, the odd padding row and column at the end."""
    pads = []
    for n in (x.shape[3], x.shape[2]):
        total = max((math.ceil(n / stride) - 1) * stride + kernel - n, 0)
        pads += [total // 2, total - total // 2]
    return F.pad(x, pads)


@pytest.mark.parametrize("fn", [count_ok, count_by_listing], ids=["floor", "range"])
def test_token_count_right_answers_pass(capsys: pytest.CaptureFixture[str], fn: Any) -> None:
    assert_passes(capsys, "t2t_token_count", fn)
    assert [fn(*c) for c in ((224, 7, 4, 2), (56, 3, 2, 1), (28, 3, 2, 1))] == [56, 28, 14]  # the paper's grids


W = pytest.param  # (student function, words, pitfall, first failing case)
COUNT_WRONG = [
    W(lambda n, k, s, p: (n + 2 * p - k) / (k - s) + 1, "k - s, and is not floored", 11, "size=224,", id="note"),
    W(lambda n, k, s, p: (n + 2 * p - k) // (k - s) + 1, "this divides by the overlap", 11, "size=224,",
      id="overlap"),
    W(lambda n, k, s, p: (n + 2 * p - k) / (k - s), "also drops the + 1", 11, "size=224,", id="note_width"),
    W(lambda n, k, s, p: (n + 2 * p - k) / s + 1, "not floored", None, "size=224,", id="no_floor"),
    W(lambda n, k, s, p: (n + 2 * p - k) // s, "+ 1 is missing", None, "size=224,", id="no_plus_one"),
    W(lambda n, k, s, p: n // s, "size // stride", None, "size=16,", id="size_over_stride"),
    W(lambda n, k, s, p: (n + p - k) // s + 1, "padding is counted once", None, "size=224,", id="padding"),
]  # fmt: skip


@pytest.mark.parametrize(("fn", "words", "pitfall", "where"), COUNT_WRONG)
def test_token_count_mistakes_are_named(
    capsys: pytest.CaptureFixture[str], fn: Any, words: str, pitfall: int | None, where: str
) -> None:
    assert_named_mistake(capsys, "t2t_token_count", fn, words, pitfall)
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
        W(lambda x, k, s, p: windows_channels_last(x, k, s, p), "flattened (k1 k2 c)", id="window_order"),
        W(lambda x, k, s, p: split_ok(F.pad(x, (p, p, 0, 0)), k, s, 0), "only the width is padded", id="width_only"),
        W(lambda x, k, s, p: split_ok(pad(x, p, "reflect"), k, s, 0), "padded by reflection", id="reflect"),
        W(lambda x, k, s, p: split_ok(pad(x, p, "replicate"), k, s, 0), "repeating its border", id="replicate"),
        W(lambda x, k, s, p: split_ok(tf_same(x, k, s), k, s, 0), "lopsided, TensorFlow's 'SAME'", id="same"),
        W(lambda x, k, s, p: split_ok(F.pad(x, (p, 0, p, 0)), k, s, 0), "top and left only", id="before"),
        W(lambda x, k, s, p: split_ok(F.pad(x, (0, p, 0, p)), k, s, 0), "bottom and right only", id="after"),
        W(lambda x, k, s, p: split_ok(F.pad(x, (p,) * 4), k, s, p), "padded twice", id="twice"),
        W(lambda x, k, s, p: split_ok(x, k, s, 1), "hard-coded", id="padding_1"),
        W(lambda x, k, s, p: split_ok(x, k, s, 2), "hard-coded", id="padding_2"),
        W(lambda x, k, s, p: F.unfold(x, k, stride=s, padding=p).reshape(x.shape[0], -1, x.shape[1] * k * k),
          "reshaped to (B, L, C*k*k)", id="reshape_for_transpose"),
        W(lambda x, k, s, p: rearrange(F.pad(x, (p,) * 4).unfold(2, k, s).unfold(3, k, s),
                                       "B C h w k1 k2 -> B (w h) (C k1 k2)"), "column by column", id="columns"),
    ],
)  # fmt: skip
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


# --- t2t_grids: a non-square image through all three soft splits ---


def grids_by_unfold(height: int, width: int) -> torch.Tensor:
    """Written independently: run nn.Unfold three times on a one-channel image and read the grids."""
    x, grids = torch.zeros(1, 1, height, width), []
    for k, s, p in ((7, 4, 2), (3, 2, 1), (3, 2, 1)):
        cols = torch.nn.functional.unfold(x, k, stride=s, padding=p)  # (1, k*k, L)
        rows_out = (x.shape[2] + 2 * p - k) // s + 1
        cols_out = cols.shape[-1] // rows_out
        grids.append((rows_out, cols_out))
        x = torch.zeros(1, 1, rows_out, cols_out)
    return torch.tensor(grids)


def grids_formula(height: int, width: int, side=lambda n, k, s, p: (n + 2 * p - k) // s + 1) -> torch.Tensor:
    out, h, w = [], height, width
    for k, s, p in ((7, 4, 2), (3, 2, 1), (3, 2, 1)):
        h, w = side(h, k, s, p), side(w, k, s, p)
        out.append((h, w))
    return torch.tensor(out)


GRID_WRONG = {
    "square": (lambda h, w: grids_formula(h, h), "square image assumed"),
    "swapped": (lambda h, w: grids_formula(h, w).flip(-1), "swapped"),
    "size // stride": (lambda h, w: grids_formula(h, w, lambda n, k, s, p: n // s), "n // stride"),
    "overlap": (lambda h, w: grids_formula(h, w, lambda n, k, s, p: (n + 2 * p - k) // (k - s) + 1), "overlap"),
    "no + 1": (lambda h, w: grids_formula(h, w, lambda n, k, s, p: (n + 2 * p - k) // s), "+ 1 is missing"),
    # on 224 x 320 this agrees with "no + 1" (55 either way): named for what it is, not a missing + 1
    "padding once": (lambda h, w: grids_formula(h, w, lambda n, k, s, p: (n + p - k) // s + 1), "counted once"),
    "ceil": (
        lambda h, w: grids_formula(h, w, lambda n, k, s, p: math.ceil((n + 2 * p - k) / s) + 1),
        "rounded up",
    ),
    "ceil(n / s)": (lambda h, w: grids_formula(h, w, lambda n, k, s, p: math.ceil(n / s)), "'SAME' count"),
    "round": (lambda h, w: grids_formula(h, w, lambda n, k, s, p: round((n + 2 * p - k) / s) + 1), "nearest"),
    "unchained": (
        lambda h, w: torch.tensor(
            [((h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1) for k, s, p in ((7, 4, 2), (3, 2, 1), (3, 2, 1))]
        ),
        "counted from the image's size",
    ),
}


def grids_plus_one(height: int, width: int) -> torch.Tensor:
    """(n + 1) // s: right for T2T's three splits, where 2p - k = -(s - 1) (a student's shortcut)."""
    return grids_formula(height, width, lambda n, k, s, p: (n + 1) // s)


@pytest.mark.parametrize("fn", [grids_by_unfold, grids_formula, grids_plus_one], ids=["unfold", "formula", "plus_one"])
def test_t2t_grids_right_answers_pass(fn, capsys) -> None:
    result = vitlab.checks.t2t_grids(fn)
    assert result.passed, capsys.readouterr().out


@pytest.mark.parametrize("name", list(GRID_WRONG))
def test_t2t_grids_wrong_answers_are_named(name: str) -> None:
    fn, words = GRID_WRONG[name]
    result = vitlab.checks.t2t_grids(fn)
    assert not result.passed
    assert words in result.message, result.message
    assert name == "no + 1" or "+ 1 is missing" not in result.message


def test_t2t_grids_random_answer_and_stub_fail() -> None:
    assert not vitlab.checks.t2t_grids(lambda h, w: torch.randint(1, 100, (3, 2))).passed

    def stub(height, width):
        raise NotImplementedError

    assert vitlab.checks.t2t_grids(stub).status == "not implemented"
