"""Checks for the T2T-ViT chapter: the soft split's token count (pitfall 11) and the split itself."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from vitlab.checks._core import WHOLE, Case, CheckResult, Expect, KnownWrong, randn, run_check, shape, vary
from vitlab.checks._slips import COLUMN_MAJOR, HARD_CODED, PADDING, pad


def _side(size: int, kernel: int, stride: int, padding: int) -> int:
    """Windows along one side: ``floor((size + 2 * padding - kernel) / stride) + 1``."""
    return (size + 2 * padding - kernel) // stride + 1


# (size, kernel, stride, padding): T2T-ViT's three splits at 224 px (224 -> 56 -> 28 -> 14),
# other image sizes, and sizes where the stride does not divide evenly (the floor matters).
# (16, 3, 2, 0) comes early: size // stride (8), "no + 1" (6) and the right count (7)
# all differ there, so each of those answers is told apart where it first fails.
_COUNTS = (
    (224, 7, 4, 2), (56, 3, 2, 1), (28, 3, 2, 1), (16, 3, 2, 0), (384, 7, 4, 2),
    (32, 7, 4, 2), (15, 3, 2, 1), (7, 3, 2, 0), (10, 4, 3, 1), (9, 3, 3, 0),
)  # fmt: skip


def t2t_token_count(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(size, kernel, stride, padding) -> tokens``: ``floor((size + 2*padding - kernel) / stride) + 1``.

    Shape: ints -> int.
    """
    counts = vary(_COUNTS, lambda r: (r.randint(7, 400), r.randint(3, 7), r.randint(1, 3), r.randint(0, 1)))
    cases = [Case(f"size={n}, kernel={k}, stride={s}, padding={p}", (n, k, s, p)) for n, k, s, p in counts]
    wrongs = [
        KnownWrong(lambda n, k, s, p: (n + 2 * p - k) / (k - s) + 1,
                   "(size + 2p - k) / (k - s) + 1 divides by the overlap of two windows, k - s, and is not floored: "
                   "divide by the stride s and take the floor, floor((size + 2p - k) / s) + 1", 11),
        KnownWrong(lambda n, k, s, p: (n + 2 * p - k) // (k - s) + 1,
                   "this divides by the overlap of two windows, k - s; "
                   "divide by the stride: floor((size + 2p - k) / s) + 1", 11),
        KnownWrong(lambda n, k, s, p: (n + 2 * p - k) / (k - s),
                   "(size + 2p - k) / (k - s) divides by the overlap of two windows, k - s, and also drops the + 1; "
                   "use floor((size + 2p - k) / s) + 1 for both sides", 11),
        KnownWrong(lambda n, k, s, p: (n + 2 * p - k) / s + 1,
                   "the division is not floored: "
                   "a window that does not fit is not a token, floor((size + 2p - k) / s) + 1"),
        KnownWrong(lambda n, k, s, p: (n + 2 * p - k) // s,
                   "the + 1 is missing: the first window sits at position 0, floor((size + 2p - k) / s) + 1"),
        KnownWrong(lambda n, k, s, p: n // s,
                   "this is size // stride, which ignores the kernel and the padding; "
                   "it is right only when 2 * padding = kernel - stride (as in T2T-ViT's splits): "
                   "floor((size + 2p - k) / s) + 1"),
        KnownWrong(lambda n, k, s, p: (n + p - k) // s + 1,
                   "the padding is counted once; it is added on both sides, size + 2 * padding"),
    ]  # fmt: skip
    return run_check("t2t_token_count", fn, cases, _side, known_wrong=wrongs, expect=WHOLE)


_UNFOLD_NOTE = "(the check compares values only: it cannot tell whether you used F.unfold)"


