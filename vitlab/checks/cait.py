"""Checks for the CaiT chapter: LayerScale's initial value (pitfall 10) and class-attention."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from vitlab.checks._core import Case, CheckResult, Expect, KnownWrong, generator, run_check, shape, vary
from vitlab.checks._slips import NAIVE_SOFTMAX, naive_softmax_of

# 17 tells "depth + 2" from "depth < 18"; the paper leaves depths 19 to 23 open, so none is used.
_DEPTHS = (12, 17, 18, 24, 36)


def _epsilon(depth: int, *, small: int = 18, large: int = 24, strict: bool = False) -> float:
    """CaiT's epsilon for ``depth`` self-attention blocks (``strict``: a known wrong answer)."""
    if depth < small or (depth == small and not strict):
        return 0.1
    if depth < large or (depth == large and not strict):
        return 1e-5
    return 1e-6


def layer_scale_init(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(layer_index, depth) -> epsilon``: 0.1 up to depth 18, 1e-5 up to 24, 1e-6 deeper (CaiT §2).

    Shape: ints -> one float.
    """
    depths = vary(_DEPTHS, lambda r: r.choice([*range(1, 19), *range(24, 49)]))  # hidden cases: not 19 to 23 either
    cases = [Case(f"layer_index={i}, depth={depth}", (i, depth)) for depth in depths for i in range(depth)]
    wrongs = [
        KnownWrong(lambda i, depth: _epsilon(i + 1),
                   "epsilon follows the layer index (LayerScale(..., depth=ind + 1)); it follows the network's depth "
                   "and is the same in every block: 1e-5 in all 24 blocks of CaiT-XXS-24", 10),
        KnownWrong(lambda i, depth: _epsilon(depth + 2),
                   "the 2 class-attention blocks are counted in the depth; depth counts the "
                   "self-attention blocks only"),
        KnownWrong(lambda i, depth: _epsilon(depth, strict=True),
                   "a depth of exactly 18 (or 24) falls in the wrong range: 0.1 for depth <= 18, 1e-5 for depth <= 24"),
        KnownWrong(lambda i, depth: 1e-5,
                   "epsilon is 1e-5 whatever the depth; it is 0.1 up to depth 18 and 1e-6 beyond 24"),
    ]  # fmt: skip
    expect = Expect(kind="number", rtol=1e-6, atol=0.0)
    return run_check("layer_scale_init", fn, cases, lambda i, depth: _epsilon(depth), known_wrong=wrongs, expect=expect)


def _class_attention_tokens(
    x: Tensor, wq: Tensor, wk: Tensor, wv: Tensor, num_heads: int, num_queries: int = 1, *, queries: int | None = None,
    keys_from: int = 0, patches_only: bool = False, transposed: bool = False, scale_by_dim: bool = False,
    one_head: bool = False, split: str = "h d", merge: str = "h d", unscaled: bool = False, softmax_dim: int = -1,
    naive_softmax: bool = False,
) -> Tensor:  # fmt: skip
    """Class-attention of the ``num_queries`` class tokens first in ``x`` (CaiT has one); the keywords turn on the
    known wrong answers (``queries``: how many tokens ask, ``keys_from``: the first key token; ``split``, ``merge``:
    the channel order of the heads, ``"h d"`` or ``"d h"``)."""
    linear = (lambda t, w: t @ w) if transposed else F.linear
    z = x[:, num_queries if patches_only else keys_from :]  # keys and values: every token, the class tokens included
    h = 1 if one_head else num_heads
    heads = f"B n ({split}) -> B h n d"
    asking = num_queries if queries is None else queries
    q = rearrange(linear(x[:, :asking], wq), heads, h=h)  # (B, h, n_q, d): the class tokens only
    k = rearrange(linear(z, wk), heads, h=h)  # (B, h, T, d)
    v = rearrange(linear(z, wv), heads, h=h)
    scale = 1.0 if unscaled else x.shape[-1] ** -0.5 if scale_by_dim else q.shape[-1] ** -0.5
    logits = q @ k.transpose(-2, -1) * scale  # (B, h, n_q, T)
    out = (naive_softmax_of(logits) if naive_softmax else logits.softmax(dim=softmax_dim)) @ v  # (B, h, n_q, d)
    return rearrange(out, f"B h n d -> B n ({merge})")  # (B, n_q, C)


def _wrong(message: str, **knobs: Any) -> KnownWrong:
    """The known wrong answer :func:`_class_attention_tokens` gives with ``knobs``."""
    return KnownWrong(partial(_class_attention_tokens, **knobs), message)


def class_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, wq, wk, wv, num_heads) -> cls_out``: CaiT's class-attention, no biases, no projection.

    ``q = F.linear(x[:, :1], wq)``, ``k``, ``v`` from all of ``x``, heads ``(h d)``, ``softmax(q k^T / sqrt(d)) v``.

    Shape: x (B, 1 + N, C), wq, wk, wv (C, C), num_heads int -> (B, 1, C).
    """
    cases = []
    sizes = ((1, 4, 8, 2), (2, 6, 12, 3), (2, 9, 16, 4), (3, 3, 6, 2), (2, 6, 12, 3))
    for seed, (B, N, C, h) in enumerate(sizes):
        g = generator(seed)
        x = torch.randn(B, 1 + N, C, generator=g)
        wq, wk, wv = (torch.randn(C, C, generator=g) * C**-0.5 for _ in range(3))
        label = f"x {shape(x)}, num_heads={h}"
        if seed == 4:
            wq = 100 * wq
            label += ", large logits (wq x 100)"
        cases.append(Case(label, (x, wq, wk, wv, h)))
    wrongs = [
        _wrong("the keys and values leave out the cls token; they are z = [x_cls, x_patches], all of x",
               patches_only=True),
        _wrong("the weights are used transposed (x @ w); they are stored as nn.Linear stores them, (C_out, C_in): "
               "F.linear(x, w), i.e. x @ w.T", transposed=True),
        _wrong("one head over all C channels; split into num_heads heads of d = C / num_heads channels",
               one_head=True),
        _wrong("the logits are scaled by C**-0.5; scale by the head dim, d**-0.5 (as in pitfall 3)", scale_by_dim=True),
        _wrong("the logits are not scaled; multiply q k^T by d**-0.5 before the softmax", unscaled=True),
        _wrong("the heads are merged (d h): output channel c * h + g holds head g's channel c; merge them (h d), "
               "head by head as they were split: rearrange(out, 'B h n d -> B n (h d)')", merge="d h"),
        _wrong("the channels are split into heads (d h), so head g gets every h-th channel; split (and merge) them "
               "(h d): head g owns channels g*d ... (g+1)*d - 1, as nn.Linear's rows in timm", split="d h",
               merge="d h"),
        _wrong("the channels are split into heads (d h) but merged (h d); split them (h d): "
               "rearrange(t, 'B n (h d) -> B h n d', h=num_heads)", split="d h"),
        _wrong("the softmax runs over the queries (dim=-2): with one query every weight is 1; take it over the "
               "keys, softmax(dim=-1)", softmax_dim=-2),
        _wrong(NAIVE_SOFTMAX, naive_softmax=True),
    ]  # fmt: skip
    return run_check("class_attention", fn, cases, _class_attention_tokens, known_wrong=wrongs)


def class_attention_tokens(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, wq, wk, wv, num_heads, num_queries) -> tokens``: class-attention, ``n`` class tokens first.

    Each class token asks a query, ``q = F.linear(x[:, :n], wq)``; keys and values are all of ``x``.

    Shape: x (B, n + N, C), wq, wk, wv (C, C), ints -> (B, n, C).
    """
    cases = []
    sizes = ((1, 2, 5, 8, 2), (2, 2, 9, 12, 3), (2, 3, 6, 16, 4), (3, 1, 4, 6, 2))  # (B, n, N, C, h)
    for seed, (B, n, N, C, h) in enumerate(sizes):
        g = generator(90 + seed)
        x = torch.randn(B, n + N, C, generator=g)
        wq, wk, wv = (torch.randn(C, C, generator=g) * C**-0.5 for _ in range(3))
        cases.append(Case(f"x {shape(x)}, num_heads={h}, num_queries={n}", (x, wq, wk, wv, h, n)))
    right = "every class token asks a query; the keys and values are all tokens, softmax over the keys"
    wrongs = [
        _wrong(f"only the first class token asks; {right}", queries=1),
        _wrong(f"the keys and values leave out the first class token (x[:, 1:]); {right}", keys_from=1),
        _wrong(f"the keys and values leave out the class tokens; {right}", patches_only=True),
        _wrong("the softmax runs over the queries (dim=-2): with one query that is all ones, with several it mixes "
               f"the class tokens; {right}", softmax_dim=-2),
        _wrong("the logits are scaled by C**-0.5; scale by the head dim, d**-0.5", scale_by_dim=True),
    ]  # fmt: skip
    return run_check("class_attention_tokens", fn, cases, _class_attention_tokens, known_wrong=wrongs)
