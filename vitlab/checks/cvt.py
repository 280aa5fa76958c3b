"""Checks for the CvT chapter: the squeezed key/value projection and the convolutional attention."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from vitlab.checks._core import Case, CheckResult, KnownWrong, generator, run_check, shape
from vitlab.checks._slips import (
    GRID_W_H,
    HARD_CODED,
    MERGED_BY_RESHAPE,
    NAIVE_SOFTMAX,
    PADDING,
    SCALED_AFTER,
    SCRAMBLING_RESHAPE,
    SPLIT_D_H,
    SWAPPED_GRID,
    naive_softmax_of,
    pad,
)

if TYPE_CHECKING:
    from vitlab.models.cvt import ConvAttention


def _squeeze(
    x: Tensor, grid_size: tuple[int, int], weight: Tensor, stride: int, *, naive_map: bool = False,
    padding: int | None = None, naive_tokens: bool = False, swapped_hw: bool = False, pad_mode: str = "zeros",
    grid_w_h: bool = False,
) -> Tensor:  # fmt: skip
    """Depthwise strided conv on the token map; the keywords turn on known wrong answers
    (``pad_mode``: a key of ``PADDING``; ``grid_w_h``: grid_size read as (W, H))."""
    B, _, C = x.shape
    H, W = grid_size[::-1] if grid_w_h else grid_size
    grid = "B (W H) C -> B C H W" if swapped_hw else "B (H W) C -> B C H W"
    fmap = x.reshape(B, C, H, W) if naive_map else rearrange(x, grid, H=H, W=W)
    k = weight.shape[-1]
    fmap, padding = pad(fmap, k, stride, k // 2 if padding is None else padding, pad_mode)
    out = F.conv2d(fmap, weight, stride=stride, padding=padding, groups=C)
    if naive_tokens:
        return out.reshape(B, -1, C)
    return rearrange(out, "B C H W -> B (W H) C" if swapped_hw else "B C H W -> B (H W) C")


def squeezed_kv_projection(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, grid_size, weight, stride) -> tokens``: CvT's squeezed K/V projection, no BatchNorm.

    Tokens on their row-major map, a depthwise conv (``groups=C``, padding ``k // 2``, no bias)
    with ``stride``, flattened back to tokens.

    Shape: x (B, H*W, C), grid_size (H, W), weight (C, 1, k, k), stride int
    -> (B, H'*W', C), H' = ceil(H / stride), W' = ceil(W / stride) (k odd).
    """
    cases = []
    shapes = ((1, 4, 4, 4, 3, 2), (2, 5, 7, 6, 3, 2), (2, 6, 4, 3, 3, 1), (1, 7, 5, 2, 5, 2))
    for seed, (B, H, W, C, k, s) in enumerate(shapes):
        g = generator(seed)
        x = torch.randn(B, H * W, C, generator=g)
        weight = torch.randn(C, 1, k, k, generator=g) / k
        label = f"x {shape(x)}, grid_size={(H, W)}, weight {shape(weight)}, stride={s}"
        cases.append(Case(label, (x, (H, W), weight, s)))
    wrongs = [
        KnownWrong(lambda *args: _squeeze(*args, naive_map=True), SCRAMBLING_RESHAPE),
        KnownWrong(lambda *args: _squeeze(*args, naive_tokens=True),
                   "the map was reshaped straight back to (B, N', C); "
                   "flatten it with rearrange('B C H W -> B (H W) C')"),
        KnownWrong(lambda *args: _squeeze(*args, padding=0),
                   "the convolution is not padded; CvT pads by k // 2, so the stride alone sets the size"),
        KnownWrong(lambda *args: _squeeze(*args, swapped_hw=True), SWAPPED_GRID),
        KnownWrong(lambda *args: _squeeze(*args, grid_w_h=True), GRID_W_H),
        KnownWrong(lambda *args: _squeeze(*args, padding=1), f"{HARD_CODED}: k // 2, k = weight.shape[-1]"),
        *(KnownWrong(partial(_squeeze, pad_mode=mode), message) for mode, message in PADDING.items()),
    ]  # fmt: skip
    return run_check("squeezed_kv_projection", fn, cases, _squeeze, known_wrong=wrongs)


def _attention_layer(seed: int, dim: int, heads: int, with_cls: bool, *, query_gain: float = 1.0) -> ConvAttention:
    """A small :class:`vitlab.models.cvt.ConvAttention`, seeded weights; ``proj_q`` times ``query_gain``."""
    from vitlab.models.cvt import ConvAttention  # here: the checks package stays light to import

    layer = ConvAttention(dim, num_heads=heads, with_cls_token=with_cls).eval()
    layer.fused_attn = False  # the explicit path: the reference is the plain computation
    g = generator(200 + seed)
    with torch.no_grad():
        for name, tensor in [*layer.named_parameters(), *layer.named_buffers()]:
            if name.endswith("running_var"):
                tensor.copy_(0.5 + torch.rand(tensor.shape, generator=g))
            elif tensor.is_floating_point():
                tensor.copy_(torch.randn(tensor.shape, generator=g) * (0.5 if tensor.ndim > 1 else 0.2))
        layer.proj_q.weight *= query_gain
    return layer


