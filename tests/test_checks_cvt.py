"""The CvT chapter's "avg" attention check: right answers pass, each known wrong answer is named."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from conftest import run as check_line
from vitlab.checks import CheckResult

# ---------------------------------------------------------------- the "avg" projection (exercise 2)


def avg_attention_ok(x: Tensor, grid_size: tuple[int, int], attn: nn.Module, *, change: str | None = None) -> Tensor:
    """Written without einops: nn.AvgPool2d for keys and values, plain reshapes; ``change`` injects one mistake."""
    B, _, C = x.shape
    H, W = grid_size
    h = attn.num_heads
    cls, tokens = (x[:, :1], x[:, 1:]) if attn.with_cls_token else (None, x)
    fmap = tokens.transpose(1, 2).reshape(B, C, H, W)
    pool = nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=change != "floor", count_include_pad=change != "exclude_pad")
    if change == "pool_2":
        pool = nn.AvgPool2d(2, stride=2, ceil_mode=True)
    kv = pool(fmap).flatten(2).transpose(1, 2)
    q, k, v = (kv if change == "q_pooled" else tokens), kv, kv
    if cls is not None and change != "cls_dropped":
        q = torch.cat([cls, q], dim=1)
        if change != "cls_query_only":
            k, v = torch.cat([cls, k], dim=1), torch.cat([cls, v], dim=1)

    def heads(t: Tensor) -> Tensor:  # (h d), or (d h) as a slip
        if change == "split_d_h":
            return t.reshape(B, t.shape[1], C // h, h).permute(0, 3, 1, 2)
        return t.reshape(B, t.shape[1], h, C // h).transpose(1, 2)

    q, k, v = heads(attn.proj_q(q)), heads(attn.proj_k(k)), heads(attn.proj_v(v))
    scale = {"head_dim_scale": (C // h) ** -0.5, "unscaled": 1, "scaled_after": 1}.get(change or "", attn.scale)
    logits = q @ k.transpose(-2, -1) * scale
    if change == "naive_softmax":
        out = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True) @ v
    else:
        out = torch.softmax(logits, dim=-1) * (attn.scale if change == "scaled_after" else 1) @ v
    if change == "merged_by_reshape":
        out = out.reshape(B, -1, C)
    else:
        out = (out.permute(0, 2, 3, 1) if change == "split_d_h" else out.transpose(1, 2)).reshape(B, -1, C)
    return out if change == "no_proj" else attn.proj(out)


def run_avg(capsys: pytest.CaptureFixture[str], fn: Callable[..., Any]) -> tuple[CheckResult, str]:
    """The check's result and the one line it printed."""
    return check_line(capsys, "cvt_avg_attention", fn)


def test_avg_right_answer_passes(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run_avg(capsys, avg_attention_ok)
    assert result.passed, line
    assert line == "PASS cvt_avg_attention: all 5 cases match the reference"


@pytest.mark.parametrize(
    ("change", "words", "pitfall"),
    [
        ("floor", "rounded down (AvgPool2d without ceil_mode=True)", None),
        ("exclude_pad", "count_include_pad=False", None),
        ("q_pooled", "the queries were pooled too", None),
        ("cls_dropped", "never re-attached", None),
        ("cls_query_only", "re-attached to the queries only", None),
        ("head_dim_scale", "scaled by head_dim**-0.5", 19),
        ("naive_softmax", "exp(x) / sum(exp(x)), which overflows", None),
        ("pool_2", "pooled over 2 x 2 windows", None),
        ("unscaled", "the logits are not scaled", None),
        ("scaled_after", "scaled after the softmax", None),
        ("merged_by_reshape", "merged by a reshape", None),
        ("split_d_h", "split into heads (d h)", None),
        ("no_proj", "output projection is missing", None),
    ],
)
def test_avg_wrong_answers_are_named(
    capsys: pytest.CaptureFixture[str], change: str, words: str, pitfall: int | None
) -> None:
    result, line = run_avg(capsys, lambda x, g, a: avg_attention_ok(x, g, a, change=change))
    assert not result.passed and line.startswith("FAIL cvt_avg_attention [case ")
    tag = f"Pitfall {pitfall}: " if pitfall is not None else "a known mistake: "
    assert tag in line and words in line, line


def test_avg_the_convolutional_projection_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    """The chapter's own layer (depthwise conv + BatchNorm) is not the 'avg' projection."""
    result, line = run_avg(capsys, lambda x, g, a: a(x, g))
    assert not result.passed and "chapter's convolutional projection" in line, line


def test_avg_a_random_answer_fails_without_a_name(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run_avg(capsys, lambda x, g, a: torch.randn_like(x))
    assert not result.passed and "known mistake" not in line and "Pitfall" not in line


def test_avg_keys_round_up() -> None:
    """ceil_mode=True: a 14 x 14 map gives 8 x 8 keys (the stride-2 convolution gives 7 x 7)."""
    pool = nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True)
    assert pool(torch.zeros(1, 1, 14, 14)).shape[-2:] == (8, 8)
    assert F.conv2d(torch.zeros(1, 1, 14, 14), torch.zeros(1, 1, 3, 3), stride=2, padding=1).shape[-2:] == (7, 7)
