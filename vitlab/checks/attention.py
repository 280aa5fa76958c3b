"""Checks for chapter 2 (attention): scaled dot-product attention and the multi-head split."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from vitlab.checks._core import Case, CheckResult, KnownWrong, randn, run_check, shape
from vitlab.checks._slips import (
    NAIVE_SOFTMAX,
    OVER_QUERIES,
    RESHAPED_WEIGHT,
    SCALED_AFTER,
    TOTAL_WIDTH,
    UNSCALED,
    naive_softmax_of,
    turned,
)


def _reference(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """softmax(q k^T * d**-0.5, masked) v."""
    return _attention(q, k, v, mask)


def _width(q: Tensor, v: Tensor, width: str | float) -> float:
    """The scale a knob names: ``"d"`` (the head width's d**-0.5, right), ``"total"`` ((h*d)**-0.5), ``"v"``
    (the value width's), ``"1/d"``, or a number."""
    d = q.shape[-1]
    named = {"d": d**-0.5, "total": (q.shape[1] * d) ** -0.5, "v": v.shape[-1] ** -0.5, "1/d": 1 / d}
    return named[width] if isinstance(width, str) else width


def _attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, scale: str | float = "d",
    after: str | float = 1.0, mask_as: str = "fill", softmax_dim: int = -1, fill: float = float("-inf"),
    naive_softmax: bool = False,
) -> Tensor:  # fmt: skip
    """Attention with the knobs the known wrong answers turn (``scale``, ``after``: see :func:`_width`;
    ``mask_as``: ``"fill"``, ``"none"``, ``"inverted"``, ``"after"`` the softmax, ``"renormalised"``
    after it, ``"added"`` as 0/1, or ``"sdpa_inverted"``); the defaults give the right one."""
    if mask is not None and mask_as == "sdpa_inverted":  # True = ignore, given to SDPA (True = attend)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=~mask, scale=_width(q, v, scale))
    logits = (q @ k.transpose(-2, -1)) * _width(q, v, scale)
    if mask is not None and mask_as in ("fill", "inverted"):
        logits = logits.masked_fill(mask if mask_as == "inverted" else ~mask, fill)
    if mask is not None and mask_as == "added":
        logits = logits + mask.float()
    weights = naive_softmax_of(logits, softmax_dim) if naive_softmax else logits.softmax(dim=softmax_dim)
    if mask is not None and mask_as in ("after", "renormalised"):
        weights = weights.masked_fill(~mask, 0.0)
    if mask is not None and mask_as == "renormalised":
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights * _width(q, v, after)) @ v


# The slips of both attention checks: the scale, the softmax, the masked logits.
_SLIPS = (
    ("the weights are divided by sqrt(embedding size) after the softmax, softmax(energy) / emb_size**0.5; scale "
     "the logits q k^T by d**-0.5 before the softmax", 3, {"scale": 1.0, "after": "total"}),
    (SCALED_AFTER, 3, {"scale": 1.0, "after": "d"}),
    (TOTAL_WIDTH, 3, {"scale": "total"}),
    ("the logits are divided by d; divide by sqrt(d)", 3, {"scale": "1/d"}),
    (UNSCALED, 3, {"scale": 1.0}),
    (OVER_QUERIES, None, {"softmax_dim": -2}),
    (NAIVE_SOFTMAX, None, {"naive_softmax": True}),
    ("the masked logits are set to 0, which still gives those keys the weight exp(0) = 1 before normalising; "
     "fill them with float('-inf'), whose weight is exactly 0", None, {"fill": 0.0}),
    ("the mask zeroes the weights after the softmax, so a row no longer sums to 1; fill the logits with "
     "float('-inf') before the softmax, which renormalises over the keys that are left", None, {"mask_as": "after"}),
    ("the masked weights are zeroed after the softmax and the rest renormalised: with large logits the masked "
     "keys take all the weight, the others underflow to 0 and 0 / 0 is NaN; fill the logits with float('-inf') "
     "before the softmax", None, {"mask_as": "renormalised"}),
    ("the 0/1 mask is added to the logits, which only nudges them by 1; fill the masked logits with float('-inf') "
     "(masked_fill), or add a float mask of 0 and -inf", None, {"mask_as": "added"}),
)  # fmt: skip
_ATTENTION_WRONGS = turned(_attention, (
    *_SLIPS,
    ("the mask has no effect: masked_fill returns a new tensor, so assign it, logits = logits.masked_fill(~mask, "
     "float('-inf')), before the softmax (Tensor.mask_fill does not exist)", 4, {"mask_as": "none"}),
    ("the mask is inverted: True means attend, so fill where ~mask is True", None, {"mask_as": "inverted"}),
))  # fmt: skip


