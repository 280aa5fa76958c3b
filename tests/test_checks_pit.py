"""The PiT chapter's checks: right answers pass, each known wrong answer is named."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from conftest import run as check_line
from vitlab.checks import CheckResult
from vitlab.checks.pit import _stage


def stage_ok(
    tokens: Tensor,
    grid_size: tuple[int, int],
    cw: Tensor,
    cb: Tensor,
    fw: Tensor,
    fb: Tensor,
) -> Tensor:
    """Written without einops or vitlab: transpose/reshape, grouped conv, matmul."""
    B, _, C = tokens.shape
    cls, spatial = tokens[:, :1], tokens[:, 1:]
    fmap = spatial.transpose(1, 2).reshape(B, C, *grid_size)
    pooled = F.conv2d(fmap, cw, cb, stride=2, padding=1, groups=C)
    out = pooled.flatten(2).transpose(1, 2)
    return torch.cat([cls @ fw.T + fb, out], dim=1)


def stage_ok_unfold(
    tokens: Tensor,
    grid_size: tuple[int, int],
    cw: Tensor,
    cb: Tensor,
    fw: Tensor,
    fb: Tensor,
):
    """A second style: no groups argument, windows cut with F.unfold and weighted by hand."""
    B, _, C = tokens.shape
    H, W = grid_size
    fmap = tokens[:, 1:].permute(0, 2, 1).reshape(B, C, H, W).repeat_interleave(2, dim=1)  # (B, 2C, H, W)
    windows = F.unfold(fmap, 3, padding=1, stride=2).reshape(B, 2 * C, 9, -1)  # (B, 2C, 9, L)
    pooled = (windows * cw.reshape(1, 2 * C, 9, 1)).sum(2) + cb[None, :, None]  # (B, 2C, L)
    return torch.cat([F.linear(tokens[:, :1], fw, fb), pooled.transpose(1, 2)], dim=1)


def with_one_change(change: str) -> Callable[..., Tensor]:
    def fn(
        tokens: Tensor,
        grid_size: tuple[int, int],
        cw: Tensor,
        cb: Tensor,
        fw: Tensor,
        fb: Tensor,
    ) -> Tensor:
        B, _, C = tokens.shape
        H, W = grid_size
        if change == "grid_w_h":
            W, H = grid_size
        cls, spatial = tokens[:, :1], tokens[:, 1:]
        if change == "naive_map":
            fmap = spatial.reshape(B, C, H, W)
        elif change == "swapped_hw":
            fmap = spatial.transpose(1, 2).reshape(B, C, W, H).transpose(2, 3)
        else:
            fmap = spatial.transpose(1, 2).reshape(B, C, H, W)
        if change == "repeated":  # the channels tiled, one group per output channel
            pooled = F.conv2d(fmap.repeat(1, 2, 1, 1), cw, cb, stride=2, padding=1, groups=2 * C)
        elif change in ("reflect", "replicate"):
            pooled = F.conv2d(F.pad(fmap, (1, 1, 1, 1), mode=change), cw, cb, stride=2, groups=C)
        elif change == "same":  # TensorFlow's SAME, k 3, stride 2: an even side gets no padding before it
            pooled = F.conv2d(F.pad(fmap, (W % 2, 1, H % 2, 1)), cw, cb, stride=2, groups=C)
        elif change in ("before", "after", "twice"):  # F.pad's (left, right, top, bottom)
            sides = {"before": (1, 0, 1, 0), "after": (0, 1, 0, 1), "twice": (1, 1, 1, 1)}[change]
            pooled = F.conv2d(F.pad(fmap, sides), cw, cb, stride=2, padding=int(change == "twice"), groups=C)
        else:
            bias = None if change == "conv_bias" else cb
            pooled = F.conv2d(fmap, cw, bias, stride=2, padding=0 if change == "no_padding" else 1, groups=C)
        if change == "naive_tokens":
            out = pooled.reshape(B, -1, 2 * C)
        elif change in ("swapped_hw", "columns"):
            out = pooled.transpose(2, 3).flatten(2).transpose(1, 2)
        else:
            out = pooled.flatten(2).transpose(1, 2)
        cls_out = F.linear(cls, fw, None if change == "fc_bias" else fb)
        if change == "fc_reshaped":  # (out, in) read as (in, out)
            cls_out = cls @ fw.reshape(C, 2 * C) + fb
        if change == "cls_conv":
            cls_out = F.conv2d(cls.reshape(B, C, 1, 1), cw, cb, padding=1, stride=2, groups=C).reshape(B, 1, 2 * C)
        if change == "no_cls":
            return out
        if change == "cls_last":
            return torch.cat([out, cls_out], dim=1)
        return torch.cat([cls_out, out], dim=1)

    return fn


def run(capsys: pytest.CaptureFixture[str], fn: Callable[..., Any]) -> tuple[CheckResult, str]:
    """The check's result and the one line it printed."""
    return check_line(capsys, "pit_pooling_stage", fn)


