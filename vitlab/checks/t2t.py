"""Checks for the T2T-ViT chapter: the soft split's token count (pitfall 9) and the split itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.nn.functional as F
from torch import Tensor

from vitlab.checks._core import (
    Case,
    CheckResult,
    Expect,
    KnownWrong,
    randn,
    run_check,
    shape,
)
from vitlab.models.t2t_vit import unfold_output_size

# (size, kernel, stride, padding): T2T-ViT's three splits at 224 px (224 -> 56 -> 28 -> 14),
# other image sizes, and sizes where the stride does not divide evenly (the floor matters).
# (16, 3, 2, 0) comes early: size // stride (8), "no + 1" (6) and the right count (7)
# all differ there, so each of those answers is told apart where it first fails.
_COUNTS = (
    (224, 7, 4, 2), (56, 3, 2, 1), (28, 3, 2, 1), (16, 3, 2, 0), (384, 7, 4, 2),
    (32, 7, 4, 2), (15, 3, 2, 1), (7, 3, 2, 0), (10, 4, 3, 1), (9, 3, 3, 0),
)  # fmt: skip


def t2t_token_count(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(size, kernel, stride, padding) -> tokens``: tokens along one side after a soft split.

    A soft split (``nn.Unfold``) slides a ``kernel`` window with ``stride`` over the
    ``padding``-padded side: ``floor((size + 2*padding - kernel) / stride) + 1`` windows, as
    :func:`vitlab.models.t2t_vit.unfold_output_size`. The answer is a whole number.

    Shape: ints -> int.
    """
    cases = [Case(f"size={n}, kernel={k}, stride={s}, padding={p}", (n, k, s, p)) for n, k, s, p in _COUNTS]
    wrongs = [
        KnownWrong(
            lambda n, k, s, p: (n + 2 * p - k) / (k - s) + 1,
            "this is the note's formula, (size + 2p - k) / (k - s) + 1: divide by the stride s, not by the "
            "overlap k - s, and take the floor: floor((size + 2p - k) / s) + 1",
            9,
        ),
        KnownWrong(
            lambda n, k, s, p: (n + 2 * p - k) // (k - s) + 1,
            "this divides by the overlap k - s, as the note's formula; divide by the stride: "
            "floor((size + 2p - k) / s) + 1",
            9,
        ),
        KnownWrong(
            lambda n, k, s, p: (n + 2 * p - k) / (k - s),
            "this is the note's formula for the width, (size + 2p - k) / (k - s), which also drops the + 1; "
            "use floor((size + 2p - k) / s) + 1 for both sides",
            9,
        ),
        KnownWrong(
            lambda n, k, s, p: (n + 2 * p - k) / s + 1,
            "the division is not floored: a window that does not fit is not a token, floor((size + 2p - k) / s) + 1",
        ),
        KnownWrong(
            lambda n, k, s, p: (n + 2 * p - k) // s,
            "the + 1 is missing: the first window sits at position 0, floor((size + 2p - k) / s) + 1",
        ),
        KnownWrong(
            lambda n, k, s, p: n // s,
            "this is size // stride, which ignores the kernel and the padding; it is right only when "
            "2 * padding = kernel - stride (as in T2T-ViT's splits): floor((size + 2p - k) / s) + 1",
        ),
        KnownWrong(
            lambda n, k, s, p: (n + p - k) // s + 1,
            "the padding is counted once; it is added on both sides, size + 2 * padding",
        ),
    ]
    return run_check(
        "t2t_token_count",
        fn,
        cases,
        unfold_output_size,
        known_wrong=wrongs,
        expect=Expect(kind="number", integer=True, rtol=0.0, atol=1e-9),
    )


_UNFOLD_NOTE = "(the check compares values only: it cannot tell whether you used F.unfold)"


def _soft_split(x: Tensor, kernel: int, stride: int, padding: int) -> Tensor:
    return F.unfold(x, kernel_size=kernel, stride=stride, padding=padding).transpose(1, 2)  # (B, L, C*k*k)


def soft_split(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, kernel, stride, padding) -> tokens``: one soft split of T2T-ViT.

    Overlapping ``kernel`` x ``kernel`` windows with ``stride`` and zero ``padding``, each
    window's values flattened ``(c k1 k2)`` (what ``nn.Unfold`` gives), windows in row-major
    order, tokens first: ``F.unfold(x, kernel, stride=stride, padding=padding).transpose(1, 2)``.

    The check compares values only, so it cannot tell whether ``F.unfold`` was used; its
    PASS line says so.

    Shape: x (B, C, H, W) -> (B, L, C*kernel*kernel), L = tokens down x tokens across.
    """
    cases = []
    sizes = ((1, 3, 16, 16, 7, 4, 2), (2, 4, 8, 12, 3, 2, 1), (2, 2, 9, 7, 3, 2, 1))  # (B, C, H, W, k, s, p)
    for seed, (B, C, H, W, k, s, p) in enumerate(sizes):
        x = randn(seed, B, C, H, W)
        cases.append(Case(f"x {shape(x)}, kernel={k}, stride={s}, padding={p}", (x, k, s, p)))
    wrongs = [
        KnownWrong(
            lambda x, k, s, p: F.unfold(x, kernel_size=k, stride=s, padding=p),
            "the result is (B, C*k*k, L), what F.unfold gives; transpose it to tokens first, (B, L, C*k*k)",
        ),
        KnownWrong(
            lambda x, k, s, p: _soft_split(x, k, s, 0),
            "the padding is missing; pass padding= to F.unfold / nn.Unfold",
        ),
    ]
    # The exercise asks for no F.unfold; the values cannot show it, so the PASS line says so.
    return run_check("soft_split", fn, cases, _soft_split, known_wrong=wrongs, pass_note=_UNFOLD_NOTE)