def scaled_dot_product_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(q, k, v, mask=None) -> out``: ``softmax(q k^T / sqrt(d)) v``, boolean ``mask`` True = attend.

    The last case has logits past 88, where a softmax written as ``exp(x) / sum(exp(x))`` overflows.

    Shape: q, k, v (B, h, N, d), mask (B, h, N, N) or broadcastable -> (B, h, N, d).
    """
    cases = []
    for seed, (B, h, N, d) in enumerate(((1, 2, 4, 8), (2, 3, 5, 4), (2, 2, 6, 8), (1, 2, 5, 16), (2, 2, 6, 8))):
        q, k, v = (randn(10 * seed + i, B, h, N, d) for i in range(3))
        label = f"q, k, v {shape(q)}"
        if seed == 4:  # large logits: q and k 8 times larger, |logits| up to about 160
            q, k = 8 * q, 8 * k
            largest = (q @ k.transpose(-2, -1) * d**-0.5).abs().max().item()
            cases.append(Case(f"{label}, large logits (|q k^T / sqrt(d)| up to {largest:.0f})", (q, k, v)))
            continue
        if seed == 2:  # padding mask per image: the last 2 keys of image 0, the last key of image 1
            lengths = torch.tensor([N - 2, N - 1])
            mask = (torch.arange(N) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, N)
            cases.append(Case(f"{label}, padding mask {shape(mask)}", (q, k, v), {"mask": mask}))
        elif seed == 3:  # causal mask, broadcast over batch and heads
            mask = torch.ones(N, N, dtype=torch.bool).tril()
            cases.append(Case(f"{label}, causal mask {shape(mask)}", (q, k, v), {"mask": mask}))
        else:
            cases.append(Case(label, (q, k, v)))
    return run_check("scaled_dot_product_attention", fn, cases, _reference, known_wrong=_ATTENTION_WRONGS)


def split_heads(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, num_heads) -> heads``: ``rearrange(x, "B N (h d) -> B h N d", h=num_heads)``.

    Shape: x (B, N, C), num_heads int -> (B, h, N, d).
    """
    cases = []
    for seed, (B, N, C, h) in enumerate(((1, 4, 8, 2), (2, 5, 12, 3), (2, 7, 16, 4), (3, 3, 6, 6))):
        x = randn(seed, B, N, C)
        cases.append(Case(f"x {shape(x)}, num_heads={h}", (x, h)))
    wrongs = [
        KnownWrong(lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1),
                   "a plain reshape to (B, h, N, d) mixes tokens and channels: "
                   "view as (B, N, h, d), then transpose(1, 2)"),
        KnownWrong(lambda x, h: rearrange(x, "B N (d h) -> B h N d", h=h),
                   "the channels are split (d h), so head g gets every h-th channel; split them (h d), so head g gets "
                   "a contiguous block of d channels"),
    ]  # fmt: skip
    return run_check(
        "split_heads", fn, cases, lambda x, h: rearrange(x, "B N (h d) -> B h N d", h=h), known_wrong=wrongs
    )


def _qkv_weight(query: Tensor, key: Tensor, value: Tensor) -> Tensor:
    """timm's conversion (``_load_weights`` in ``vision_transformer.py``): each (C, h, d)
    kernel flattened to (C, h*d), stacked as three blocks, transposed to (out, in)."""
    return torch.cat([w.reshape(w.shape[0], -1) for w in (query, key, value)], dim=1).T  # (3C, C)


_QKV_WRONGS = (
    KnownWrong(lambda q, k, v: torch.stack([q, k, v], dim=-1).reshape(q.shape[0], -1).T,
               "q, k and v are interleaved feature by feature, the (h d qkv) order; the fused layer holds three "
               "consecutive blocks, (qkv h d): all of the query's features, then the key's, then the value's", 5),
    KnownWrong(lambda q, k, v: torch.stack([q, k, v], dim=2).reshape(q.shape[0], -1).T,
               "q, k and v are interleaved head by head, (h qkv d); the fused layer holds three consecutive blocks, "
               "(qkv h d)"),
    KnownWrong(lambda q, k, v: torch.cat([w.transpose(1, 2).reshape(w.shape[0], -1) for w in (q, k, v)], dim=1).T,
               "inside each block the features are ordered (d h), so head g gets every h-th feature; flatten each "
               "kernel's (h, d) axes as (h d), head after head"),
    KnownWrong(lambda q, k, v: torch.cat([w.reshape(w.shape[0], -1) for w in (q, k, v)], dim=1).reshape(-1, q.shape[0]),
               "the (C, 3C) kernel is reshaped to (3C, C) instead of transposed: nn.Linear stores its weight as "
               "(out_features, in_features), so take the transpose, .T"),
    KnownWrong(lambda q, k, v: torch.cat([w.reshape(w.shape[0], -1) for w in (k, q, v)], dim=1).T,
               "the blocks are in the order k, q, v; vitlab and timm split the fused output as q, k, v"),
    KnownWrong(lambda q, k, v: torch.stack([q, k, v]).reshape(3 * q.shape[0], q.shape[0]), RESHAPED_WEIGHT),
)  # fmt: skip


