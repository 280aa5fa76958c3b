"""Checks for the DeepViT chapter: re-attention across a change of head count, and its LayerNorm variant."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from vitlab.checks._core import Case, CheckResult, KnownWrong, generator, run_check, shape
from vitlab.checks._slips import (
    MERGED_BY_RESHAPE,
    NAIVE_SOFTMAX,
    OVER_QUERIES,
    SCALED_AFTER,
    TOTAL_WIDTH,
    UNSCALED,
    naive_softmax_of,
    turned,
)


def _mix(attn: Tensor, theta: Tensor) -> Tensor:
    """Θ^T on the head axis: new head g = sum_h theta[h, g] * attn[:, h]."""
    return torch.einsum("b h i j, h g -> b g i j", attn, theta)


def _running_statistics(x: Tensor, bn: nn.BatchNorm2d) -> Tensor:
    """bn in eval mode: its running mean and variance instead of the batch's."""
    return F.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias, training=False, eps=bn.eps)


def _re_attention_layernorm(attn: Tensor, theta: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """Θ^T on the heads, then ``nn.LayerNorm(H)`` across the heads at every (b, i, j)."""
    mixed = rearrange(_mix(attn, theta), "b h i j -> b i j h")
    return rearrange(F.layer_norm(mixed, (theta.shape[0],), weight, bias), "b i j h -> b h i j")


def _standardise(x: Tensor, dims: tuple[int, ...], weight: Tensor, bias: Tensor, *, unbiased: bool = False,
                 eps: float = 1e-5, eps_inside: bool = True) -> Tensor:  # fmt: skip
    """``x`` standardised over ``dims`` (eps 1e-5 in the root, as LayerNorm and BatchNorm), then ``weight``/``bias``
    per head."""
    var = x.var(dim=dims, unbiased=unbiased, keepdim=True)
    std = torch.sqrt(var + eps) if eps_inside else var.sqrt() + eps
    return (x - x.mean(dim=dims, keepdim=True)) / std * weight.view(1, -1, 1, 1) + bias.view(1, -1, 1, 1)


_LN_RIGHT = (
    "normalise the H mixed values at every (b, i, j): dims (1,), biased variance, eps 1e-5, then weight and bias"
)

_RE_ATTENTION_LN_WRONGS = (
    KnownWrong(lambda a, t, w, b: _standardise(_mix(a, t), (0, 2, 3), w, b),
               "each head is standardised over the batch and all positions, the official BatchNorm2d; "
               f"this exercise normalises across the heads: {_LN_RIGHT}"),
    KnownWrong(lambda a, t, w, b: _standardise(_mix(a, t), (3,), w, b),
               f"the maps are normalised over the keys (the last axis, where F.layer_norm works unless the "
               f"head axis is moved there); {_LN_RIGHT}"),
    KnownWrong(lambda a, t, w, b: _standardise(_mix(a, t), (1, 2, 3), w, b),
               "each image is normalised over all heads and positions together (a GroupNorm with one group); "
               + _LN_RIGHT),
    KnownWrong(lambda a, t, w, b: _re_attention_layernorm(a, t.T, w, b),
               "the heads are mixed with Θ instead of its transpose: new head g = sum_h theta[h, g] * attn[:, h], "
               "einsum('bhij,hg->bgij')"),
    KnownWrong(lambda a, t, w, b: _standardise(_mix(a, t), (1,), w, b, unbiased=True),
               "the variance is the unbiased one (divided by H - 1); LayerNorm divides by H: var(unbiased=False)"),
    KnownWrong(lambda a, t, w, b: _re_attention_layernorm(a, t, torch.ones_like(w), torch.zeros_like(b)),
               "weight and bias are not applied: after normalising, multiply by weight and add bias, per head"),
    *(KnownWrong(lambda a, t, w, b, e=e, inside=inside: _standardise(_mix(a, t), (1,), w, b, eps=e, eps_inside=inside),
                 message)
      for message, e, inside in (
          ("eps is added to the standard deviation (std + eps); LayerNorm takes sqrt(var + 1e-5)", 1e-5, False),
          ("eps is missing: LayerNorm divides by sqrt(var + 1e-5)", 0.0, True),
          ("eps is 1e-6 (timm's ViT LayerNorms); nn.LayerNorm's default, asked for here, is 1e-5", 1e-6, True),
      )),
    KnownWrong(lambda a, t, w, b: _standardise(_mix(a, t), (2, 3), w, b),
               f"each head's map is normalised over its (query, key) positions (an InstanceNorm); {_LN_RIGHT}"),
    KnownWrong(lambda a, t, w, b: _re_attention_layernorm(a, t, b, w), "weight and bias are swapped"),
    KnownWrong(lambda a, t, w, b: _mix(_standardise(a, (1,), w, b), t),
               f"the LayerNorm runs before the mixing; it normalises the mixed maps: {_LN_RIGHT}"),
)  # fmt: skip


def re_attention_layernorm(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(attn, theta, weight, bias) -> map``: re-attention with a LayerNorm across the heads.

    ``einsum("bhij,hg->bgij", attn, theta)``, then ``nn.LayerNorm(H)`` over the head axis at every
    ``(b, i, j)`` (biased variance, eps 1e-5), scaled by ``weight`` and shifted by ``bias`` per head.

    Shape: attn (B, H, N, N), theta (H, H), weight (H,), bias (H,) -> (B, H, N, N).
    """
    cases = []
    for seed, (B, H, N) in enumerate(((2, 3, 4), (1, 4, 5), (2, 2, 3), (3, 6, 4))):
        g = generator(70 + seed)
        attn = (torch.randn(B, H, N, N, generator=g) * 2).softmax(dim=-1)
        theta = torch.randn(H, H, generator=g)
        weight = 1 + 0.5 * torch.randn(H, generator=g)
        bias = 0.5 * torch.randn(H, generator=g)
        label = f"attn {shape(attn)}, theta {shape(theta)}, weight and bias ({H},)"
        cases.append(Case(label, (attn, theta, weight, bias)))
    return run_check("re_attention_layernorm", fn, cases, _re_attention_layernorm, known_wrong=_RE_ATTENTION_LN_WRONGS)


def _re_attention_heads(q: Tensor, k: Tensor, v: Tensor, theta: Tensor, bn: nn.BatchNorm2d, *,
                        scale_by: str = "key", merge: str = "h d") -> Tensor:  # fmt: skip
    """Softmax maps of ``H_in`` heads, mixed by Θ into ``H_out``, ``bn``, times the values, heads merged;
    ``scale_by`` (``"value"``, ``"total"``, ``"none"``, ``"after"``), ``merge`` (``"d h"``, ``"reshape"``): slips."""
    d = {"key": q.shape[-1], "value": v.shape[-1], "total": q.shape[1] * q.shape[-1]}.get(scale_by, 1)
    attn = (q @ k.transpose(-2, -1) * d**-0.5).softmax(dim=-1)  # (B, H_in, N, N)
    attn = attn * q.shape[-1] ** -0.5 if scale_by == "after" else attn
    out = bn(_mix(attn, theta)) @ v  # (B, H_out, N, d_v)
    if merge == "reshape":
        return out.reshape(out.shape[0], out.shape[2], -1)
    return rearrange(out, f"b h n d -> b n ({merge})")


def _heads_wrong(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """A wrong re-attended map ``fn(logits, theta, bn)``, then the values and the merge."""

    def answer(q: Tensor, k: Tensor, v: Tensor, theta: Tensor, bn: nn.BatchNorm2d) -> Tensor:
        logits = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        return rearrange(fn(logits, theta, bn) @ v, "b h n d -> b n (h d)")

    return answer


_HEADS_RIGHT = "softmax over the keys, mix the H_in maps into H_out with einsum('bhij,hg->bgij'), then bn"

_RE_ATTENTION_HEADS_WRONGS = (
    KnownWrong(_heads_wrong(lambda s, t, bn: bn(_mix(s.softmax(-1), t.T))),
               "the heads are mixed with Θ instead of its transpose (the wrong axis of Θ; with H_in != H_out it does "
               "not even run): new head g = sum_h theta[h, g] * attn[:, h], einsum('bhij,hg->bgij')"),
    KnownWrong(_heads_wrong(lambda s, t, bn: bn(_mix(s, t).softmax(-1))),
               f"the heads are mixed before the softmax; re-attention mixes the softmax maps: {_HEADS_RIGHT}"),
    KnownWrong(_heads_wrong(lambda s, t, bn: _mix(bn(s.softmax(-1)), t)),
               f"the BatchNorm runs before the mixing; bn has one channel per OUTPUT head (H_out): {_HEADS_RIGHT}"),
    KnownWrong(_heads_wrong(lambda s, t, bn: _mix(s.softmax(-1), t)),
               f"the BatchNorm is missing (the mixed maps multiply the values as they are); {_HEADS_RIGHT}"),
    KnownWrong(_heads_wrong(lambda s, t, bn: _running_statistics(_mix(s.softmax(-1), t), bn)),
               "the BatchNorm uses its running statistics (bn in eval mode); bn is in training mode: it normalises "
               "each output head with the batch's own mean and variance over (B, N, N)"),
    KnownWrong(_heads_wrong(lambda s, t, bn: _standardise(_mix(s.softmax(-1), t), (1,), bn.weight, bn.bias)),
               "the maps are normalised across the heads at each (query, key) pair (a LayerNorm over the head axis); "
               "BatchNorm2d(H_out) normalises each output head over the batch and all positions"),
    KnownWrong(_heads_wrong(lambda s, t, bn: bn(_mix(s.softmax(-2), t))), OVER_QUERIES),
    KnownWrong(lambda q, k, v, t, bn: _re_attention_heads(q, k, v, t, bn, scale_by="value"),
               "the logits are scaled by the value head width; q k^T is a dot product of key-width vectors: scale by "
               "d_k**-0.5, d_k = q.shape[-1]"),
    KnownWrong(lambda q, k, v, t, bn: _re_attention_heads(q, k, v, t, bn, merge="d h"),
               "the heads are merged (d h): output channel c * H_out + g holds head g's channel c; merge them head by "
               "head, rearrange(out, 'b h n d -> b n (h d)')"),
    KnownWrong(_heads_wrong(lambda s, t, bn: bn(_mix(naive_softmax_of(s), t))), NAIVE_SOFTMAX),
    *turned(_re_attention_heads, (
        (UNSCALED, 3, {"scale_by": "none"}),
        (SCALED_AFTER, 3, {"scale_by": "after"}),
        (TOTAL_WIDTH, 3, {"scale_by": "total"}),
        (MERGED_BY_RESHAPE, None, {"merge": "reshape"}),
    )),
)  # fmt: skip


def re_attention_heads(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(q, k, v, theta, bn) -> out``: re-attention that changes the number of heads.

    ``attn = softmax(q k^T / sqrt(d_k))`` over ``H_in`` heads; ``bn(einsum("bhij,hg->bgij", attn, theta))``
    with ``bn`` a ``BatchNorm2d(H_out)`` in training mode; times ``v``; heads merged ``(h d)``.

    Shape: q, k (B, H_in, N, d_k), v (B, H_out, N, d_v), theta (H_in, H_out)
    -> (B, N, H_out * d_v).
    """
    cases = []
    # (B, H_in, H_out, N, d_k, d_v, logit gain)
    sizes = ((2, 4, 4, 5, 8, 8, 1.0), (2, 8, 4, 6, 4, 16, 1.0), (3, 6, 3, 4, 8, 4, 1.0), (2, 2, 6, 5, 8, 2, 1.0),
             (2, 8, 4, 5, 4, 16, 12.0))  # fmt: skip
    for seed, (B, h_in, h_out, N, d_k, d_v, gain) in enumerate(sizes):
        g = generator(90 + seed)
        q = torch.randn(B, h_in, N, d_k, generator=g) * gain
        k = torch.randn(B, h_in, N, d_k, generator=g) * gain
        v = torch.randn(B, h_out, N, d_v, generator=g)
        theta = torch.randn(h_in, h_out, generator=g)
        bn = nn.BatchNorm2d(h_out)  # training mode: batch statistics
        with torch.no_grad():
            bn.weight.copy_(1 + 0.5 * torch.randn(h_out, generator=g))
            bn.bias.copy_(0.5 * torch.randn(h_out, generator=g))
            assert bn.running_mean is not None and bn.running_var is not None
            bn.running_mean.copy_(0.2 * torch.randn(h_out, generator=g))  # as after some training
            bn.running_var.copy_(0.5 + torch.rand(h_out, generator=g))
        label = f"q, k {shape(q)}, v {shape(v)}, theta {shape(theta)}: {h_in} heads into {h_out}"
        if gain != 1.0:
            logits = (q @ k.transpose(-2, -1) * d_k**-0.5).abs().max().item()
            label += f", large logits (up to {logits:.0f})"
        cases.append(Case(label, (q, k, v, theta, bn)))
    return run_check("re_attention_heads", fn, cases, _re_attention_heads, known_wrong=_RE_ATTENTION_HEADS_WRONGS)
