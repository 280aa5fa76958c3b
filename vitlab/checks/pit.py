"""Check for the PiT chapter: the pooling layer between two stages, on tokens."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from vitlab.checks._core import Case, CheckResult, KnownWrong, generator, run_check, shape
from vitlab.checks._slips import COLUMN_MAJOR, GRID_W_H, PADDING, RESHAPED_WEIGHT, SCRAMBLING_RESHAPE, SWAPPED_GRID, pad


def _pool(
    x: Tensor, weight: Tensor, bias: Tensor | None, *, stride: int = 2, padding: int = 1, pad_mode: str = "zeros",
    repeated: bool = False,
) -> Tensor:  # fmt: skip
    """PiT's grouped convolution; the keywords make known wrong answers (``pad_mode``: a key of ``PADDING``;
    ``repeated``: the input channels tiled by ``repeat``, one group each)."""
    x, padding = pad(x, 3, stride, padding, pad_mode)
    if repeated:  # input channel j % C feeds output channel j
        return F.conv2d(x.repeat(1, 2, 1, 1), weight, bias, stride=stride, padding=padding, groups=weight.shape[0])
    return F.conv2d(x, weight, bias, stride=stride, padding=padding, groups=x.shape[1])


def _stage(
    tokens: Tensor, grid_size: tuple[int, int], conv_weight: Tensor, conv_bias: Tensor, fc_weight: Tensor,
    fc_bias: Tensor, *, wrong: str | None = None,
) -> Tensor:  # fmt: skip
    """PiT's ``Pooling`` between the reshapes of a stage; ``wrong`` picks a known mistake."""
    B, _, C = tokens.shape
    H, W = grid_size[::-1] if wrong == "grid_w_h" else grid_size
    cls, spatial = tokens[:, :1], tokens[:, 1:]  # (B, 1, C), (B, H*W, C)
    if wrong == "naive_map":
        fmap = spatial.reshape(B, C, H, W)
    else:
        fmap = rearrange(spatial, f"B ({'W H' if wrong == 'swapped_hw' else 'H W'}) C -> B C H W", H=H, W=W)
    pad_mode = wrong if wrong in PADDING else "zeros"
    bias = None if wrong == "conv_bias" else conv_bias
    pooled = _pool(fmap, conv_weight, bias, padding=0 if wrong == "no_padding" else 1, pad_mode=pad_mode,
                   repeated=wrong == "repeated")  # (B, 2C, H', W')  # fmt: skip
    fc = fc_weight.reshape(C, -1).T if wrong == "fc_reshaped" else fc_weight  # cls @ fc_weight.reshape(C, 2C)
    cls_out = F.linear(cls, fc, None if wrong == "fc_bias" else fc_bias)  # (B, 1, 2C)
    if wrong == "cls_conv":  # the cls token through the conv, as a 1 x 1 map
        cls_out = _pool(rearrange(cls, "B 1 C -> B C 1 1"), conv_weight, conv_bias).flatten(1)[:, None]
    if wrong == "naive_tokens":
        out = pooled.reshape(B, -1, 2 * C)
    elif wrong in ("swapped_hw", "columns"):
        out = rearrange(pooled, "B C H W -> B (W H) C")
    else:
        out = rearrange(pooled, "B C H W -> B (H W) C")
    if wrong == "cls_last":
        return torch.cat([out, cls_out], dim=1)
    if wrong == "no_cls":
        return out
    return torch.cat([cls_out, out], dim=1)  # (B, 1 + H'*W', 2C)


def pit_pooling_stage(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(tokens, grid_size, conv_weight, conv_bias, fc_weight, fc_bias) -> tokens``: PiT's pooling.

    The row-major map pooled by one conv (``groups=C``, kernel 3, stride 2, padding 1, bias), flattened
    back; the cls token (first) through ``F.linear(cls, fc_weight, fc_bias)`` and put first again.

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
        cases.append(Case(f"tokens {shape(tokens)}, grid_size={(H, W)}", (tokens, (H, W), *weights)))
    kinds = {
        "naive_map": SCRAMBLING_RESHAPE,
        "swapped_hw": SWAPPED_GRID,
        "naive_tokens": "the pooled map was reshaped straight back to (B, N', 2C); flatten it with "
        "rearrange('B C H W -> B (H W) C')",
        "cls_conv": "the cls token was pooled with the grid (through the convolution, as a 1 x 1 map); it has no "
        "place on the grid: send it through the Linear C -> 2C",
        "no_cls": "the cls token is missing: put it back in front of the pooled tokens",
        "cls_last": "the cls token was put back at the end; PiT keeps it first: cat([cls, tokens], dim=1)",
        "no_padding": "the convolution is not padded; PiT pads by 1, so an H x W grid becomes ceil(H/2) x ceil(W/2)",
        "repeated": "the input channels are tiled with repeat (c0 c1 ... c0 c1 ...), so output channel j reads "
        "input channel j % C; with groups=C, output channels 2c and 2c + 1 both read input channel c: "
        "repeat_interleave(2, dim=1)",
        **PADDING,
        "grid_w_h": GRID_W_H,
        "columns": COLUMN_MAJOR,
        "fc_reshaped": RESHAPED_WEIGHT,
        "conv_bias": "the convolution's bias is missing: F.conv2d(..., conv_bias, ...)",
        "fc_bias": "the Linear's bias is missing: F.linear(cls, fc_weight, fc_bias)",
    }
    wrongs = [KnownWrong(partial(_stage, wrong=kind), message) for kind, message in kinds.items()]
    return run_check("pit_pooling_stage", fn, cases, _stage, known_wrong=wrongs)