def _soft_split(x: Tensor, kernel: int, stride: int, padding: int, *, pad_mode: str = "zeros",
                tokens: str = "transpose") -> Tensor:  # fmt: skip
    """The soft split; ``pad_mode`` (``"width"``: F.pad's (p, p), or a key of ``PADDING``) and ``tokens``
    (``"reshape"``, ``"columns"``: numbered column by column) make known wrong answers."""
    width = pad_mode == "width"
    x, padding = (F.pad(x, (padding, padding)), 0) if width else pad(x, kernel, stride, padding, pad_mode)
    out = F.unfold(x, kernel_size=kernel, stride=stride, padding=padding)  # (B, C*k*k, L), L = (h w)
    if tokens == "reshape":
        return out.reshape(out.shape[0], out.shape[2], out.shape[1])
    if tokens == "columns":
        return rearrange(out, "B K (h w) -> B (w h) K", h=_side(x.shape[-2], kernel, stride, padding))
    return out.transpose(1, 2)  # (B, L, C*k*k)


def soft_split(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, kernel, stride, padding) -> tokens``: ``F.unfold(x, kernel, stride=, padding=).transpose(1, 2)``.

    Shape: x (B, C, H, W) -> (B, L, C*kernel*kernel), L = tokens down x tokens across.
    """
    cases = []
    sizes = ((1, 3, 16, 16, 7, 4, 2), (2, 4, 8, 12, 3, 2, 1), (2, 2, 9, 7, 3, 2, 1))  # (B, C, H, W, k, s, p)
    for seed, (B, C, H, W, k, s, p) in enumerate(sizes):
        x = randn(seed, B, C, H, W)
        cases.append(Case(f"x {shape(x)}, kernel={k}, stride={s}, padding={p}", (x, k, s, p)))
    wrongs = [
        KnownWrong(lambda x, k, s, p: F.unfold(x, kernel_size=k, stride=s, padding=p),
                   "the result is (B, C*k*k, L), what F.unfold gives; transpose it to tokens first, (B, L, C*k*k)"),
        KnownWrong(lambda x, k, s, p: _soft_split(x, k, s, 0),
                   "the padding is missing; pass padding= to F.unfold / nn.Unfold"),
        KnownWrong(lambda x, k, s, p: rearrange(_soft_split(x, k, s, p), "B L (C k1 k2) -> B L (k1 k2 C)", k1=k, k2=k),
                   "each window is flattened (k1 k2 c), channels last, as patchify does; "
                   "nn.Unfold flattens it (c k1 k2): all of channel 0's k x k values, then channel 1's"),
        KnownWrong(lambda x, k, s, p: _soft_split(x, k, s, p, pad_mode="width"),
                   "only the width is padded: F.pad(x, (p, p)) pads the last dimension; "
                   "pad the height too, F.pad(x, (p, p, p, p))"),
        *(KnownWrong(partial(_soft_split, pad_mode=mode), message) for mode, message in PADDING.items()),
        *(KnownWrong(lambda x, k, s, p, fixed=fixed: _soft_split(x, k, s, fixed), f"{HARD_CODED}: padding=padding")
          for fixed in (1, 2)),
        KnownWrong(lambda x, k, s, p: _soft_split(x, k, s, p, tokens="reshape"),
                   "F.unfold's (B, C*k*k, L) is reshaped to (B, L, C*k*k), which scrambles it; "
                   "transpose it, .transpose(1, 2)"),
        KnownWrong(lambda x, k, s, p: _soft_split(x, k, s, p, tokens="columns"), COLUMN_MAJOR),
    ]  # fmt: skip
    # The exercise asks for no F.unfold; the values cannot show it, so the PASS line says so.
    return run_check("soft_split", fn, cases, _soft_split, known_wrong=wrongs, pass_note=_UNFOLD_NOTE)


_T2T_SPLITS = ((7, 4, 2), (3, 2, 1), (3, 2, 1))  # T2T-ViT's three soft splits, (kernel, stride, padding)


def _grids(height: int, width: int, side: Callable[[int, int, int, int], int] = _side) -> Tensor:
    """The (rows, cols) grid after each of T2T-ViT's three splits, each side counted by ``side``."""
    rows, cols, grids = height, width, []
    for k, s, p in _T2T_SPLITS:
        rows, cols = side(rows, k, s, p), side(cols, k, s, p)
        grids.append((rows, cols))
    return torch.tensor(grids, dtype=torch.long)


