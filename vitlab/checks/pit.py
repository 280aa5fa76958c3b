"""Checks for the PiT chapter: the pooling convolution and the whole pooling layer on tokens."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from vitlab.checks._core import (
    PADDED_BY,
    SCRAMBLING_RESHAPE,
    SWAPPED_GRID,
    Case,
    CheckResult,
    KnownWrong,
    generator,
    run_check,
    same_padding,
    shape,
)


def _pool(
    x: Tensor, weight: Tensor, bias: Tensor, *, stride: int = 2, padding: int = 1, pad_mode: str = "zeros",
    repeated: bool = False,
) -> Tensor:  # fmt: skip
    """PiT's grouped convolution; the keywords make known wrong answers (``pad_mode``: ``"reflect"``,
    ``"replicate"`` or ``"same"``; ``repeated``: the input channels tiled by ``repeat``, one group each)."""
    if pad_mode == "same":
        x, padding = same_padding(x, 3, stride), 0
    elif pad_mode != "zeros":
        x, padding = F.pad(x, [padding] * 4, mode=pad_mode), 0
    if repeated:  # input channel j % C feeds output channel j
        return F.conv2d(x.repeat(1, 2, 1, 1), weight, bias, stride=stride, padding=padding, groups=weight.shape[0])
    return F.conv2d(x, weight, bias, stride=stride, padding=padding, groups=x.shape[1])


# Two slips of a pooling written without groups=: the channels tiled with repeat, and the padding.
_REPEATED = (
    "the input channels are tiled with repeat (c0 c1 ... c0 c1 ...), so output channel j reads input channel "
    "j % C; with groups=C, output channels 2c and 2c + 1 both read input channel c: repeat_interleave(2, dim=1)"
)
_PADDING_WRONGS = tuple((mode, message) for mode, message in PADDED_BY.items())


def pit_pooling(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, weight, bias) -> pooled``: PiT's pooling of the spatial tokens.

    One grouped convolution (``groups=C``): kernel 3, stride 2, padding 1, with bias; each
    input channel ``c`` makes the two output channels ``2c`` and ``2c + 1`` from its own
    3x3 neighbourhoods, so the width doubles while the map halves. No 1x1 conv after it
    (pitfall 12). This is ``Pooling.conv`` in :mod:`vitlab.models.pit`.

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
            "the output channels are ordered (2 C); with groups=C, input channel c makes output channels 2c and 2c + 1",
        ),
        KnownWrong(lambda x, w, b: _pool(x, w, b, repeated=True), _REPEATED),
        *(
            KnownWrong(lambda x, w, b, mode=mode: _pool(x, w, b, pad_mode=mode), message)
            for mode, message in _PADDING_WRONGS
        ),
    ]
    return run_check("pit_pooling", fn, cases, _pool, known_wrong=wrongs)


def _stage(
    tokens: Tensor, grid_size: tuple[int, int], conv_weight: Tensor, conv_bias: Tensor, fc_weight: Tensor,
    fc_bias: Tensor, *, wrong: str | None = None,
) -> Tensor:  # fmt: skip
    """vitlab's ``Pooling`` between the reshapes of a PiT stage; ``wrong`` picks a known mistake."""
    from vitlab.models.pit import (
        Pooling,
    )  # here: the checks package stays light to import

    B, _, C = tokens.shape
    H, W = grid_size
    pool = Pooling(C, 2 * C).to(tokens.dtype)
    weights = {"conv.weight": conv_weight, "conv.bias": conv_bias, "fc.weight": fc_weight, "fc.bias": fc_bias}
    pool.load_state_dict(weights)
    cls, spatial = tokens[:, :1], tokens[:, 1:]  # (B, 1, C), (B, H*W, C)
    if wrong == "naive_map":
        fmap = spatial.reshape(B, C, H, W)
    elif wrong == "swapped_hw":
        fmap = rearrange(spatial, "B (W H) C -> B C H W", H=H, W=W)
    else:
        fmap = rearrange(spatial, "B (H W) C -> B C H W", H=H, W=W)
    if wrong == "no_padding":
        pool.conv.padding = (0, 0)
    pooled, cls_out = pool(fmap, cls)  # (B, 2C, H', W'), (B, 1, 2C)
    if wrong in ("repeated", *PADDED_BY):
        pooled = _pool(fmap, conv_weight, conv_bias, pad_mode=wrong if wrong in PADDED_BY else "zeros",
                       repeated=wrong == "repeated")  # fmt: skip
    if wrong == "cls_conv":  # the cls token through the conv, as a 1 x 1 map
        cls_out = pool.conv(rearrange(cls, "B 1 C -> B C 1 1")).flatten(1)[:, None]
    if wrong == "naive_tokens":
        out = pooled.reshape(B, -1, 2 * C)
    elif wrong == "swapped_hw":
        out = rearrange(pooled, "B C H W -> B (W H) C")
    else:
        out = rearrange(pooled, "B C H W -> B (H W) C")
    if wrong == "cls_last":
        return torch.cat([out, cls_out], dim=1)
    if wrong == "no_cls":
        return out
    return torch.cat([cls_out, out], dim=1)  # (B, 1 + H'*W', 2C)


