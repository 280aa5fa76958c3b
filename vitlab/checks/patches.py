"""Checks for chapter 1 (patches): ``patchify`` and its inverse ``unpatchify``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from vitlab.checks._core import Case, CheckResult, KnownWrong, randn, run_check, shape

# (B, C, H, W, P): batch 1 and > 1, non-square images, 1 to 3 channels.
_IMAGES = ((1, 3, 8, 8, 4), (2, 3, 8, 12, 4), (3, 1, 6, 9, 3), (2, 2, 4, 8, 2))


def _patchify(images: Tensor, patch_size: int) -> Tensor:
    return rearrange(images, "B C (h p1) (w p2) -> B (h w) (p1 p2 C)", p1=patch_size, p2=patch_size)


def _unpatchify(patches: Tensor, patch_size: int, grid_size: tuple[int, int]) -> Tensor:
    p, h = patch_size, grid_size[0]
    return rearrange(patches, "B (h w) (p1 p2 C) -> B C (h p1) (w p2)", h=h, p1=p, p2=p)


_PATCHIFY_WRONGS = (
    KnownWrong(lambda x, p: F.unfold(x, kernel_size=p, stride=p).transpose(1, 2),
               "each patch's pixels are in (c p1 p2) order, what F.unfold gives; this exercise asks for (p1 p2 c), "
               "as vitlab.layers.patchify: rearrange 'B C (h p1) (w p2) -> B (h w) (p1 p2 C)'"),
    KnownWrong(lambda x, p: rearrange(x, "B C (h p1) (w p2) -> B (w h) (p1 p2 C)", p1=p, p2=p),
               "the patches are numbered column by column (w h); number them row by row (h w)"),
    KnownWrong(lambda x, p: rearrange(x, "B C (h p1) (w p2) -> B (h w) (p2 p1 C)", p1=p, p2=p),
               "each patch is flattened column by column (p2 p1 c); flatten it row by row (p1 p2 c)"),
    KnownWrong(lambda x, p: x.reshape(x.shape[0], -1, p * p * x.shape[1]),
               "a plain reshape of (B, C, H, W) does not cut P x P patches: split H and W into (h p1) and (w p2) "
               "first, e.g. with einops.rearrange"),
)  # fmt: skip


def patchify(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(images, patch_size) -> patches``: row-major patches, each flattened ``(p1 p2 c)``.

    Shape: images (B, C, H, W), patch_size int -> (B, N, P*P*C), N = (H/P)(W/P).
    """
    cases = []
    for seed, (B, C, H, W, P) in enumerate(_IMAGES):
        x = randn(seed, B, C, H, W)
        cases.append(Case(f"images {shape(x)}, patch_size={P}", (x, P)))
    return run_check("patchify", fn, cases, _patchify, known_wrong=_PATCHIFY_WRONGS)


def unpatchify(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(patches, patch_size, grid_size) -> images``, the inverse of ``patchify``; ``grid_size = (h, w)``.

    Shape: patches (B, h*w, P*P*C), patch_size int, grid_size (h, w) -> (B, C, h*P, w*P).
    """
    cases = []
    for seed, (B, C, H, W, P) in enumerate(_IMAGES):
        patches = _patchify(randn(seed, B, C, H, W), P)
        grid = (H // P, W // P)
        cases.append(Case(f"patches {shape(patches)}, patch_size={P}, grid_size={grid}", (patches, P, grid)))
    wrongs = [
        KnownWrong(lambda x, p, g: rearrange(x, "B (h w) (C p1 p2) -> B C (h p1) (w p2)", h=g[0], p1=p, p2=p),
                   "each patch's pixels were read as (c p1 p2); patchify wrote them (p1 p2 c)"),
        KnownWrong(lambda x, p, g: rearrange(x, "B (w h) (p1 p2 C) -> B C (h p1) (w p2)", h=g[0], p1=p, p2=p),
                   "the patches were read column by column (w h); patchify numbers them row by row (h w)"),
        KnownWrong(lambda x, p, g: x.reshape(x.shape[0], -1, g[0] * p, g[1] * p),
                   "a plain reshape does not put the patches back in place: "
                   "rearrange 'B (h w) (p1 p2 C) -> B C (h p1) (w p2)'"),
    ]  # fmt: skip
    return run_check("unpatchify", fn, cases, _unpatchify, known_wrong=wrongs)
