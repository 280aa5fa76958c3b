"""Slips that several checks name in the same words: attention's scale and softmax, the heads'
layout, ``nn.Linear``'s weight, the padding of a map and the grid's order."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch.nn.functional as F
from torch import Tensor

from vitlab.checks._core import KnownWrong


def turned(reference: Callable[..., Any], rows: Sequence[tuple[str, int | None, dict[str, Any]]]) -> list[KnownWrong]:
    """Known wrong answers ``reference(*args, **knobs)``, a check's reference with knobs turned, from rows
    ``(message, pitfall, knobs)``."""
    return [KnownWrong(partial(reference, **knobs), message, pitfall) for message, pitfall, knobs in rows]


UNSCALED = "the logits are not scaled; multiply q k^T by d**-0.5 before the softmax"
SCALED_AFTER = (
    "the weights are scaled after the softmax (rows no longer sum to 1); scale the logits q k^T before the softmax"
)
TOTAL_WIDTH = "the logits are scaled by the whole embedding size, (h*d)**-0.5; scale by the head width, d**-0.5"
OVER_QUERIES = "the softmax runs over the queries (dim=-2); each query's weights over the keys (dim=-1) must sum to 1"
MERGED_BY_RESHAPE = (
    "the heads are merged by a reshape of (B, h, N, d) straight to (B, N, h*d), which mixes heads and tokens; "
    "move the head axis next to d first: out.transpose(1, 2).reshape(B, N, h * d), or 'B h N d -> B N (h d)'"
)
SPLIT_D_H = (
    "the channels are split into heads (d h), so head g gets every h-th channel; split (and merge) them (h d): "
    "head g owns channels g*d ... (g+1)*d - 1"
)
RESHAPED_WEIGHT = (
    "the weight is reshaped where it must be transposed: nn.Linear stores it as (out_features, in_features) and "
    "computes x @ weight.T; a reshape to the transposed shape keeps the memory order and scrambles it"
)
GRID_W_H = "grid_size was unpacked as (W, H); it is (H, W), rows first: H, W = grid_size"
COLUMN_MAJOR = (
    "the tokens are numbered column by column, (W H); number them row by row, (H W): left to right, then down"
)
HARD_CODED = "the padding is the same number in every case (hard-coded?); take it from the inputs"


def naive_softmax_of(logits: Tensor, dim: int = -1) -> Tensor:
    """``exp(x) / sum(exp(x))`` as written from the formula: inf / inf = NaN in float32 once a logit passes ~88."""
    e = logits.exp()
    return e / e.sum(dim=dim, keepdim=True)


# The message of every check whose answer has a softmax, for an answer that overflows on large logits.
NAIVE_SOFTMAX = (
    "the softmax is computed as exp(x) / sum(exp(x)), which overflows for large logits (exp(89) is inf in "
    "float32, and inf / inf is NaN); subtract each row's max first, or use torch.softmax / x.softmax(dim=-1)"
)

# The two classic slips of folding a token sequence (B, H*W, C) into a map (B, C, H, W).
SCRAMBLING_RESHAPE = (
    "the tokens were reshaped straight to (B, C, H, W), which scrambles them; fold them with "
    "rearrange(x, 'B (H W) C -> B C H W', H=H, W=W) (a transpose, then a reshape)"
)
SWAPPED_GRID = (
    "the grid's height and width are swapped ('B (W H) C'): the tokens are numbered row by row, 'B (H W) C' with H rows"
)


def same_padding(x: Tensor, kernel: int, stride: int) -> Tensor:
    """TensorFlow's ``padding="SAME"``: ``ceil(size / stride)`` outputs, the padding split with the
    extra row and column at the bottom and right. Lopsided where PyTorch pads ``k // 2`` on every side."""
    pads = []
    for size in (x.shape[-1], x.shape[-2]):  # F.pad's order: the last dimension first
        total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
        pads += [total // 2, total - total // 2]
    return F.pad(x, pads)


_SAME = "the same amount on every side"
_ZEROS = f"pad with zeros, {_SAME} (what padding= does in F.conv2d, nn.Conv2d and F.unfold)"
PADDING = {  # a map padded another way than `padding` zeros on every side, by name (see pad)
    "reflect": f"the map is padded by reflection (mode='reflect' or padding_mode='reflect'); {_ZEROS}",
    "replicate": f"the map is padded by repeating its border (mode='replicate'); {_ZEROS}",
    "same": "the padding is lopsided, TensorFlow's 'SAME' (the extra row and column at the bottom and right "
    f"only); {_ZEROS}",
    "before": f"the map is padded on the top and left only, F.pad(x, (p, 0, p, 0)); pad {_SAME}, (p, p, p, p)",
    "after": f"the map is padded on the bottom and right only, F.pad(x, (0, p, 0, p)); pad {_SAME}, (p, p, p, p)",
    "twice": "the map is padded twice, by F.pad and again by padding=; pad it once",
}


def pad(x: Tensor, kernel: int, stride: int, padding: int, how: str) -> tuple[Tensor, int]:
    """``x`` padded ``how`` (``"zeros"``: not yet) and the padding left for the convolution."""
    if how == "zeros":
        return x, padding
    if how == "same":
        return same_padding(x, kernel, stride), 0
    if how in ("before", "after", "twice"):
        sides = {"before": (padding, 0), "after": (0, padding), "twice": (padding, padding)}[how]
        return F.pad(x, sides * 2), padding if how == "twice" else 0
    return F.pad(x, [padding] * 4, mode=how), 0
