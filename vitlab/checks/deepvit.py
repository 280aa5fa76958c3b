"""Checks for the DeepViT chapter: re-attention's mixing of the heads' maps, and the whole
re-attended map (softmax, mixing, BatchNorm over the heads)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from vitlab.checks._core import Case, CheckResult, KnownWrong, generator, run_check, shape
from vitlab.models.deepvit import ReAttention


def _mix(attn: Tensor, theta: Tensor) -> Tensor:
    """Θ^T on the head axis: new head g = sum_h theta[h, g] * attn[:, h]."""
    return torch.einsum("b h i j, h g -> b g i j", attn, theta)


def re_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(attn, theta) -> mixed``: re-attention's head mixing, before normalisation.

    DeepViT (Zhou et al., 2021, eq. 3) computes ``Norm(Θ^T · A) V``: every new map is a
    learned combination of the ``H`` heads' softmax maps,
    ``mixed[b, g, i, j] = sum_h theta[h, g] * attn[b, h, i, j]``
    (``einsum("bhij,hg->bgij")``; a 1x1 ``Conv2d(H, H)`` with weight ``Θ^T`` and no
    bias does the same). Return the mixed maps before ``Norm`` (BatchNorm in the paper).

    Shape: attn (B, H, N, N), theta (H, H) -> (B, H, N, N).
    """
    cases = []
    for seed, (B, H, N) in enumerate(((1, 2, 4), (2, 3, 5), (2, 4, 7), (1, 6, 3))):
        g = generator(seed)
        attn = torch.randn(B, H, N, N, generator=g).softmax(dim=-1)
        theta = torch.randn(H, H, generator=g)
        cases.append(Case(f"attn {shape(attn)}, theta {shape(theta)}", (attn, theta)))
    wrongs = [
        KnownWrong(
            lambda attn, theta: torch.einsum("b h i j, g h -> b g i j", attn, theta),
            "the heads are mixed with theta instead of its transpose: new head g = sum_h theta[h, g] * attn[:, h]",
        ),
        KnownWrong(
            lambda attn, theta: _mix(attn, theta).softmax(dim=-1),
            "the mixed maps went through a softmax again; return them before any normalisation",
        ),
    ]
    return run_check("re_attention", fn, cases, _mix, known_wrong=wrongs)


def _re_attention_map(scores: Tensor, theta: Tensor, bn: nn.BatchNorm2d) -> Tensor:
    """The re-attended map, computed with vitlab's ``ReAttention`` layers.

    ``reatten_matrix`` gets the weight Θ^T (and a zero bias), ``var_norm`` the state of
    ``bn``; then the module's own line runs: ``var_norm(reatten_matrix(softmax(scores)))``.
    """
    H = theta.shape[0]
    module = ReAttention(H, num_heads=H)  # dim = H: one channel per head is enough here
    with torch.no_grad():
        module.reatten_matrix.weight.copy_(theta.T[:, :, None, None])  # W[g, h] = θ[h, g]
        bias = module.reatten_matrix.bias
        assert bias is not None  # a Conv2d built with bias=True
        bias.zero_()
    module.var_norm = bn
    attn = scores.softmax(dim=-1)  # (B, H, N, N), as in ReAttention.forward
    return module.var_norm(module.reatten_matrix(attn)) * module.reatten_scale


def _bn_over(x: Tensor, dims: tuple[int, ...], bn: nn.BatchNorm2d, channel_dim: int) -> Tensor:
    """Standardise ``x`` over ``dims``, then bn's affine along ``channel_dim`` (for wrong answers)."""
    mean = x.mean(dim=dims, keepdim=True)
    var = x.var(dim=dims, unbiased=False, keepdim=True)
    shape = [1] * x.ndim
    shape[channel_dim] = -1
    y = (x - mean) / torch.sqrt(var + bn.eps)
    return y * bn.weight.view(shape) + bn.bias.view(shape)


