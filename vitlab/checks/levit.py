"""Checks for the LeViT chapter: the attention-bias indices and where the bias goes (pitfall 14)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from vitlab.checks._core import Case, CheckResult, Expect, KnownWrong, generator, run_check, shape, vary

INDEX = Expect(integer=True, index=True, rtol=0.0, atol=0.0)


def _signed_index(r: int) -> Tensor:
    """Swin's relative-position index: signed offsets, a (2r - 1)^2 table."""
    points = torch.stack(torch.meshgrid(torch.arange(r), torch.arange(r), indexing="ij")).flatten(1)  # (2, N)
    offsets = points[:, :, None] - points[:, None, :] + (r - 1)  # (2, N, N), in [0, 2r - 2]
    return offsets[0] * (2 * r - 1) + offsets[1]


def levit_bias_indices(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(resolution) -> idx``: pair ``(i, j)`` of the row-major ``r x r`` map reads entry ``|dy| * r + |dx|``.

    An index tensor (``torch.long``).

    Shape: resolution int -> (r*r, r*r).
    """
    cases = [Case(f"resolution={r}", (r,)) for r in vary((1, 2, 3, 4, 7), lambda g: g.randint(1, 14))]
    wrongs = [
        KnownWrong(lambda r: _shrink_index(r, 1, order="xy"),
                   "the x and y offsets are swapped (|dx| * r + |dy|), which is also what meshgrid(..., indexing='xy') "
                   "gives: number the tokens row by row, (y, x) = (i // r, i % r), with indexing='ij'", 13),
        KnownWrong(_signed_index,
                   "these are signed offsets (Swin's (2r - 1)^2 table); LeViT's bias depends on the absolute offsets "
                   "|dy|, |dx| only: index |dy| * r + |dx| into r * r entries"),
    ]  # fmt: skip
    return run_check("levit_bias_indices", fn, cases, lambda r: _shrink_index(r, 1), known_wrong=wrongs, expect=INDEX)


def _logits(q: Tensor, k: Tensor, bias: Tensor, scale: float, *, where: str = "after") -> Tensor:
    dots = q @ k.transpose(-2, -1)  # (B, h, N_q, N_k)
    if where == "before":  # pitfall 14 as a formula: softmax((QK^T + B) / sqrt(D))
        return (dots + bias) * scale
    if where == "rescaled":  # pitfall 14 as code: dots + bias / scale
        return dots * scale + bias / scale
    return dots * scale + bias


def levit_attention_logits(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(q, k, bias, scale) -> logits``: ``q k^T * scale + bias``, the bias not rescaled (pitfall 14).

    Shape: q (B, h, N_q, D), k (B, h, N_k, D), bias (h, N_q, N_k), scale float -> (B, h, N_q, N_k).
    """
    cases = []
    sizes = ((1, 1, 4, 4, 8), (2, 2, 9, 9, 4), (2, 3, 16, 16, 16), (1, 2, 4, 16, 8))  # (B, h, N_q, N_k, D)
    for seed, (B, h, n_q, n_k, D) in enumerate(sizes):
        g = generator(seed)
        q, k = torch.randn(B, h, n_q, D, generator=g), torch.randn(B, h, n_k, D, generator=g)
        bias = torch.randn(h, n_q, n_k, generator=g)
        scale = D**-0.5
        cases.append(Case(f"q {shape(q)}, k {shape(k)}, scale={scale:g}", (q, k, bias, scale)))
    wrongs = [
        KnownWrong(lambda q, k, b, s: _logits(q, k, b, s, where="before"),
                   "the bias is added before scaling, (QK^T + B) * scale, as in softmax((QK^T + B) / sqrt(D)); the "
                   "paper's Eq. 1 adds B to the dot product, and the official code computes QK^T * D**-0.5 + B", 14),
        KnownWrong(lambda q, k, b, s: _logits(q, k, b, s, where="rescaled"),
                   "the bias is rescaled, QK^T * scale + B / scale (dots + bias / scale); the official code adds it as "
                   "it is: QK^T * D**-0.5 + B", 14),
        KnownWrong(lambda q, k, b, s: _logits(q, k, b, s).softmax(dim=-1),
                   "these are attention weights (after the softmax); return the logits"),
        KnownWrong(lambda q, k, b, s: (q @ k.transpose(-2, -1)) / s + b,
                   "the logits are divided by scale; scale is already D**-0.5, so multiply"),
        KnownWrong(lambda q, k, b, s: (q @ k.transpose(-2, -1)) * s, "the bias is missing"),
    ]  # fmt: skip
    return run_check("levit_attention_logits", fn, cases, _logits, known_wrong=wrongs)


def _shrink_index(r: int, s: int, *, queries: str = "strided", row: str = "keys", order: str = "ij",
                  signed: bool = False) -> Tensor:  # fmt: skip
    """The shrink-attention index and the ways it goes wrong (for the known wrong answers)."""
    n_q = -(-r // s)  # ceil(r / s) queries per side
    if queries == "plus_one":  # (r + 1) // s per side: ceil(r / s) for s = 2 only
        q_axis = torch.arange((r + 1) // s) * s
    elif queries == "floor":  # r // s per side: drops the last row and column when r % s != 0
        q_axis = torch.arange(r // s) * s
    elif queries == "unstrided":  # the first n_q rows and columns, not every s-th one
        q_axis = torch.arange(n_q)
    elif queries == "centred":  # the centre of each s x s cell instead of its first position
        q_axis = (torch.arange(0, r, s) + s // 2).clamp(max=r - 1)
    else:
        q_axis = torch.arange(0, r, s)
    axis = torch.arange(r)
    keys = torch.stack(torch.meshgrid(axis, axis, indexing="ij")).flatten(1)  # (2, r*r)
    q = torch.stack(torch.meshgrid(q_axis, q_axis, indexing="ij")).flatten(1)  # (2, N_q)
    offsets = q[:, :, None] - keys[:, None, :]  # (2, N_q, r*r): dy, dx
    offsets = offsets if signed else offsets.abs()
    width = r if row == "keys" else n_q
    if order == "xy":
        return offsets[1] * width + offsets[0]
    return offsets[0] * width + offsets[1]


def levit_shrink_bias_indices(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(resolution, stride) -> idx``: the bias index of LeViT's shrink attention.

    Queries on rows and columns ``0, s, 2s, ...`` of the ``r x r`` key map, row by row; entry
    ``|dy| * r + |dx|``. An index tensor (``torch.long``).

    Shape: resolution int, stride int -> (ceil(r/s)**2, r*r).
    """
    pairs = vary(((7, 2), (14, 2), (5, 3), (4, 1), (1, 2)), lambda g: (g.randint(1, 14), g.randint(1, 3)))
    cases = [Case(f"resolution={r}, stride={s}", (r, s)) for r, s in pairs]
    wrongs = [
        KnownWrong(lambda r, s: _shrink_index(r, s, queries="floor"),
                   "r // stride queries per side drops the last row and column when r is odd (LeViT's 7 x 7 -> 4 x 4 "
                   "keeps rows 0, 2, 4, 6): there are ceil(r / stride), torch.arange(0, r, stride)"),
        KnownWrong(lambda r, s: _shrink_index(r, s, queries="unstrided"),
                   "the queries sit at (i, j), the top-left corner of the key map; they sit at "
                   "(stride * i, stride * j)"),
        KnownWrong(lambda r, s: _shrink_index(r, s, queries="centred"),
                   "the queries sit in the middle of each stride x stride cell; LeViT subsamples from position 0: rows "
                   "and columns 0, stride, 2 * stride, ..."),
        KnownWrong(lambda r, s: _shrink_index(r, s, row="queries"),
                   "the offset is numbered with the query map's side, |dy| * ceil(r / stride) + |dx|; the table has "
                   "one entry per offset on the key map: |dy| * r + |dx|"),
        KnownWrong(lambda r, s: _shrink_index(r, s, order="xy"),
                   "the x and y offsets are swapped (|dx| * r + |dy|), which is also what meshgrid(..., indexing='xy') "
                   "gives: number the positions row by row with indexing='ij'", 13),
        KnownWrong(lambda r, s: _shrink_index(r, s).T,
                   "the index is (keys, queries); return one row per query: (N_q, r * r)"),
        KnownWrong(lambda r, s: _shrink_index(r, s, queries="plus_one"),
                   "(r + 1) // stride queries per side is ceil(r / stride) for stride 2 only (stride 1 adds a row and "
                   "a column past the map): count -(-r // stride), or take torch.arange(0, r, stride)"),
        KnownWrong(lambda r, s: _shrink_index(r, s, signed=True),
                   "the offsets are signed (a key above or left of its query gives a negative index); the table is "
                   "indexed by the absolute offsets: |dy| * r + |dx|"),
    ]  # fmt: skip
    return run_check("levit_shrink_bias_indices", fn, cases, _shrink_index, known_wrong=wrongs, expect=INDEX)
