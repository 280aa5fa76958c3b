"""Checks for the PiT chapter: the pooling layer between stages."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from vitlab.checks._core import Case, CheckResult, KnownWrong, generator, run_check, shape


def _pool(x: Tensor, weight: Tensor, bias: Tensor, *, stride: int = 2, padding: int = 1) -> Tensor:
    return F.conv2d(x, weight, bias, stride=stride, padding=padding, groups=x.shape[1])


def pit_pooling(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, weight, bias) -> pooled``: PiT's pooling of the spatial tokens.

    One grouped convolution (``groups=C``): kernel 3, stride 2, padding 1, with bias; each
    input channel ``c`` makes the two output channels ``2c`` and ``2c + 1`` from its own
    3x3 neighbourhoods, so the width doubles while the map halves. No 1x1 conv after it
    (ERRATA 10). This is ``Pooling.conv`` in :mod:`vitlab.models.pit`.

    Shape: x (B, C, H, W), weight (2C, 1, 3, 3), bias (2C,) -> (B, 2C, ceil(H/2), ceil(W/2)).
    """
    cases = []
    for seed, (B, C, H, W) in enumerate(((1, 2, 8, 8), (2, 3, 7, 9), (2, 4, 6, 10), (1, 1, 5, 5))):
        g = generator(seed)
        x = torch.randn(B, C, H, W, generator=g)
        weight = torch.randn(2 * C, 1, 3, 3, generator=g) / 3
        bias = torch.randn(2 * C, generator=g)
        cases.append(Case(f"x {shape(x)}, weight {shape(weight)}", (x, weight, bias)))
    wrongs = [
        KnownWrong(
            lambda x, w, b: _pool(x, w, b, padding=0),
            "the convolution is not padded; PiT pads by 1, so an H x W map becomes ceil(H/2) x ceil(W/2)",
        ),
        KnownWrong(
            lambda x, w, b: _pool(x, w, b, stride=1),
            "the stride is 1, so the map does not shrink; PiT pools with stride 2",
        ),
        KnownWrong(lambda x, w, b: _pool(x, w, torch.zeros_like(b)), "the bias is missing"),
        KnownWrong(
            lambda x, w, b: rearrange(_pool(x, w, b), "B (C two) H W -> B (two C) H W", two=2),
            "the output channels are ordered (2 C); with groups=C, input channel c makes output channels "
            "2c and 2c + 1",
        ),
    ]
    return run_check("pit_pooling", fn, cases, _pool, known_wrong=wrongs)