def _avg_attention(x: Tensor, grid_size: tuple[int, int], attn: ConvAttention, *, wrong: str | None = None) -> Tensor:
    """Attention with the official code's parameter-free ``"avg"`` projection, or a known wrong answer."""
    if wrong == "conv":  # the layer's own convolutional projections
        return attn(x, grid_size)
    H, W = grid_size
    cls = None
    if attn.with_cls_token:
        cls, x = x[:, :1], x[:, 1:]
    fmap = rearrange(x, "B (H W) C -> B C H W", H=H, W=W)
    k = 2 if wrong == "pool_2" else 3  # the window
    pooled = F.avg_pool2d(fmap, k, stride=2, padding=k // 2 if k == 3 else 0, ceil_mode=wrong != "floor",
                          count_include_pad=wrong != "exclude_pad")  # fmt: skip
    kv = rearrange(pooled, "B C H W -> B (H W) C")  # (B, N', C)
    q = kv if wrong == "q_pooled" else x  # the queries: no convolution, no pooling
    k = v = kv
    if cls is not None and wrong != "cls_dropped":
        q = torch.cat([cls, q], dim=1)
        if wrong != "cls_query_only":
            k = v = torch.cat([cls, kv], dim=1)
    split = "d h" if wrong == "split_d_h" else "h d"
    q, k, v = (
        rearrange(p(t), f"B N ({split}) -> B h N d", h=attn.num_heads)
        for p, t in zip((attn.proj_q, attn.proj_k, attn.proj_v), (q, k, v))
    )
    scale = {"head_dim_scale": attn.head_dim**-0.5, "unscaled": 1.0, "scaled_after": 1.0}.get(wrong or "", attn.scale)
    logits = q @ k.transpose(-2, -1) * scale  # (B, h, N_q, N_k)
    weights = naive_softmax_of(logits) if wrong == "naive_softmax" else logits.softmax(dim=-1)
    out = weights * (attn.scale if wrong == "scaled_after" else 1.0) @ v  # (B, h, N_q, d)
    if wrong == "merged_by_reshape":
        out = out.reshape(out.shape[0], out.shape[2], -1)
    else:
        out = rearrange(out, f"B h N d -> B N ({split})")
    return out if wrong == "no_proj" else attn.proj(out)


def cvt_avg_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, grid_size, attn) -> out``: CvT's attention with the official ``"avg"`` projection.

    Queries unpooled; keys and values ``nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True)`` of the
    map; the cls token (if ``attn.with_cls_token``) put back in front before ``attn.proj_q/k/v``;
    ``softmax(q k^T * attn.scale) v`` over ``attn.num_heads`` heads ``(h d)``, then ``attn.proj``.

    Shape: x (B, T + H*W, C), grid_size (H, W), attn -> (B, T + H*W, C), T = 1 with a cls
    token, else 0.
    """
    cases = []
    sizes = ((1, 8, 2, 4, 4, True), (2, 8, 2, 3, 5, False), (2, 12, 3, 6, 4, True), (1, 6, 2, 5, 6, True),
             (2, 12, 3, 4, 5, True))  # (B, C, heads, H, W, with_cls)  # fmt: skip
    for seed, (B, C, heads, H, W, with_cls) in enumerate(sizes):
        gain = 200.0 if seed == 4 else 1.0
        attn = _attention_layer(seed, C, heads, with_cls, query_gain=gain)
        x = torch.randn(B, int(with_cls) + H * W, C, generator=generator(400 + seed))
        label = f"x {shape(x)}, grid_size={(H, W)}, {heads} heads, {'with' if with_cls else 'no'} cls token"
        if gain != 1.0:
            label += f", large logits (proj_q x {gain:g})"
        cases.append(Case(label, (x, (H, W), attn)))

    kinds = {
        "floor": "the pooled map is rounded down (AvgPool2d without ceil_mode=True): the official projection "
        "rounds up, so a 4 x 4 map gives 3 x 3 keys and a 14 x 14 map 8 x 8",
        "exclude_pad": "the mean leaves the zero padding out (count_include_pad=False); the official AvgPool2d "
        "counts it, the default",
        "q_pooled": "the queries were pooled too: only keys and values are squeezed; the queries keep one per "
        "token (no convolution, no pooling, just proj_q)",
        "conv": "this is the chapter's convolutional projection (attn.conv_proj_q, _k, _v: depthwise conv + "
        "BatchNorm); the 'avg' method replaces it: no convolution for q, average pooling for k and v",
        "cls_dropped": "the cls token was split off and never re-attached: put it back in front of q, k and v, "
        "before the linear layers",
        "cls_query_only": "the cls token was re-attached to the queries only; it is a key and a value too: put it "
        "in front of the pooled keys and values as well",
        "head_dim_scale": "the logits are scaled by head_dim**-0.5; CvT scales by the embedding width, attn.scale "
        "= dim**-0.5",
        "naive_softmax": NAIVE_SOFTMAX,
        "pool_2": "the keys and values are pooled over 2 x 2 windows; the official projection pools 3 x 3 windows "
        "with stride 2 and padding 1: AvgPool2d(3, stride=2, padding=1, ceil_mode=True)",
        "unscaled": "the logits are not scaled; multiply q k^T by attn.scale before the softmax",
        "scaled_after": SCALED_AFTER,
        "merged_by_reshape": MERGED_BY_RESHAPE,
        "split_d_h": SPLIT_D_H,
        "no_proj": "the output projection is missing: the merged heads go through attn.proj",
    }
    wrongs = [
        KnownWrong(partial(_avg_attention, wrong=kind), message, 19 if kind == "head_dim_scale" else None)
        for kind, message in kinds.items()
    ]
    return run_check("cvt_avg_attention", fn, cases, _avg_attention, known_wrong=wrongs)
