"""Checks for the CvT chapter: the squeezed key/value projection and the convolutional attention."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from vitlab.checks._core import (
    SCRAMBLING_RESHAPE,
    SWAPPED_GRID,
    Case,
    CheckResult,
    KnownWrong,
    generator,
    run_check,
    shape,
)

if TYPE_CHECKING:
    from vitlab.models.cvt import ConvAttention


def _squeeze(
    x: Tensor, grid_size: tuple[int, int], weight: Tensor, stride: int, *, naive_map: bool = False,
    padding: int | None = None, naive_tokens: bool = False,
) -> Tensor:  # fmt: skip
    """Depthwise strided conv on the token map; the keywords turn on known wrong answers."""
    B, _, C = x.shape
    H, W = grid_size
    fmap = x.reshape(B, C, H, W) if naive_map else rearrange(x, "B (H W) C -> B C H W", H=H, W=W)
    k = weight.shape[-1]
    out = F.conv2d(fmap, weight, stride=stride, padding=k // 2 if padding is None else padding, groups=C)
    return out.reshape(B, -1, C) if naive_tokens else rearrange(out, "B C H W -> B (H W) C")


def squeezed_kv_projection(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, grid_size, weight, stride) -> tokens``: CvT's squeezed K/V projection.

    The tokens go back on their ``H x W`` map (row-major, ``"B (H W) C -> B C H W"``), a
    depthwise convolution (``groups=C``, one ``k x k`` filter per channel, padding
    ``k // 2``, no bias) with ``stride`` shrinks the map, and it is flattened back to
    tokens. With stride 2, keys and values have about 4x fewer tokens than queries. This
    is :class:`vitlab.models.cvt.ConvProjection` without its BatchNorm.

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
        KnownWrong(
            lambda *args: _squeeze(*args, naive_map=True),
            "the tokens were reshaped straight to (B, C, H, W), which scrambles them; put them on the map with "
            "rearrange(x, 'B (H W) C -> B C H W', H=H, W=W) (a transpose, then a reshape)",
        ),
        KnownWrong(
            lambda *args: _squeeze(*args, naive_tokens=True),
            "the map was reshaped straight back to (B, N', C); flatten it with rearrange('B C H W -> B (H W) C')",
        ),
        KnownWrong(
            lambda *args: _squeeze(*args, padding=0),
            "the convolution is not padded; CvT pads by k // 2, so the stride alone sets the size",
        ),
    ]
    return run_check("squeezed_kv_projection", fn, cases, _squeeze, known_wrong=wrongs)


def _attention_layer(seed: int, dim: int, heads: int, with_cls: bool) -> ConvAttention:
    """A small :class:`vitlab.models.cvt.ConvAttention` with seeded weights and BatchNorm statistics."""
    from vitlab.models.cvt import (
        ConvAttention,
    )  # here: the checks package stays light to import

    layer = ConvAttention(dim, num_heads=heads, with_cls_token=with_cls).eval()
    layer.fused_attn = False  # the explicit path: the reference is the plain computation
    g = generator(200 + seed)
    with torch.no_grad():
        for name, tensor in [*layer.named_parameters(), *layer.named_buffers()]:
            if name.endswith("running_var"):
                tensor.copy_(0.5 + torch.rand(tensor.shape, generator=g))
            elif tensor.is_floating_point():
                tensor.copy_(torch.randn(tensor.shape, generator=g) * (0.5 if tensor.ndim > 1 else 0.2))
    return layer


def _conv_attention(x: Tensor, grid_size: tuple[int, int], attn: ConvAttention, *, wrong: str | None = None) -> Tensor:
    """The layer's own forward pass, or a known wrong answer written out (``wrong``)."""
    if wrong is None:
        return attn(x, grid_size)
    H, W = grid_size
    B, _, C = x.shape
    cls = None
    if attn.with_cls_token:
        cls, x = x[:, :1], x[:, 1:]
    if wrong == "naive_map":
        fmap = x.reshape(B, C, H, W)
    elif wrong == "swapped_hw":
        fmap = rearrange(x, "B (W H) C -> B C H W", H=H, W=W)
    else:
        fmap = rearrange(x, "B (H W) C -> B C H W", H=H, W=W)
    kv_proj = (attn.conv_proj_q, attn.conv_proj_q) if wrong == "kv_unsqueezed" else (attn.conv_proj_k, attn.conv_proj_v)
    q, k, v = (
        attn.conv_proj_q(fmap),
        kv_proj[0](fmap),
        kv_proj[1](fmap),
    )  # (B, N, C), (B, N', C) x 2
    if wrong == "swapped_hw":  # flattened back column by column too
        q, k, v = (rearrange(t, "B (H W) C -> B (W H) C", H=H) if t.shape[1] == H * W else t for t in (q, k, v))
    projections = (attn.proj_q, attn.proj_k, attn.proj_v)
    if cls is not None and wrong == "cls_conv":  # the cls token through the convolutions, as a 1 x 1 map
        cls_map = rearrange(cls, "B 1 C -> B C 1 1")
        q, k, v = (torch.cat([p(cls_map), t], dim=1) for p, t in zip((attn.conv_proj_q, *kv_proj), (q, k, v)))
        cls = None
    if cls is not None and wrong == "cls_query_only":
        q = torch.cat([cls, q], dim=1)
        cls = None
    if cls is not None and wrong != "cls_dropped" and wrong != "cls_after_linear":
        q, k, v = (torch.cat([cls, t], dim=1) for t in (q, k, v))
    q, k, v = (rearrange(p(t), "B N (h d) -> B h N d", h=attn.num_heads) for p, t in zip(projections, (q, k, v)))
    if cls is not None and wrong == "cls_after_linear":
        cls_heads = rearrange(cls, "B 1 (h d) -> B h 1 d", h=attn.num_heads)
        q, k, v = (torch.cat([cls_heads, t], dim=2) for t in (q, k, v))
    scale = attn.head_dim**-0.5 if wrong == "head_dim_scale" else attn.scale
    logits = q @ k.transpose(-2, -1) * scale  # (B, h, N_q, N_k)
    out = logits.softmax(dim=-2 if wrong == "softmax_axis" else -1) @ v
    return attn.proj(rearrange(out, "B h N d -> B N (h d)"))


