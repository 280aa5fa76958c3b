"""Checks for chapter 2 (attention): scaled dot-product attention and the multi-head split."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from einops import rearrange
from torch import Tensor

from vitlab.checks._core import Case, CheckResult, KnownWrong, randn, run_check, shape
from vitlab.layers.attention import explicit_attention


def _reference(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """vitlab's explicit path: softmax(q k^T * d**-0.5, masked) v."""
    return explicit_attention(q, k, v, scale=q.shape[-1] ** -0.5, mask=mask)[0]


def _attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, scale: float | None = None,
    after: float = 1.0, use_mask: bool = True, invert_mask: bool = False, softmax_dim: int = -1,
) -> Tensor:  # fmt: skip
    """Attention with the knobs the known wrong answers turn; the defaults give the right one."""
    logits = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if mask is not None and use_mask:
        logits = logits.masked_fill(mask if invert_mask else ~mask, float("-inf"))
    return (logits.softmax(dim=softmax_dim) * after) @ v


def _wrong(message: str, erratum: int | None = None, **knobs: Any) -> KnownWrong:
    """A wrong attention; a knob may be a function of (d, h*d), the head dim and the embedding size."""

    def fn(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        d, D = q.shape[-1], q.shape[1] * q.shape[-1]
        values: dict[str, Any] = {key: value(d, D) if callable(value) else value for key, value in knobs.items()}
        return _attention(q, k, v, mask, **values)

    return KnownWrong(fn, message, erratum)


_ATTENTION_WRONGS = (
    _wrong(
        "the weights are divided by sqrt(embedding size) after the softmax, as the note's "
        "softmax(energy) / emb_size**0.5; scale the logits q k^T by d**-0.5 before the softmax",
        1, scale=1.0, after=lambda d, D: D**-0.5,
    ),
    _wrong(
        "the weights are scaled by d**-0.5 after the softmax (rows no longer sum to 1); "
        "scale the logits q k^T before the softmax",
        1, scale=1.0, after=lambda d, D: d**-0.5,
    ),
    _wrong(
        "the logits are scaled by the whole embedding size, (h*d)**-0.5; scale by the head dim, d**-0.5",
        1, scale=lambda d, D: D**-0.5,
    ),
    _wrong("the logits are divided by d; divide by sqrt(d)", 1, scale=lambda d, D: 1 / d),
    _wrong("the logits are not scaled; multiply q k^T by d**-0.5 before the softmax", 1, scale=1.0),
    _wrong(
        "the mask has no effect: masked_fill returns a new tensor, so assign it, "
        "logits = logits.masked_fill(~mask, float('-inf')), before the softmax (Tensor.mask_fill does not exist)",
        2, use_mask=False,
    ),
    _wrong("the mask is inverted: True means attend, so fill where ~mask is True", invert_mask=True),
    _wrong(
        "the softmax runs over the queries (dim=-2); each query's weights over the keys (dim=-1) must sum to 1",
        softmax_dim=-2,
    ),
)  # fmt: skip


def scaled_dot_product_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(q, k, v, mask=None) -> out`` (a fixed signature graders rely on).

    ``softmax(q k^T / sqrt(d)) v``; ``mask`` is boolean, broadcastable to (B, h, N, N),
    ``True`` = attend (every query keeps at least one key here). The mask cases pass it
    as ``mask=``; the others leave it out.

    Shape: q, k, v (B, h, N, d), mask (B, h, N, N) or broadcastable -> (B, h, N, d).
    """
    cases = []
    for seed, (B, h, N, d) in enumerate(((1, 2, 4, 8), (2, 3, 5, 4), (2, 2, 6, 8), (1, 2, 5, 16))):
        q, k, v = (randn(10 * seed + i, B, h, N, d) for i in range(3))
        label = f"q, k, v {shape(q)}"
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
    """Check ``fn(x, num_heads) -> heads``: split the channels into ``h`` heads of ``d = C/h``.

    Head ``g`` gets channels ``g*d ... (g+1)*d - 1``, i.e. ``(h d)`` as timm's ``qkv``
    layout: ``rearrange(x, "B N (h d) -> B h N d", h=num_heads)``.

    Shape: x (B, N, C), num_heads int -> (B, h, N, d).
    """
    cases = []
    for seed, (B, N, C, h) in enumerate(((1, 4, 8, 2), (2, 5, 12, 3), (2, 7, 16, 4), (3, 3, 6, 6))):
        x = randn(seed, B, N, C)
        cases.append(Case(f"x {shape(x)}, num_heads={h}", (x, h)))
    wrongs = [
        KnownWrong(
            lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1),
            "a plain reshape to (B, h, N, d) mixes tokens and channels: view as (B, N, h, d), then transpose(1, 2)",
        ),
        KnownWrong(
            lambda x, h: rearrange(x, "B N (d h) -> B h N d", h=h),
            "the channels are split (d h), so head g gets every h-th channel; split them (h d), so head g "
            "gets a contiguous block of d channels",
        ),
    ]
    return run_check(
        "split_heads", fn, cases, lambda x, h: rearrange(x, "B N (h d) -> B h N d", h=h), known_wrong=wrongs
    )
