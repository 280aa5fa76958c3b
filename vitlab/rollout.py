"""Attention rollout (Abnar and Zuidema, 2020): where the class token's information comes from.

One attention map says how a block mixes the tokens it receives, but after the first
block those tokens are already mixtures. Rollout follows the mixing back to the input:

1. fuse the heads of each block's map (their mean, by default), ``A_l`` (B, N, N);
2. account for the residual connection, which carries every token past the attention
   unchanged: ``0.5 * A_l + 0.5 * I``, then renormalise the rows to sum to 1;
3. multiply through the blocks, later blocks on the left: ``R = Â_L ... Â_2 Â_1``.

Row ``i`` of ``R`` is then a distribution over the input tokens: how much of output token
``i`` "comes from" each of them, if attention were the only thing that mixed tokens (the
MLPs and the values' projections are ignored, which is why this is an approximation).
The class token's row, reshaped to the patch grid, is the usual picture.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, cast

import torch
from torch import Tensor, nn

from vitlab.contract import VisionModel

HeadFusion = Literal["mean", "max", "min"]


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


def _discard_lowest(a: Tensor, ratio: float) -> Tensor:
    """Zero the ``ratio`` smallest weights of each row (the diagonal is kept).

    Shape: a (B, N, N) -> (B, N, N).
    """
    n = int(a.shape[-1] * ratio)
    if n == 0:
        return a
    keep_diagonal = torch.eye(a.shape[-1], dtype=torch.bool, device=a.device)
    ranked = a.masked_fill(keep_diagonal, float("inf"))  # never among the smallest
    lowest = ranked.topk(n, dim=-1, largest=False).indices  # (B, N, n)
    return a.scatter(-1, lowest, 0.0)


def attention_rollout(
    attn_maps: Sequence[Tensor],
    *,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    add_residual: bool = True,
) -> Tensor:
    """Attention rollout: the blocks' attention maps, residual included, multiplied through.

    Args:
        attn_maps: one map per block, first block first, each (B, h, N, N) with rows that
            sum to 1 (the softmax output), e.g. from :func:`vitlab.layers.collect_attention_maps`.
        head_fusion: how the heads of a block become one map: their ``"mean"`` (the paper),
            or the elementwise ``"max"`` or ``"min"``.
        discard_ratio: share of the smallest weights of each row set to zero before the
            residual is added (0 keeps all; a common trick to sharpen the picture).
        add_residual: use ``0.5 * A + 0.5 * I`` for each block, as the paper does; with
            False the raw maps are multiplied (the residual stream is ignored).

    Returns:
        R (B, N, N), ``R = Â_L ... Â_1``; each row is a distribution over the input tokens.

    Shape: depth x (B, h, N, N) -> (B, N, N).
    """
    _check_maps(attn_maps)
    if head_fusion not in ("mean", "max", "min"):
        raise ValueError(f"head_fusion must be 'mean', 'max' or 'min', got {head_fusion!r}")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    B, _, N, _ = attn_maps[0].shape
    eye = torch.eye(N, dtype=attn_maps[0].dtype, device=attn_maps[0].device)
    rollout = eye.expand(B, N, N)
    for attn in attn_maps:
        if head_fusion == "mean":
            a = attn.mean(dim=1)  # (B, N, N)
        else:
            a = attn.amax(dim=1) if head_fusion == "max" else attn.amin(dim=1)
        a = _discard_lowest(a, discard_ratio)
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


def _grid_of(num_tokens: int, num_prefix_tokens: int | None) -> tuple[tuple[int, int], int]:
    """A square patch grid and the prefix tokens before it: 197 tokens -> (14, 14), 1."""
    prefixes = [num_prefix_tokens] if num_prefix_tokens is not None else [1, 2, 0]
    for prefix in prefixes:
        side = math.isqrt(max(num_tokens - prefix, 0))
        if side > 0 and side * side == num_tokens - prefix:
            return (side, side), prefix
    raise ValueError(
        f"cannot place {num_tokens} tokens on a square patch grid after {num_prefix_tokens} prefix token(s); "
        f"pass num_prefix_tokens"
    )


@torch.no_grad()
def model_rollout(
    model: nn.Module,
    images: Tensor,
    *,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    add_residual: bool = True,
    num_prefix_tokens: int | None = None,
) -> Tensor:
    """Rollout of the class token of any :class:`~vitlab.contract.VisionModel`, on its patch grid.

    The maps come from ``model.get_attention_maps``; the rollout runs over the maps of the
    last stage (the last maps of one shape, which must be square): every block of a ViT,
    DeiT, DeepViT or T2T-ViT backbone, the last stage of PiT and LeViT. CaiT and CrossViT
    (a single-query map last) and CvT (keys squeezed by ``stride_kv``) raise a ``ValueError``:
    their last maps are not square, and rolling them out needs a rule of its own. The prefix tokens
    (cls, dist) are found from the token count unless ``num_prefix_tokens`` is given; with
    no prefix token (LeViT) the row of token 0 is the first patch's, not a class token's.
    The model is put in eval mode.

    Shape: images (B, C, H, W) -> (B, h, w), the token grid of those maps.
    """
    if not isinstance(model, VisionModel):
        raise TypeError(
            f"expected a vitlab model (forward_features, forward_head, get_attention_maps), got {type(model).__name__}"
        )
    model.eval()
    maps = cast(VisionModel, model).get_attention_maps(images)
    last = maps[-1]
    if last.shape[-1] != last.shape[-2]:
        raise ValueError(
            f"{type(model).__name__}'s last attention map is not square, {tuple(last.shape)}: the rollout "
            f"needs the last stage's maps to be (B, h, N, N)"
        )
    run = [last]  # the last stage: the maps of the last shape, back to the first that differs
    for attn in reversed(maps[:-1]):
        if attn.shape != last.shape:
            break
        run.insert(0, attn)
    rollout = attention_rollout(run, head_fusion=head_fusion, discard_ratio=discard_ratio, add_residual=add_residual)
    grid, prefix = _grid_of(rollout.shape[-1], num_prefix_tokens)
    return cls_rollout_map(rollout, grid, prefix)
