"""Checks for the CvT chapter: the squeezed key/value projection."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from vitlab.checks._core import Case, CheckResult, KnownWrong, generator, run_check, shape


def _squeeze(
    x: Tensor, grid_size: tuple[int, int], weight: Tensor, stride: int, *, naive_map: bool = False,
    padding: int | None = None, naive_tokens: bool = False,
) -> Tensor:  # fmt: skip
    """Depthwise strided conv on the token map; the keywords turn on known wrong answers."""
    B, N, C = x.shape
    H, W = grid_size
    fmap = x.reshape(B, C, H, W) if naive_map else rearrange(x, "B (H W) C -> B C H W", H=H, W=W)
    k = weight.shape[-1]
    out = F.conv2d(fmap, weight, stride=stride, padding=k // 2 if padding is None else padding, groups=C)
    return out.reshape(B, -1, C) if naive_tokens else rearrange(out, "B C H W -> B (H W) C")


def squeezed_kv_projection(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, grid_size, weight, stride) -> tokens``: CvT's squeezed K/V projection.

    The tokens go back on their ``H x W`` map (row-major, ``"B (H W) C -> B C H W"``), a
    depthwise convolution (``groups=C``, one ``k x k`` filter per channel, padding
    ``k // 2``, no bias) with ``stride`` shrinks the map, and it is flattened back to
    tokens. With stride 2, keys and values have about 4x fewer tokens than queries. This
    is :class:`vitlab.models.cvt.ConvProjection` without its BatchNorm.

    Shape: x (B, H*W, C), grid_size (H, W), weight (C, 1, k, k), stride int
    -> (B, H'*W', C), H' = ceil(H / stride), W' = ceil(W / stride) (k odd).
    """
    cases = []
    shapes = ((1, 4, 4, 4, 3, 2), (2, 5, 7, 6, 3, 2), (2, 6, 4, 3, 3, 1), (1, 7, 5, 2, 5, 2))
    for seed, (B, H, W, C, k, s) in enumerate(shapes):
        g = generator(seed)
        x = torch.randn(B, H * W, C, generator=g)
        weight = torch.randn(C, 1, k, k, generator=g) / k
        label = f"x {shape(x)}, grid_size={(H, W)}, weight {shape(weight)}, stride={s}"
        cases.append(Case(label, (x, (H, W), weight, s)))
    wrongs = [
        KnownWrong(
            lambda *args: _squeeze(*args, naive_map=True),
            "the tokens were reshaped straight to (B, C, H, W), which scrambles them; put them on the map with "
            "rearrange(x, 'B (H W) C -> B C H W', H=H, W=W) (a transpose, then a reshape)",
        ),
        KnownWrong(
            lambda *args: _squeeze(*args, naive_tokens=True),
            "the map was reshaped straight back to (B, N', C); flatten it with rearrange('B C H W -> B (H W) C')",
        ),
        KnownWrong(
            lambda *args: _squeeze(*args, padding=0),
            "the convolution is not padded; CvT pads by k // 2, so the stride alone sets the size",
        ),
    ]
    return run_check("squeezed_kv_projection", fn, cases, _squeeze, known_wrong=wrongs)
