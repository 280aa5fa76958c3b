"""Checks for the CaiT chapter: LayerScale's initial value (pitfall 8) and class-attention."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from vitlab.checks._core import Case, CheckResult, Expect, KnownWrong, generator, run_check, shape
from vitlab.layers.attention import explicit_attention
from vitlab.models.cait import layer_scale_init_for_depth

# 17 tells "depth + 2" from "depth < 18"; the paper leaves depths 19 to 23 open, so none is used.
_DEPTHS = (12, 17, 18, 24, 36)


def _epsilon(depth: int, *, small: int = 18, large: int = 24, strict: bool = False) -> float:
    if depth < small or (depth == small and not strict):
        return 0.1
    if depth < large or (depth == large and not strict):
        return 1e-5
    return 1e-6


def layer_scale_init(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(layer_index, depth) -> epsilon``: LayerScale's initial value in one block.

    ``layer_index`` counts the self-attention blocks from 0; ``depth`` is how many there
    are (24 in CaiT-XXS-24; the 2 class-attention blocks do not count). CaiT (§2) picks
    epsilon from the depth: 0.1 for depth <= 18, 1e-5 for depth <= 24, 1e-6 deeper, the
    same in every block (as :func:`vitlab.models.cait.layer_scale_init_for_depth`).
    Every ``layer_index`` of depths 12, 17, 18, 24 and 36 is tried.

    Shape: ints -> one float.
    """
    cases = [Case(f"layer_index={i}, depth={depth}", (i, depth)) for depth in _DEPTHS for i in range(depth)]
    wrongs = [
        KnownWrong(
            lambda i, depth: layer_scale_init_for_depth(i + 1),
            "epsilon follows the layer index (LayerScale(..., depth=ind + 1), as in the note); it follows the "
            "network's depth and is the same in every block: 1e-5 in all 24 blocks of CaiT-XXS-24",
            8,
        ),
        KnownWrong(
            lambda i, depth: _epsilon(depth + 2),
            "the 2 class-attention blocks are counted in the depth; depth counts the self-attention blocks only",
        ),
        KnownWrong(
            lambda i, depth: _epsilon(depth, strict=True),
            "a depth of exactly 18 (or 24) falls in the wrong range: 0.1 for depth <= 18, 1e-5 for depth <= 24",
        ),
        KnownWrong(
            lambda i, depth: 1e-5,
            "epsilon is 1e-5 whatever the depth; it is 0.1 up to depth 18 and 1e-6 beyond 24",
        ),
    ]
    return run_check(
        "layer_scale_init",
        fn,
        cases,
        lambda i, depth: layer_scale_init_for_depth(depth),
        known_wrong=wrongs,
        expect=Expect(kind="number", rtol=1e-6, atol=0.0),
    )


def _class_attention(
    x: Tensor, wq: Tensor, wk: Tensor, wv: Tensor, num_heads: int, *, patches_only: bool = False,
    transposed: bool = False, scale_by_dim: bool = False, one_head: bool = False,
) -> Tensor:  # fmt: skip
    """Class-attention; the keywords turn on the known wrong answers."""
    linear = (lambda t, w: t @ w) if transposed else F.linear
    z = x[:, 1:] if patches_only else x  # keys and values: [cls, patches]
    h = 1 if one_head else num_heads
    q = rearrange(linear(x[:, :1], wq), "B n (h d) -> B h n d", h=h)  # (B, h, 1, d): the cls token only
    k = rearrange(linear(z, wk), "B n (h d) -> B h n d", h=h)  # (B, h, 1 + N, d)
    v = rearrange(linear(z, wv), "B n (h d) -> B h n d", h=h)
    scale = x.shape[-1] ** -0.5 if scale_by_dim else q.shape[-1] ** -0.5
    out, _ = explicit_attention(q, k, v, scale=scale)  # (B, h, 1, d)
    return rearrange(out, "B h n d -> B n (h d)")  # (B, 1, C)


def class_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, wq, wk, wv, num_heads) -> cls_out``: CaiT's class-attention, one layer.

    ``x`` is ``[cls, patches]`` (the cls token first). Only the cls token asks: with
    weights stored as ``nn.Linear`` stores them, (C_out, C_in), ``q = F.linear(x[:, :1], wq)``,
    ``k = F.linear(x, wk)``, ``v = F.linear(x, wv)`` (keys and values include the cls
    token), split into ``num_heads`` heads of ``d = C / num_heads``, ``softmax(q k^T / sqrt(d)) v``,
    heads merged back ``(h d)``. No biases and no output projection (``ClassAttention`` in
    :mod:`vitlab.layers` adds them).

    Shape: x (B, 1 + N, C), wq, wk, wv (C, C), num_heads int -> (B, 1, C).
    """
    cases = []
    for seed, (B, N, C, h) in enumerate(((1, 4, 8, 2), (2, 6, 12, 3), (2, 9, 16, 4), (3, 3, 6, 2))):
        g = generator(seed)
        x = torch.randn(B, 1 + N, C, generator=g)
        wq, wk, wv = (torch.randn(C, C, generator=g) * C**-0.5 for _ in range(3))
        cases.append(Case(f"x {shape(x)}, num_heads={h}", (x, wq, wk, wv, h)))

    def wrong(message: str, **knobs: bool) -> KnownWrong:
        return KnownWrong(lambda *args: _class_attention(*args, **knobs), message)

    wrongs = [
        wrong("the keys and values leave out the cls token; they are z = [x_cls, x_patches], all of x",
              patches_only=True),
        wrong("the weights are used transposed (x @ w); they are stored as nn.Linear stores them, (C_out, C_in): "
              "F.linear(x, w), i.e. x @ w.T", transposed=True),
        wrong("one head over all C channels; split into num_heads heads of d = C / num_heads channels",
              one_head=True),
        wrong("the logits are scaled by C**-0.5; scale by the head dim, d**-0.5 (as in pitfall 1)", scale_by_dim=True),
    ]  # fmt: skip
    return run_check("class_attention", fn, cases, _class_attention, known_wrong=wrongs)