def pit_pooling_stage(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(tokens, grid_size, conv_weight, conv_bias, fc_weight, fc_bias) -> tokens``.

    PiT's whole pooling layer between two stages, on tokens: split off the cls token (the
    first token); fold the ``H * W`` spatial tokens, numbered row by row, into the map
    ``(B, C, H, W)``; pool it with one grouped convolution (``groups=C``, ``2C`` outputs,
    kernel 3, stride 2, padding 1, with bias, and no 1x1 conv after it: pitfall 12);
    flatten it back to tokens row by row; send the cls token through the Linear
    ``C -> 2C`` (``fc_weight``, ``fc_bias``, as ``nn.Linear`` stores them) and put it
    first again. This is :class:`vitlab.models.pit.Pooling` with the reshapes of the stage
    around it. The check tries non-square grids.

    Shape: tokens (B, 1 + H*W, C), grid_size (H, W), conv_weight (2C, 1, 3, 3),
    conv_bias (2C,), fc_weight (2C, C), fc_bias (2C,) -> (B, 1 + H'*W', 2C),
    H' = ceil(H / 2), W' = ceil(W / 2).
    """
    cases = []
    for seed, (B, C, H, W) in enumerate(((1, 2, 4, 4), (2, 3, 5, 7), (2, 4, 6, 3), (1, 2, 7, 7))):
        g = generator(100 + seed)
        tokens = torch.randn(B, 1 + H * W, C, generator=g)
        weights = (
            torch.randn(2 * C, 1, 3, 3, generator=g) / 3,
            torch.randn(2 * C, generator=g),
            torch.randn(2 * C, C, generator=g) / C**0.5,
            torch.randn(2 * C, generator=g),
        )
        cases.append(
            Case(
                f"tokens {shape(tokens)}, grid_size={(H, W)}",
                (tokens, (H, W), *weights),
            )
        )

    def wrong(kind: str) -> Callable[..., Tensor]:
        return lambda *args: _stage(*args, wrong=kind)

    wrongs = [
        KnownWrong(
            wrong("naive_map"),
            SCRAMBLING_RESHAPE,
        ),
        KnownWrong(
            wrong("swapped_hw"),
            SWAPPED_GRID,
        ),
        KnownWrong(
            wrong("naive_tokens"),
            "the pooled map was reshaped straight back to (B, N', 2C); flatten it with "
            "rearrange('B C H W -> B (H W) C')",
        ),
        KnownWrong(
            wrong("cls_conv"),
            "the cls token was pooled with the grid (through the convolution, as a 1 x 1 map); it has no place "
            "on the grid: send it through the Linear C -> 2C",
        ),
        KnownWrong(
            wrong("no_cls"),
            "the cls token is missing: put it back in front of the pooled tokens",
        ),
        KnownWrong(
            wrong("cls_last"),
            "the cls token was put back at the end; PiT keeps it first: cat([cls, tokens], dim=1)",
        ),
        KnownWrong(
            wrong("no_padding"),
            "the convolution is not padded; PiT pads by 1, so an H x W grid becomes ceil(H/2) x ceil(W/2)",
        ),
        KnownWrong(wrong("repeated"), _REPEATED),
        *(KnownWrong(wrong(mode), message) for mode, message in _PADDING_WRONGS),
    ]
    return run_check("pit_pooling_stage", fn, cases, _stage, known_wrong=wrongs)