_RE_RIGHT = (
    "the map is bn(Θ^T · softmax(scores)): softmax over the keys, mix the heads, then BatchNorm2d over the heads"
)

_RE_ATTENTION_WRONGS = (
    KnownWrong(
        lambda s, t, bn: bn(_mix(s.softmax(-1), t.T)),
        "the heads are mixed with Θ instead of its transpose (the wrong axis of Θ): new head g = "
        "sum_h theta[h, g] * attn[:, h], einsum('bhij,hg->bgij')",
    ),
    KnownWrong(
        lambda s, t, bn: bn(_mix(s, t).softmax(-1)),
        f"the heads are mixed before the softmax; re-attention mixes the softmax maps: {_RE_RIGHT}",
    ),
    KnownWrong(
        lambda s, t, bn: _mix(s.softmax(-1), t),
        f"the BatchNorm is missing (the mixed maps are returned as they are); {_RE_RIGHT}",
    ),
    KnownWrong(
        lambda s, t, bn: bn(_mix(s.softmax(-1), t).transpose(1, 2)).transpose(1, 2),
        "the BatchNorm runs over the query tokens (dim 2) instead of the heads (dim 1); "
        "BatchNorm2d(H) takes the (B, H, N, N) maps as they are, one channel per head",
    ),
    KnownWrong(
        lambda s, t, bn: _bn_over(_mix(s.softmax(-1), t), (1,), bn, 1),
        "the maps are normalised across the heads at each (query, key) pair, a LayerNorm over the "
        "head axis (a popular re-implementation, the one the source note follows); the official "
        "BatchNorm2d normalises each head over the batch and all positions",
    ),
    KnownWrong(
        lambda s, t, bn: _bn_over(_mix(s.softmax(-1), t), (2, 3), bn, 1),
        "each image's map is normalised on its own (statistics over the N x N positions only); "
        "BatchNorm takes each head's statistics over the whole batch too: dims (0, 2, 3)",
    ),
    KnownWrong(
        lambda s, t, bn: bn(_mix(s.softmax(-2), t)),
        "the softmax runs over the queries (dim=-2); every query's row sums to 1: softmax(dim=-1)",
    ),
)


def re_attention_map(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(scores, theta, bn) -> map``: DeepViT's re-attended map, BatchNorm included.

    ``scores`` are one block's scaled attention logits ``q k^T / sqrt(d)``, ``(B, H, N, N)``;
    ``theta`` is the ``(H, H)`` mixing matrix (``theta[h, g]``: how much head ``h`` feeds
    new head ``g``); ``bn`` is an ``nn.BatchNorm2d(H)`` in training mode. The answer is
    ``bn(einsum("bhij,hg->bgij", scores.softmax(-1), theta))``, the map that
    :class:`vitlab.models.deepvit.ReAttention` multiplies the values with (its
    ``reatten_matrix`` holds Θ^T, here with a zero bias; its ``var_norm`` is ``bn``).

    Shape: scores (B, H, N, N), theta (H, H) -> (B, H, N, N).
    """
    cases = []
    # The first case has N == H, so that a BatchNorm over the wrong axis runs and is recognised.
    for seed, (B, H, N) in enumerate(((2, 3, 3), (2, 4, 5), (3, 2, 6), (2, 6, 4))):
        g = generator(50 + seed)
        scores = torch.randn(B, H, N, N, generator=g) * 2
        theta = torch.randn(H, H, generator=g)
        bn = nn.BatchNorm2d(H)  # training mode: batch statistics
        with torch.no_grad():
            bn.weight.copy_(1 + 0.5 * torch.randn(H, generator=g))
            bn.bias.copy_(0.5 * torch.randn(H, generator=g))
        label = f"scores {shape(scores)}, theta {shape(theta)}, BatchNorm2d({H}) in training mode"
        cases.append(Case(label, (scores, theta, bn)))
    return run_check("re_attention_map", fn, cases, _re_attention_map, known_wrong=_RE_ATTENTION_WRONGS)