def _unchained(height: int, width: int) -> Tensor:
    """Each split counted from the image's own size (a wrong answer)."""
    return torch.tensor([(_side(height, k, s, p), _side(width, k, s, p)) for k, s, p in _T2T_SPLITS])


_GRID_RIGHT = "each side is floor((n + 2p - k) / stride) + 1, applied to the previous split's grid, rows and cols apart"

_T2T_GRID_WRONGS = (
    KnownWrong(lambda h, w: _grids(h, h),
               f"the width was counted from the height (a square image assumed); {_GRID_RIGHT}"),
    KnownWrong(lambda h, w: _grids(h, w).flip(-1),
               "the two sides are swapped: each row of the answer is (rows, cols), rows from the height"),
    KnownWrong(lambda h, w: _grids(h, w, lambda n, k, s, p: n // s),
               "each side is n // stride, which ignores kernel and padding; it happens to be right for sides "
               f"that the strides divide (224 -> 56 -> 28 -> 14) but not in general: {_GRID_RIGHT}"),
    KnownWrong(lambda h, w: _grids(h, w, lambda n, k, s, p: (n + 2 * p - k) // (k - s) + 1),
               "this divides by k - stride, the overlap of two windows: the T2T paper's Eq. 3 divides by k - s "
               f"where its s is the overlap, so k - s is the stride; {_GRID_RIGHT}", 11),
    KnownWrong(lambda h, w: _grids(h, w, lambda n, k, s, p: (n + p - k) // s + 1),
               f"the padding is counted once; it is added on both sides, n + 2 * p: {_GRID_RIGHT}"),
    KnownWrong(lambda h, w: _grids(h, w, lambda n, k, s, p: (n + 2 * p - k) // s),
               f"the + 1 is missing: the first window sits at position 0; {_GRID_RIGHT}"),
    KnownWrong(lambda h, w: _grids(h, w, lambda n, k, s, p: -(-n // s)),
               "each side is ceil(n / stride), TensorFlow's 'SAME' count, which ignores kernel and padding: "
               + _GRID_RIGHT),
    KnownWrong(lambda h, w: _grids(h, w, lambda n, k, s, p: round((n + 2 * p - k) / s) + 1),
               "the division is rounded to the nearest; a window that does not fit is not a token, so round down: "
               + _GRID_RIGHT),
    KnownWrong(lambda h, w: _grids(h, w, lambda n, k, s, p: -(-(n + 2 * p - k) // s) + 1),
               f"the division is rounded up; a window that does not fit is not a token: {_GRID_RIGHT}"),
    KnownWrong(_unchained,
               "every split was counted from the image's size; each split cuts the previous split's token grid: "
               + _GRID_RIGHT),
)  # fmt: skip


def t2t_grids(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(height, width) -> grids``: ``(rows, cols)`` after each of T2T-ViT's three soft splits.

    ``(kernel, stride, padding) = (7, 4, 2), (3, 2, 1), (3, 2, 1)``, each on the grid of the one before.

    Shape: ints -> (3, 2) integer tensor.
    """
    sizes = ((224, 320), (200, 300), (97, 131), (384, 256), (64, 33))
    sizes = vary(sizes, lambda r: (r.randint(32, 400), r.randint(32, 400)))
    cases = [Case(f"a {h} x {w} image (height x width)", (h, w)) for h, w in sizes]
    expect = Expect(kind="tensor", integer=True, rtol=0.0, atol=0.0)
    return run_check("t2t_grids", fn, cases, _grids, known_wrong=_T2T_GRID_WRONGS, expect=expect)
