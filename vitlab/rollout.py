"""Attention rollout (Abnar and Zuidema, 2020): where a token's information comes from.

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

Rollout needs maps whose rows are distributions (non-negative, summing to 1), and refuses
others with a ``ValueError``. Two kinds of layer mix their heads' softmax maps linearly,
so their maps are not distributions (:class:`vitlab.contract.AttentionMap`): CaiT's
talking heads (after ``proj_w``) and DeepViT's re-attention (after its BatchNorm).
:func:`model_rollout` rolls out those layers' softmax maps *before* the mixing
(``AttentionMap.unmixed``): the heads are averaged anyway, and a linear mix with
negative weights has no reading as "how much of token j flows into token i". It is one
more approximation, and says so.

:func:`model_rollout` applies this to any registered model; the families whose maps are
not one square map per block (CaiT, CrossViT, CvT) get a rule of their own, chosen by
their ``FAMILY.rollout`` and written in :func:`rollout_relevance`. A model without a class
token (LeViT) classifies the mean of its tokens, so its relevance is the mean of all
tokens' rows, not any one token's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

import torch
from torch import Tensor, nn

from vitlab.attention_maps import attention_maps
from vitlab.contract import AttentionMap, RolloutRule, VisionModel

HeadFusion = Literal["mean", "max", "min"]

# How far a row sum may stray from 1 (float32 softmax over thousands of keys: ~1e-6).
_ROW_SUM_TOLERANCE = 1e-3


def check_distribution(attn: Tensor, name: str = "the map") -> None:
    """Raise ``ValueError`` unless every row of ``attn`` is a distribution over the keys:
    no weight below 0 and every row summing to 1 (what rollout multiplies).

    Shape: attn (..., N_q, N_k).
    """
    sums = attn.sum(dim=-1)
    lowest = attn.min()
    if lowest < -_ROW_SUM_TOLERANCE or not torch.allclose(sums, torch.ones_like(sums), atol=_ROW_SUM_TOLERANCE):
        raise ValueError(
            f"{name} is not a distribution over the keys (row sums from {sums.min():.3g} to {sums.max():.3g}, "
            f"smallest weight {lowest:.3g}); rollout needs softmax maps, non-negative rows that sum to 1. "
            f"A layer that mixes its heads (CaiT's talking heads, DeepViT's re-attention) makes such maps: roll "
            f"out its softmax maps before the mixing, AttentionMap.unmixed of vitlab.attention_maps"
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
    for index, attn in enumerate(attn_maps):
        check_distribution(attn, f"attn_maps[{index}]")


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
            sum to 1 (the softmax output), e.g. from :func:`vitlab.layers.collect_attention_maps`;
            a map whose rows are not distributions raises ``ValueError``.
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


def _fuse_class_row(attn: Tensor, head_fusion: HeadFusion, discard_ratio: float) -> Tensor:
    """Fuse the heads of a single-query map and zero its ``discard_ratio`` smallest weights
    (never key 0, the query's own token, as the diagonal of a square map).

    Shape: attn (B, h, 1, N_k) -> (B, N_k).
    """
    if head_fusion == "mean":
        a = attn.mean(dim=1)[:, 0]
    else:
        a = (attn.amax(dim=1) if head_fusion == "max" else attn.amin(dim=1))[:, 0]
    n = int(a.shape[-1] * discard_ratio)
    if n == 0:
        return a
    ranked = a.clone()
    ranked[:, 0] = float("inf")  # never among the smallest
    return a.scatter(-1, ranked.topk(n, dim=-1, largest=False).indices, 0.0)


def compose_class_attention(
    relevance: Tensor,
    attn: Tensor,
    keys: Tensor,
    *,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    add_residual: bool = True,
) -> Tensor:
    """One class-attention layer (a single query, the class token, over ``[itself, patches]``)
    composed into the class token's relevance.

    ``relevance`` is the class token's row over the input tokens, ``keys`` the rows of the
    patches it attends to (their own rollout). With the heads fused (``a``, as in
    :func:`attention_rollout`) and the residual: ``c <- 0.5 (a_cls c + a_patches K) + 0.5 c``,
    then renormalised to sum to 1 (without the residual: ``a_cls c + a_patches K``).

    Shape: relevance (B, T), attn (B, h, 1, 1 + N), keys (B, N, T) -> (B, T).
    """
    if attn.ndim != 4 or attn.shape[-2] != 1 or attn.shape[-1] != 1 + keys.shape[-2]:
        raise ValueError(
            f"expected a class-attention map of shape (B, h, 1, {1 + keys.shape[-2]}) for {keys.shape[-2]} "
            f"patches, got {tuple(attn.shape)}"
        )
    check_distribution(attn, "the class-attention map")
    a = _fuse_class_row(attn, head_fusion, discard_ratio)  # (B, 1 + N)
    mixed = a[:, :1] * relevance + (a[:, None, 1:] @ keys)[:, 0]
    c = 0.5 * mixed + 0.5 * relevance if add_residual else mixed
    return c / c.sum(dim=-1, keepdim=True)


class _Options(NamedTuple):
    head_fusion: HeadFusion
    discard_ratio: float
    add_residual: bool


def _rollout_run(run: Sequence[Tensor], o: _Options) -> Tensor:
    return attention_rollout(run, head_fusion=o.head_fusion, discard_ratio=o.discard_ratio, add_residual=o.add_residual)


def _compose(relevance: Tensor, attn: Tensor, keys: Tensor, o: _Options) -> Tensor:
    return compose_class_attention(
        relevance, attn, keys, head_fusion=o.head_fusion, discard_ratio=o.discard_ratio, add_residual=o.add_residual
    )


def _last_stage(maps: Sequence[Tensor]) -> list[Tensor]:
    """The maps of the last shape, back to the first that differs."""
    run = [maps[-1]]
    for attn in reversed(maps[:-1]):
        if attn.shape != run[0].shape:
            break
        run.insert(0, attn)
    return run


def spread_squeezed_keys(attn: Tensor, num_prefix_tokens: int | None = None) -> Tensor:
    """A map whose keys are a strided squeeze of the query grid (CvT's ``stride_kv``), made
    square: each key's weight is spread evenly over the query-grid tokens of its stride
    cell (token ``(y, x)`` belongs to key ``(y // s, x // s)``, ``s = ceil(H / H')``);
    prefix keys (cls) stay themselves. Rows keep their sums. An approximation: the real
    squeeze is a 3x3 depthwise conv whose windows overlap, and its weights are ignored.

    Shape: attn (B, h, P + H W, P + H' W') -> (B, h, P + H W, P + H W).
    """
    (H, W), prefix = _grid_of(attn.shape[-2], num_prefix_tokens)
    (Hk, Wk), prefix_k = _grid_of(attn.shape[-1], prefix)
    if prefix_k != prefix or Hk > H or Wk > W:
        raise ValueError(f"cannot read {tuple(attn.shape)} as keys squeezed from the query grid")
    sy, sx = math.ceil(H / Hk), math.ceil(W / Wk)
    ys = (torch.arange(H, device=attn.device) // sy).clamp(max=Hk - 1)
    xs = (torch.arange(W, device=attn.device) // sx).clamp(max=Wk - 1)
    owner = (ys[:, None] * Wk + xs[None, :]).flatten()  # (H W,): the key each token was pooled into
    spread = torch.zeros(Hk * Wk, H * W, dtype=attn.dtype, device=attn.device)
    spread[owner, torch.arange(H * W, device=attn.device)] = 1.0
    spread = spread / spread.sum(dim=-1, keepdim=True)  # each key's weight, evenly over its cell
    full = torch.zeros(prefix + Hk * Wk, prefix + H * W, dtype=attn.dtype, device=attn.device)
    full[:prefix, :prefix] = torch.eye(prefix, dtype=attn.dtype, device=attn.device)
    full[prefix:, prefix:] = spread
    return attn @ full


class Relevance(NamedTuple):
    """A rollout row over the input tokens, what it is the row of, and where its patch grid sits.

    ``row`` (B, T) is a distribution over every input token (rows sum to 1): prefix tokens
    and patches, for CrossViT both branches' ``[cls, patches]``; the patches of the grid
    are ``row[:, start : start + h * w]``, row-major. ``query`` says whose row it is:
    ``"class token"`` (the cls token's row), or ``"mean over the tokens"`` for a model
    without a class token (LeViT), whose head reads the mean of its tokens.
    """

    row: Tensor
    start: int
    grid_size: tuple[int, int]
    query: str = "class token"

    def grid(self) -> Tensor:
        """Shape: (B, h, w)."""
        h, w = self.grid_size
        return self.row[:, self.start : self.start + h * w].reshape(-1, h, w)


def _rule_of(model: nn.Module) -> RolloutRule:
    from vitlab.family import FAMILIES  # imported here: vitlab.family imports the models

    family = type(model).__module__.rsplit(".", 1)[-1]
    return FAMILIES[family].rollout if family in FAMILIES else "blocks"


def rollout_maps(records: Sequence[AttentionMap]) -> list[AttentionMap]:
    """The records rollout reads: each map that is a distribution as it is, each map that
    mixes its heads (``is_distribution`` False: CaiT's talking heads, DeepViT's
    re-attention) replaced by its softmax maps before the mixing (``unmixed``); the
    records are otherwise unchanged. A map that is neither raises ``ValueError``.

    Shape: (B, h, N_q, N_k) per record -> the same.
    """
    maps = []
    for record in records:
        if record.is_distribution:
            maps.append(record)
        elif record.unmixed is not None:
            maps.append(AttentionMap(record.unmixed, record.path, record.kind, True))
        else:
            raise ValueError(
                f"the map of {record.path} ({record.kind}) is not a distribution and has no softmax maps "
                f"before the mixing (unmixed); rollout cannot read it"
            )
    return maps


@torch.no_grad()
def rollout_relevance(
    model: nn.Module,
    images: Tensor,
    *,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    add_residual: bool = True,
    num_prefix_tokens: int | None = None,
    branch: int = 0,
) -> Relevance:
    """The rollout row of the token the model classifies, over the input tokens, by the
    family's rule (``FAMILY.rollout``, :class:`vitlab.contract.FamilyInfo`); see
    :func:`model_rollout`.

    The maps come from one forward pass (:func:`vitlab.attention_maps`):
    the model's modes, parameters and BatchNorm statistics are left as they were. Layers
    that mix their heads contribute their softmax maps before the mixing
    (:func:`rollout_maps`).

    Rules:

    * ``"blocks"`` (ViT, DeiT, DeepViT, T2T-ViT, PiT, LeViT): :func:`attention_rollout`
      of the last stage's maps (the last maps of one shape, which must be square); the row
      of token 0, the class token. Prefix tokens (cls, dist) are found from the token
      count unless ``num_prefix_tokens`` is given. With none (LeViT) there is no class
      token: the head reads the mean of the tokens, so the row is the mean of all rows
      (``query="mean over the tokens"``).
    * ``"squeezed_keys"`` (CvT): the same, after :func:`spread_squeezed_keys` makes each
      map of the last stage square (an approximation: the keys are a conv squeeze of the
      tokens, 2x2 cells of the grid at stride 2).
    * ``"class_attention"`` (CaiT): the self-attention maps over the patches rolled out
      (``R``, (B, N, N)); the class token joins afterwards, so its row over
      ``[cls, patches]`` starts at ``[1, 0, ...]`` and each class-attention layer (kind
      ``"class"``: one query over ``[cls, patches]``) is composed in by
      :func:`compose_class_attention` with the patches' rows ``[0 | R]``.
    * ``"cross_attention"`` (CrossViT): the rows run over both branches' input tokens,
      ``[cls_S, S patches, cls_L, L patches]``. Each branch's self-attention maps are
      rolled out within the branch (square, residual as in :func:`attention_rollout`);
      each cross-attention map (kind ``"cross"``: the branch's projected cls over ``[it,
      the other branch's patches]``) is composed into the branch's cls row by
      :func:`compose_class_attention` with the other branch's patch rows, both branches
      from the tokens before the exchange. ``branch`` (0: small patches, 1: large) picks
      the class token and the patch grid returned.

    Shape: images (B, C, H, W) -> row (B, T).
    """
    if not isinstance(model, VisionModel):
        raise TypeError(
            f"expected a vitlab model (forward_features, forward_head, get_attention_maps), got {type(model).__name__}"
        )
    if head_fusion not in ("mean", "max", "min"):
        raise ValueError(f"head_fusion must be 'mean', 'max' or 'min', got {head_fusion!r}")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    records = rollout_maps(attention_maps(model, images))
    rule = _rule_of(model)
    options = _Options(head_fusion, discard_ratio, add_residual)
    if rule == "class_attention":
        return _class_attention_relevance(records, options)
    if rule == "cross_attention":
        return _cross_attention_relevance(records, options, branch)
    run = _last_stage([record.attn for record in records])
    if rule == "squeezed_keys":
        run = [spread_squeezed_keys(attn, num_prefix_tokens) for attn in run]
    last = run[-1]
    if last.shape[-1] != last.shape[-2]:
        raise ValueError(
            f"{type(model).__name__}'s last attention map is not square, {tuple(last.shape)}: the rollout "
            f"needs the last stage's maps to be (B, h, N, N)"
        )
    rollout = _rollout_run(run, options)
    grid, prefix = _grid_of(rollout.shape[-1], num_prefix_tokens)
    if prefix == 0:  # no class token: the head reads the mean of the tokens
        return Relevance(rollout.mean(dim=1), 0, grid, "mean over the tokens")
    return Relevance(rollout[:, 0], prefix, grid)


def _class_attention_relevance(records: Sequence[AttentionMap], options: _Options) -> Relevance:
    self_maps = [r.attn for r in records if r.kind != "class"]
    class_maps = [r.attn for r in records if r.kind == "class"]
    if not self_maps or not class_maps or any(r.kind == "class" for r in records[: len(self_maps)]):
        raise ValueError("expected the self-attention maps, then the class-attention maps (B, h, 1, 1 + N)")
    patches = _rollout_run(self_maps, options)  # (B, N, N) over the input patches
    B, N, _ = patches.shape
    keys = torch.cat([patches.new_zeros(B, N, 1), patches], dim=-1)  # the cls input is no patch's source
    c = patches.new_zeros(B, 1 + N)
    c[:, 0] = 1.0  # the class token starts as itself
    for attn in class_maps:
        c = _compose(c, attn, keys, options)
    return Relevance(c, 1, _grid_of(N, 0)[0])


def _cross_attention_relevance(records: Sequence[AttentionMap], options: _Options, branch: int) -> Relevance:
    if branch not in (0, 1):
        raise ValueError(f"branch must be 0 (small patches) or 1 (large patches), got {branch}")
    maps = [r.attn for r in records]
    cross = [i for i, r in enumerate(records) if r.kind == "cross"]
    if not cross or len(cross) % 2 or any(b - a != 1 for a, b in zip(cross[::2], cross[1::2], strict=True)):
        raise ValueError("expected per encoder the branches' self-attention maps, then 2 cross-attention maps")
    n_l, n_s = maps[cross[0]].shape[-1], maps[cross[1]].shape[-1]  # S's cls reads L's tokens, then L's reads S's
    sizes = (n_s, n_l)
    first = maps[0]
    eye = torch.eye(n_s + n_l, dtype=first.dtype, device=first.device).expand(first.shape[0], -1, -1)
    rows = [eye[:, :n_s], eye[:, n_s:]]  # per branch (B, 1 + N_b, T): its tokens over all input tokens
    start = 0
    for end in cross[1::2]:
        encoder = maps[start : end - 1]
        self_s = [m for m in encoder if m.shape[-1] == n_s]
        self_l = encoder[len(self_s) :]
        if any(m.shape[-1] != n_l or m.shape[-2] != n_l for m in self_l) or n_s == n_l:
            raise ValueError(f"cannot split the encoder's maps {[tuple(m.shape) for m in encoder]} by branch")
        for b, run in enumerate((self_s, self_l)):
            if run:
                rows[b] = _rollout_run(run, options) @ rows[b]
        new_cls = [_compose(rows[b][:, 0], maps[end - 1 + b], rows[1 - b][:, 1:], options) for b in (0, 1)]
        rows = [torch.cat([new_cls[b][:, None], rows[b][:, 1:]], dim=1) for b in (0, 1)]
        start = end + 1
    start_of_grid = 1 if branch == 0 else n_s + 1
    return Relevance(rows[branch][:, 0], start_of_grid, _grid_of(sizes[branch] - 1, 0)[0])


def model_rollout(
    model: nn.Module,
    images: Tensor,
    *,
    head_fusion: HeadFusion = "mean",
    discard_ratio: float = 0.0,
    add_residual: bool = True,
    num_prefix_tokens: int | None = None,
    branch: int = 0,
) -> Tensor:
    """Rollout of the token any :class:`~vitlab.contract.VisionModel` classifies, on its patch grid.

    The maps come from one forward pass of the model (its modes, parameters and BatchNorm
    statistics left as they were), read by the family's rule (:func:`rollout_relevance`
    lists them): for ViT, DeiT, DeepViT and T2T-ViT every block of the backbone, for PiT
    and LeViT the last stage, for CvT the last stage with its squeezed keys spread back
    over the tokens (an approximation), for CaiT the self-attention rollout composed
    through the class-attention layers, for CrossViT both branches' rollouts composed
    through the cross-attention (``branch`` picks the class token and grid: 0, small
    patches, or 1). Layers that mix their heads (CaiT's talking heads, DeepViT's
    re-attention) contribute their softmax maps before the mixing. The row is the class
    token's; the prefix tokens (cls, dist) are found from the token count unless
    ``num_prefix_tokens`` is given. With no prefix token (LeViT) there is no class token,
    and the row is the mean of all tokens' rows, as the head reads the mean of the tokens.
    The values are the patches' part of the row (the prefix tokens hold the rest).

    Shape: images (B, C, H, W) -> (B, h, w), the token grid of those maps.
    """
    return rollout_relevance(
        model,
        images,
        head_fusion=head_fusion,
        discard_ratio=discard_ratio,
        add_residual=add_residual,
        num_prefix_tokens=num_prefix_tokens,
        branch=branch,
    ).grid()