def cvt_conv_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, grid_size, attn) -> out``: CvT's convolutional attention, cls token included.

    ``attn`` is a :class:`vitlab.models.cvt.ConvAttention` (eval mode); use its parts, not
    ``attn(x, grid_size)`` itself (the check cannot tell). If ``attn.with_cls_token``, the
    first token of ``x`` is the cls token: split it off; fold the ``H * W`` map tokens,
    numbered row by row, into ``(B, C, H, W)``; make q, k and v with
    ``attn.conv_proj_q``, ``conv_proj_k``, ``conv_proj_v`` (depthwise conv + BatchNorm,
    map in, tokens out; k and v with stride 2); put the cls token back in front of each,
    unconvolved; then the linear layers ``attn.proj_q``, ``proj_k``, ``proj_v``, split
    into ``attn.num_heads`` heads, ``softmax(q k^T * attn.scale) v`` (CvT's scale is
    ``dim**-0.5``, the embedding width: pitfall 14), merge the heads and apply
    ``attn.proj``. Without a cls token, the same with nothing to split. The check tries a
    non-square grid, with and without a cls token.

    Shape: x (B, T + H*W, C), grid_size (H, W), attn -> (B, T + H*W, C), T = 1 with a cls
    token, else 0.
    """
    cases = []
    for seed, (B, C, heads, H, W, with_cls) in enumerate(
        (
            (1, 8, 2, 4, 4, True),
            (2, 8, 2, 3, 5, False),
            (2, 12, 3, 5, 4, True),
            (1, 6, 2, 6, 6, True),
        )
    ):
        attn = _attention_layer(seed, C, heads, with_cls)
        x = torch.randn(B, int(with_cls) + H * W, C, generator=generator(300 + seed))
        label = f"x {shape(x)}, grid_size={(H, W)}, {heads} heads, {'with' if with_cls else 'no'} cls token"
        cases.append(Case(label, (x, (H, W), attn)))

    def wrong(kind: str) -> Callable[..., Tensor]:
        return lambda x, g, a: _conv_attention(x, g, a, wrong=kind)

    wrongs = [
        KnownWrong(
            wrong("naive_map"),
            SCRAMBLING_RESHAPE,
        ),
        KnownWrong(
            wrong("swapped_hw"),
            SWAPPED_GRID,
        ),
        KnownWrong(
            wrong("cls_conv"),
            "the cls token went through the convolutions (as a 1 x 1 map); it has no place on the map: split it "
            "off before the convolutional projections and put it back, unconvolved, before the linear ones",
        ),
        KnownWrong(
            wrong("cls_dropped"),
            "the cls token was split off and never re-attached: put it back in front of q, k and v "
            "(after the convolutions, before proj_q, proj_k, proj_v)",
        ),
        KnownWrong(
            wrong("cls_query_only"),
            "the cls token was re-attached to the queries only; it is a key and a value too (stage 3 has "
            "1 + 49 keys): put it in front of q, k and v",
        ),
        KnownWrong(
            wrong("cls_after_linear"),
            "the cls token was re-attached after the linear projections, so it skipped proj_q, proj_k, proj_v; "
            "re-attach it before them: it shares W_q, W_k, W_v with the other tokens",
        ),
        KnownWrong(
            wrong("kv_unsqueezed"),
            "keys and values were made with the query's projection (stride 1); use attn.conv_proj_k and "
            "attn.conv_proj_v, whose stride 2 squeezes them",
        ),
        KnownWrong(
            wrong("head_dim_scale"),
            "the logits are scaled by head_dim**-0.5, the textbook scale; this layer scales by attn.scale, "
            "CvT's dim**-0.5 over the embedding width, which the released weights were trained with (pitfall 14)",
        ),
        KnownWrong(
            wrong("softmax_axis"),
            "the softmax runs over the queries (dim=-2); take it over the keys",
        ),
    ]
    return run_check("cvt_conv_attention", fn, cases, _conv_attention, known_wrong=wrongs)
