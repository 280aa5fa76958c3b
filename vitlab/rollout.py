"""Attention rollout (Abnar and Zuidema, 2020): where a token's information comes from.

One attention map says how a block mixes the tokens it receives, but after the first
block those tokens are already mixtures. Rollout follows the mixing back to the input:

1. fuse the heads of each block's map (their mean), ``A_l`` (B, N, N);
2. account for the residual connection, which carries every token past the attention
   unchanged: ``0.5 * A_l + 0.5 * I``, then renormalise the rows to sum to 1;
3. multiply through the blocks, later blocks on the left: ``R = Â_L ... Â_2 Â_1``.

Row ``i`` of ``R`` is then a distribution over the input tokens: how much of output token
``i`` "comes from" each of them, if attention were the only thing that mixed tokens (an
approximation: the MLPs are ignored). The class token's row on the patch grid is the usual
picture. Maps whose rows are not distributions are refused with a ``ValueError``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from vitlab.attention_maps import attention_maps

HeadFusion = Literal["mean", "max"]

# How far a row sum may stray from 1 (float32 softmax over thousands of keys: ~1e-6).
_ROW_SUM_TOLERANCE = 1e-3


def check_distribution(attn: Tensor, name: str = "the map") -> None:
    """Raise ``ValueError`` unless every row of ``attn`` is non-negative and sums to 1.

    Shape: attn (..., N_q, N_k).
    """
    sums = attn.sum(dim=-1)
    lowest = attn.min()
    if lowest < -_ROW_SUM_TOLERANCE or not torch.allclose(sums, torch.ones_like(sums), atol=_ROW_SUM_TOLERANCE):
        raise ValueError(
            f"{name} is not a distribution over the keys (row sums from {sums.min():.3g} to {sums.max():.3g}, "
            f"smallest weight {lowest:.3g}); rollout needs softmax maps, non-negative rows that sum to 1"
        )


def _check_maps(attn_maps: Sequence[Tensor]) -> None:
    if isinstance(attn_maps, Tensor) or len(attn_maps) == 0:
        got = f"a tensor of shape {tuple(attn_maps.shape)}" if isinstance(attn_maps, Tensor) else "an empty list"
        raise ValueError(f"attn_maps must be a non-empty list of (B, h, N, N) maps, one per block; got {got}")
    first = attn_maps[0]
    for index, attn in enumerate(attn_maps):
        if not isinstance(attn, Tensor) or attn.ndim != 4 or attn.shape[-1] != attn.shape[-2]:
            got = tuple(attn.shape) if isinstance(attn, Tensor) else type(attn).__name__
            raise ValueError(f"attn_maps[{index}] must have shape (B, h, N, N), got {got}")
        if attn.shape != first.shape:
            raise ValueError(
                f"every map must have the shape of attn_maps[0], {tuple(first.shape)}; "
                f"attn_maps[{index}] has {tuple(attn.shape)}"
            )
    for index, attn in enumerate(attn_maps):  # shapes first: they name the list's mistake
        check_distribution(attn, f"attn_maps[{index}]")


def attention_rollout(
    attn_maps: Sequence[Tensor], *, head_fusion: HeadFusion = "mean", add_residual: bool = True
) -> Tensor:
    """Attention rollout: the blocks' attention maps, residual included, multiplied through.

    Args:
        attn_maps: one softmax map per block, first block first, e.g.
            ``[m.attn for m in vitlab.attention_maps(model, x)]``.
        head_fusion: the heads' ``"mean"`` (the paper) or elementwise ``"max"``.
        add_residual: ``0.5 * A + 0.5 * I`` for each block, as the paper; False multiplies the raw maps.

    Shape: depth x (B, h, N, N) -> R (B, N, N), ``R = Â_L ... Â_1``.
    """
    _check_maps(attn_maps)
    if head_fusion not in ("mean", "max"):
        raise ValueError(f"head_fusion must be 'mean' or 'max', got {head_fusion!r}")
    B, _, N, _ = attn_maps[0].shape
    eye = torch.eye(N, dtype=attn_maps[0].dtype, device=attn_maps[0].device)
    rollout = eye.expand(B, N, N)
    for attn in attn_maps:
        a = attn.mean(dim=1) if head_fusion == "mean" else attn.amax(dim=1)  # (B, N, N)
        if add_residual:
            a = 0.5 * a + 0.5 * eye  # x + Attn(x): half the token stays itself
        a = a / a.sum(dim=-1, keepdim=True)  # rows sum to 1 again
        rollout = a @ rollout  # this block after all earlier ones
    return rollout


def cls_rollout_map(rollout: Tensor, grid_size: tuple[int, int], num_prefix_tokens: int = 1) -> Tensor:
    """The class token's row of a rollout, without the prefix tokens, on the patch grid.

    Shape: rollout (B, P + h*w, P + h*w) -> (B, h, w), P = ``num_prefix_tokens``.
    """
    h, w = grid_size
    if rollout.ndim != 3 or rollout.shape[1] != rollout.shape[2] or rollout.shape[1] != num_prefix_tokens + h * w:
        raise ValueError(
            f"expected a rollout of shape (B, {num_prefix_tokens + h * w}, {num_prefix_tokens + h * w}) for a "
            f"{h}x{w} grid and {num_prefix_tokens} prefix token(s), got {tuple(rollout.shape)}"
        )
    return rollout[:, 0, num_prefix_tokens:].reshape(-1, h, w)


def _grid_of(num_tokens: int) -> tuple[int, int]:
    """The prefix tokens (cls, dist: 1, 2 or none) before a square patch grid, and its side."""
    for prefix in (1, 2, 0):
        side = math.isqrt(max(num_tokens - prefix, 0))
        if side > 0 and side * side == num_tokens - prefix:
            return prefix, side
    raise ValueError(f"cannot place {num_tokens} tokens on a square patch grid after 0, 1 or 2 prefix tokens")


@torch.no_grad()
def model_rollout(
    model: nn.Module, images: Tensor, *, head_fusion: HeadFusion = "mean", add_residual: bool = True
) -> Tensor:
    """Rollout of the token a model classifies, on its patch grid.

    The last run of square self-attention maps of one shape is rolled out (every block for ViT,
    the last stage for T2T-ViT, PiT, LeViT); the row is the cls token's, or without one (LeViT)
    the mean of all rows, as the head reads the mean; the prefix tokens' part is dropped.

    Shape: images (B, C, H, W) -> (B, h, w), the token grid of those maps.
    """
    records = attention_maps(model, images)
    other = sorted({record.kind for record in records} - {"self"})
    if other:
        raise ValueError(
            f"{type(model).__name__} has attention maps of kind {other}; model_rollout reads self-attention maps only"
        )
    run = [records[-1].attn]  # the last stage: the last maps of one shape
    for record in reversed(records[:-1]):
        if record.attn.shape != run[0].shape:
            break
        run.insert(0, record.attn)
    if run[0].shape[-1] != run[0].shape[-2]:
        raise ValueError(
            f"{type(model).__name__}'s last attention maps are not square, {tuple(run[0].shape)}: rollout "
            f"needs (B, h, N, N) maps whose keys are the query tokens"
        )
    rollout = attention_rollout(run, head_fusion=head_fusion, add_residual=add_residual)  # (B, N, N)
    prefix, side = _grid_of(rollout.shape[-1])
    row = rollout[:, 0] if prefix else rollout.mean(dim=1)  # no class token: the head reads the mean
    return row[:, prefix:].reshape(-1, side, side)
