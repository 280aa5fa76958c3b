"""Checks for the DeepViT chapter: re-attention's mixing of the heads' maps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from vitlab.checks._core import Case, CheckResult, KnownWrong, generator, run_check, shape


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