@pytest.mark.parametrize("fn", [stage_ok, stage_ok_unfold])
def test_right_answers_pass(capsys: pytest.CaptureFixture[str], fn: Callable[..., Tensor]) -> None:
    result, line = run(capsys, fn)
    assert result.passed, line
    assert line == "PASS pit_pooling_stage: all 4 cases match the reference"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ("naive_map", "reshaped straight to (B, C, H, W)"),
        ("swapped_hw", "height and width are swapped"),
        ("naive_tokens", "reshaped straight back"),
        ("cls_conv", "cls token was pooled with the grid"),
        ("no_cls", "cls token is missing"),
        ("cls_last", "put back at the end"),
        ("no_padding", "not padded"),
        ("repeated", "tiled with repeat"),
        ("reflect", "padded by reflection"),
        ("replicate", "repeating its border"),
        ("same", "lopsided, TensorFlow's 'SAME'"),
        ("before", "padded on the top and left only"),
        ("after", "padded on the bottom and right only"),
        ("twice", "padded twice"),
        ("grid_w_h", "grid_size was unpacked as (W, H)"),
        ("columns", "numbered column by column"),
        ("fc_reshaped", "reshaped where it must be transposed"),
        ("conv_bias", "the convolution's bias is missing"),
        ("fc_bias", "the Linear's bias is missing"),
    ],
)
def test_wrong_answers_are_named(capsys: pytest.CaptureFixture[str], change: str, words: str) -> None:
    result, line = run(capsys, with_one_change(change))
    assert not result.passed
    assert line.startswith("FAIL pit_pooling_stage [case ")
    assert words in line, line


def test_the_reference_is_vitlabs_pooling_layer() -> None:
    """The check's reference (written in the check) agrees with the PiT model's own pooling stage."""
    import vitlab

    model = vitlab.create_model("pit_ti_224").eval()
    pool = model.transformers[1].pool
    g = torch.Generator().manual_seed(0)
    tokens = torch.randn(2, 1 + 27 * 27, 64, generator=g)
    with torch.no_grad():
        fmap = tokens[:, 1:].transpose(1, 2).reshape(2, 64, 27, 27)
        pooled, cls = pool(fmap, tokens[:, :1])
        expected = torch.cat([cls, pooled.flatten(2).transpose(1, 2)], dim=1)
        got = _stage(tokens, (27, 27), pool.conv.weight, pool.conv.bias, pool.fc.weight, pool.fc.bias)
    torch.testing.assert_close(got, expected)


def test_not_implemented_and_crash(capsys: pytest.CaptureFixture[str]) -> None:
    def todo(*args: object) -> Tensor:
        raise NotImplementedError

    result, line = run(capsys, todo)
    assert result.status == "not implemented" and line.startswith("TODO")
    result, line = run(capsys, lambda *a: 1 / 0)
    assert not result.passed and "ZeroDivisionError" in line