def qkv_weight_from_jax(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(query, key, value) -> weight``: the JAX ViT's ``(C, h, d)`` kernels as one fused ``qkv``.

    The weight of ``nn.Linear(C, 3 * C)``, ``(out, in)``, output features in ``(qkv h d)`` order.

    Shape: query, key, value (C, h, d) each -> (3 * C, C).
    """
    cases = []
    for seed, (C, h) in enumerate(((8, 2), (12, 3), (16, 4))):
        d = C // h
        query, key, value = (randn(10 * seed + i, C, h, d) for i in range(3))
        cases.append(Case(f"query, key, value {shape(query)} each", (query, key, value)))
    return run_check("qkv_weight_from_jax", fn, cases, _qkv_weight, known_wrong=_QKV_WRONGS)


def _padded_cross(q: Tensor, k: Tensor, v: Tensor, key_lengths: Tensor, *, extra_key: int = 0, **knobs: Any) -> Tensor:
    """Cross-attention with a key padding mask; ``extra_key`` and the knobs of :func:`_attention` make wrong answers."""
    real = torch.arange(k.shape[-2]) < key_lengths[:, None] + extra_key  # (B, N): the real keys
    return _attention(q, k, v, real[:, None, None, :], **knobs)  # the mask (B, 1, 1, N): over heads and queries


_CROSS_WRONGS = turned(_padded_cross, (
    ("the padding keys are not masked, so every query also attends to them; build the mask from key_lengths, "
     "torch.arange(N) < key_lengths[:, None], and assign logits = logits.masked_fill(~mask, float('-inf')) "
     "(masked_fill returns a new tensor)", 4, {"mask_as": "none"}),
    ("one padding key too many is kept: key j of sequence b is real when j < key_lengths[b], "
     "torch.arange(N) < key_lengths[:, None] (not <=)", None, {"extra_key": 1}),
    ("one real key too few is kept: key j of sequence b is real when j < key_lengths[b], "
     "torch.arange(N) < key_lengths[:, None] (not key_lengths - 1)", None, {"extra_key": -1}),
    ("the logits are scaled by the value width, v.shape[-1]**-0.5; the scale belongs to the dot product q k^T, "
     "so use the query/key width, q.shape[-1]**-0.5", 3, {"scale": "v"}),
    *_SLIPS,
    ("the mask says True = ignore (nn.MultiheadAttention's key_padding_mask), but F.scaled_dot_product_attention "
     "reads True = attend: pass it the real keys, torch.arange(N) < key_lengths[:, None]", None,
     {"mask_as": "sdpa_inverted"}),
    ("the mask is inverted: the padding keys are the ones kept; fill the logits where ~real is True", None,
     {"mask_as": "inverted"}),
    *((f"the scale is {w}**-0.5 in every case, a fixed width (a variable of the notebook, such as d?); take it "
       "from the inputs: q.shape[-1]**-0.5", None, {"scale": w**-0.5})
      for w in (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 384, 768)),
))  # fmt: skip


def padded_cross_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(q, k, v, key_lengths) -> out``: cross-attention over padded key sequences.

    Sequence ``b`` has ``key_lengths[b]`` real keys, then padding: ``softmax(q k^T * d**-0.5``
    with the padding keys' logits at -inf``) v``, ``d = q.shape[-1]`` (``d_v`` may differ).

    Shape: q (B, h, M, d), k (B, h, N, d), v (B, h, N, d_v), key_lengths (B,) integer -> (B, h, M, d_v).
    """
    cases = []
    sizes = (
        ((2, 1, 3, 5, 4, 4), (5, 3)), ((3, 2, 1, 6, 8, 4), (6, 2, 4)), ((2, 2, 4, 7, 8, 16), (1, 7)),
        ((2, 2, 4, 6, 8, 8), (6, 4)),
    )  # fmt: skip
    for seed, ((B, h, M, N, d, d_v), lengths) in enumerate(sizes):
        q, k = randn(40 + 3 * seed, B, h, M, d), randn(41 + 3 * seed, B, h, N, d)
        v = randn(42 + 3 * seed, B, h, N, d_v)
        key_lengths = torch.tensor(lengths)
        label = f"q {shape(q)}, k {shape(k)}, v {shape(v)}, key_lengths {list(lengths)}"
        if seed == 3:  # q and k 8 times larger: logits past exp's float32 range (a softmax must not overflow)
            q, k = 8 * q, 8 * k
            label += f", large logits (up to {(q @ k.transpose(-2, -1) * d**-0.5).abs().max().item():.0f} in size)"
        cases.append(Case(label, (q, k, v, key_lengths)))
    return run_check("padded_cross_attention", fn, cases, _padded_cross, known_wrong=_CROSS_WRONGS)
