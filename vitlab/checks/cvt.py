"""Checks for the CvT chapter: the squeezed key/value projection and the convolutional attention."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from vitlab.checks._core import (
    NAIVE_SOFTMAX,
    PADDED_BY,
    SCRAMBLING_RESHAPE,
    SWAPPED_GRID,
    Case,
    CheckResult,
    KnownWrong,
    generator,
    naive_softmax_of,
    run_check,
    same_padding,
    shape,
)

if TYPE_CHECKING:
    from torch import nn

    from vitlab.models.cvt import ConvAttention, ConvProjection


def _squeeze(
    x: Tensor, grid_size: tuple[int, int], weight: Tensor, stride: int, *, naive_map: bool = False,
    padding: int | None = None, naive_tokens: bool = False, swapped_hw: bool = False, pad_mode: str = "zeros",
) -> Tensor:  # fmt: skip
    """Depthwise strided conv on the token map; the keywords turn on known wrong answers
    (``pad_mode``: ``"reflect"``, ``"replicate"`` or ``"same"``, TensorFlow's lopsided padding)."""
    B, _, C = x.shape
    H, W = grid_size
    grid = "B (W H) C -> B C H W" if swapped_hw else "B (H W) C -> B C H W"
    fmap = x.reshape(B, C, H, W) if naive_map else rearrange(x, grid, H=H, W=W)
    k = weight.shape[-1]
    if pad_mode == "same":
        fmap, padding = same_padding(fmap, k, stride), 0
    elif pad_mode != "zeros":
        fmap, padding = F.pad(fmap, [k // 2] * 4, mode=pad_mode), 0
    out = F.conv2d(fmap, weight, stride=stride, padding=k // 2 if padding is None else padding, groups=C)
    if naive_tokens:
        return out.reshape(B, -1, C)
    return rearrange(out, "B C H W -> B (W H) C" if swapped_hw else "B C H W -> B (H W) C")


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
        KnownWrong(lambda *args: _squeeze(*args, swapped_hw=True), SWAPPED_GRID),
        *(
            KnownWrong(lambda *args, mode=mode: _squeeze(*args, pad_mode=mode), message)
            for mode, message in PADDED_BY.items()
        ),
    ]
    return run_check("squeezed_kv_projection", fn, cases, _squeeze, known_wrong=wrongs)


def _attention_layer(seed: int, dim: int, heads: int, with_cls: bool, *, small_var: bool = False,
                     query_gain: float = 1.0) -> ConvAttention:  # fmt: skip
    """A small :class:`vitlab.models.cvt.ConvAttention` with seeded weights and BatchNorm statistics.

    ``small_var``: running variances about 1e-3 (and convolutions 30 times weaker, so the
    BatchNorm's outputs keep their size), where the BatchNorm's eps matters. ``query_gain``
    multiplies ``proj_q``'s weight: the logits grow with it.
    """
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
        if small_var:
            for proj in (layer.conv_proj_q, layer.conv_proj_k, layer.conv_proj_v):
                mean, var = proj.bn.running_mean, proj.bn.running_var
                assert mean is not None and var is not None  # a BatchNorm2d that tracks running statistics
                proj.conv.weight /= 30
                mean /= 30
                var *= 1e-3
        layer.proj_q.weight *= query_gain
    return layer


def _conv_projection(fmap: Tensor, proj: ConvProjection, bn: str) -> Tensor:
    """``proj(fmap)`` with its BatchNorm as the known wrong answers write it (``bn``)."""
    out = proj.conv(fmap)
    norm: nn.BatchNorm2d = proj.bn
    if bn == "batch_statistics":
        out = F.batch_norm(out, None, None, norm.weight, norm.bias, training=True, eps=norm.eps)
    elif bn == "no_affine":
        out = F.batch_norm(out, norm.running_mean, norm.running_var, training=False, eps=norm.eps)
    elif bn == "no_eps":
        assert norm.running_mean is not None and norm.running_var is not None
        mean, var, weight, bias = (
            rearrange(t, "C -> 1 C 1 1") for t in (norm.running_mean, norm.running_var, norm.weight, norm.bias)
        )
        out = (out - mean) / var.sqrt() * weight + bias
    elif bn == "eval":
        out = norm(out)
    return rearrange(out, "B C H W -> B (H W) C")  # bn == "skipped": the convolution alone


def _conv_attention(x: Tensor, grid_size: tuple[int, int], attn: ConvAttention, *, wrong: str | None = None) -> Tensor:
    """The layer's own forward pass, or a known wrong answer written out (``wrong``)."""
    if wrong is None:
        return attn(x, grid_size)
    bn = wrong if wrong in ("batch_statistics", "no_affine", "no_eps", "skipped") else "eval"
    split = "d h" if wrong in ("split_d_h", "split_merge_d_h") else "h d"
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
        _conv_projection(fmap, attn.conv_proj_q, bn),
        _conv_projection(fmap, kv_proj[0], bn),
        _conv_projection(fmap, kv_proj[1], bn),
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
    q, k, v = (rearrange(p(t), f"B N ({split}) -> B h N d", h=attn.num_heads) for p, t in zip(projections, (q, k, v)))
    if cls is not None and wrong == "cls_after_linear":
        cls_heads = rearrange(cls, "B 1 (h d) -> B h 1 d", h=attn.num_heads)
        q, k, v = (torch.cat([cls_heads, t], dim=2) for t in (q, k, v))
    scale = attn.head_dim**-0.5 if wrong == "head_dim_scale" else attn.scale
    logits = q @ k.transpose(-2, -1) * scale  # (B, h, N_q, N_k)
    if wrong == "naive_softmax":
        weights = naive_softmax_of(logits)
    else:
        weights = logits.softmax(dim=-2 if wrong == "softmax_axis" else -1)
    out = weights @ v  # (B, h, N_q, d)
    if wrong == "merge_reshape":  # (B, h, N, d) reshaped straight to (B, N, C)
        return attn.proj(out.reshape(out.shape[0], out.shape[2], -1))
    merge = "d h" if wrong in ("merge_d_h", "split_merge_d_h") else "h d"
    return attn.proj(rearrange(out, f"B h N d -> B N ({merge})"))


def cvt_conv_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, grid_size, attn) -> out``: CvT's convolutional attention, cls token included.

    ``attn`` is a :class:`vitlab.models.cvt.ConvAttention` (eval mode); use its parts, not
    ``attn(x, grid_size)`` itself (the check cannot tell). If ``attn.with_cls_token``, the
    first token of ``x`` is the cls token: split it off; fold the ``H * W`` map tokens,
    numbered row by row, into ``(B, C, H, W)``; make q, k and v with
    ``attn.conv_proj_q``, ``conv_proj_k``, ``conv_proj_v`` (depthwise conv + BatchNorm,
    map in, tokens out; k and v with stride 2); put the cls token back in front of each,
    unconvolved; then the linear layers ``attn.proj_q``, ``proj_k``, ``proj_v``, split
    into ``attn.num_heads`` heads ``(h d)``, ``softmax(q k^T * attn.scale) v`` (CvT's scale is
    ``dim**-0.5``, the embedding width: pitfall 19), merge the heads ``(h d)`` and apply
    ``attn.proj``. Without a cls token, the same with nothing to split. The check tries a
    non-square grid, with and without a cls token; in one case the BatchNorms' running
    variances are about 1e-3 (their eps matters), in the last ``proj_q`` is 200 times larger
    (logits of a few hundred: a softmax written as ``exp(x) / sum(exp(x))`` overflows).

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
            (2, 8, 2, 4, 3, True),
            (2, 12, 3, 4, 5, True),
        )
    ):
        small_var, gain = seed == 4, 200.0 if seed == 5 else 1.0
        attn = _attention_layer(seed, C, heads, with_cls, small_var=small_var, query_gain=gain)
        x = torch.randn(B, int(with_cls) + H * W, C, generator=generator(300 + seed))
        label = f"x {shape(x)}, grid_size={(H, W)}, {heads} heads, {'with' if with_cls else 'no'} cls token"
        if small_var:
            label += ", BatchNorm running variances about 1e-3"
        if gain != 1.0:
            label += f", large logits (proj_q x {gain:g})"
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
            "CvT's dim**-0.5 over the embedding width, which the released weights were trained with (pitfall 19)",
        ),
        KnownWrong(
            wrong("softmax_axis"),
            "the softmax runs over the queries (dim=-2); take it over the keys",
        ),
        KnownWrong(
            wrong("merge_d_h"),
            "the heads are merged (d h): output channel c * h + g holds head g's channel c; merge them (h d), "
            "head by head as they were split: rearrange(out, 'B h N d -> B N (h d)')",
        ),
        KnownWrong(
            wrong("merge_reshape"),
            "the heads are merged with a plain reshape of (B, h, N, d) to (B, N, C), which mixes tokens and "
            "heads; move the heads next to the channels first: out.transpose(1, 2).reshape(B, N, C)",
        ),
        KnownWrong(
            wrong("split_merge_d_h"),
            "the channels are split into heads (d h), so head g gets every h-th channel; split (and merge) them "
            "(h d): head g owns channels g*d ... (g+1)*d - 1",
        ),
        KnownWrong(
            wrong("split_d_h"),
            "the channels are split into heads (d h) but merged (h d); split them (h d): "
            "rearrange(t, 'B N (h d) -> B h N d', h=attn.num_heads)",
        ),
        KnownWrong(
            wrong("batch_statistics"),
            "the BatchNorm of conv_proj_q/k/v normalises with the batch's own statistics (training mode, or "
            "F.batch_norm(..., training=True)); attn is in eval mode: use its running_mean and running_var, as "
            "calling attn.conv_proj_q(fmap) does",
        ),
        KnownWrong(
            wrong("no_affine"),
            "the BatchNorm's affine is missing: after normalising, multiply by bn.weight and add bn.bias",
        ),
        KnownWrong(
            wrong("no_eps"),
            "the BatchNorm's eps is missing: divide by sqrt(running_var + bn.eps), not sqrt(running_var) (it "
            "matters where the running variance is small)",
        ),
        KnownWrong(
            wrong("skipped"),
            "the BatchNorm is skipped: conv_proj_q, conv_proj_k and conv_proj_v are a depthwise conv and then a "
            "BatchNorm; call the modules, attn.conv_proj_q(fmap), or apply .conv and then .bn",
        ),
        KnownWrong(wrong("naive_softmax"), NAIVE_SOFTMAX),
    ]
    return run_check("cvt_conv_attention", fn, cases, _conv_attention, known_wrong=wrongs)


def _avg_attention(x: Tensor, grid_size: tuple[int, int], attn: ConvAttention, *, wrong: str | None = None) -> Tensor:
    """Attention with the official code's parameter-free ``"avg"`` projection, or a known wrong answer."""
    H, W = grid_size
    cls = None
    if attn.with_cls_token:
        cls, x = x[:, :1], x[:, 1:]
    fmap = rearrange(x, "B (H W) C -> B C H W", H=H, W=W)
    pooled = F.avg_pool2d(fmap, 3, stride=2, padding=1, ceil_mode=wrong != "floor",
                          count_include_pad=wrong != "exclude_pad")  # fmt: skip
    kv = rearrange(pooled, "B C H W -> B (H W) C")  # (B, N', C)
    q = kv if wrong == "q_pooled" else x  # the queries: no convolution, no pooling
    k = v = kv
    if cls is not None and wrong != "cls_dropped":
        q = torch.cat([cls, q], dim=1)
        if wrong != "cls_query_only":
            k = v = torch.cat([cls, kv], dim=1)
    q, k, v = (
        rearrange(p(t), "B N (h d) -> B h N d", h=attn.num_heads)
        for p, t in zip((attn.proj_q, attn.proj_k, attn.proj_v), (q, k, v))
    )
    scale = attn.head_dim**-0.5 if wrong == "head_dim_scale" else attn.scale
    logits = q @ k.transpose(-2, -1) * scale  # (B, h, N_q, N_k)
    out = (naive_softmax_of(logits) if wrong == "naive_softmax" else logits.softmax(dim=-1)) @ v  # (B, h, N_q, d)
    return attn.proj(rearrange(out, "B h N d -> B N (h d)"))


def cvt_avg_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, grid_size, attn) -> out``: CvT's attention with the official code's ``"avg"`` projection.

    The parameter-free variant of microsoft/CvT's ``_build_projection``: the queries get no
    convolution (only ``attn.proj_q``), keys and values are the map average-pooled by
    ``nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True)`` (padding counted in the mean, the
    default), then ``attn.proj_k`` and ``attn.proj_v``. ``attn`` is a
    :class:`vitlab.models.cvt.ConvAttention` (eval mode) whose ``conv_proj_*`` are not used. If
    ``attn.with_cls_token``, the first token of ``x`` is the cls token: split it off, pool the
    ``H * W`` map tokens (row by row), and put the cls token back in front of q, k and v before
    the linear layers. Then ``softmax(q k^T * attn.scale) v`` over ``attn.num_heads`` heads
    ``(h d)`` and ``attn.proj``. ``ceil_mode=True`` rounds up: a 14 x 14 map gives 8 x 8 keys,
    where the stride-2 convolution gives 7 x 7. In the last case ``proj_q`` is 200 times
    larger (logits of a few hundred: a softmax written as ``exp(x) / sum(exp(x))`` overflows).

    Shape: x (B, T + H*W, C), grid_size (H, W), attn -> (B, T + H*W, C), T = 1 with a cls
    token, else 0.
    """
    cases = []
    for seed, (B, C, heads, H, W, with_cls) in enumerate(
        (
            (1, 8, 2, 4, 4, True), (2, 8, 2, 3, 5, False), (2, 12, 3, 6, 4, True), (1, 6, 2, 5, 6, True),
            (2, 12, 3, 4, 5, True),
        )
    ):  # fmt: skip
        gain = 200.0 if seed == 4 else 1.0
        attn = _attention_layer(seed, C, heads, with_cls, query_gain=gain)
        x = torch.randn(B, int(with_cls) + H * W, C, generator=generator(400 + seed))
        label = f"x {shape(x)}, grid_size={(H, W)}, {heads} heads, {'with' if with_cls else 'no'} cls token"
        if gain != 1.0:
            label += f", large logits (proj_q x {gain:g})"
        cases.append(Case(label, (x, (H, W), attn)))

    def wrong(kind: str) -> Callable[..., Tensor]:
        return lambda x, g, a: _avg_attention(x, g, a, wrong=kind)

    wrongs = [
        KnownWrong(
            wrong("floor"),
            "the pooled map is rounded down (AvgPool2d without ceil_mode=True): the official projection rounds "
            "up, so a 4 x 4 map gives 3 x 3 keys and a 14 x 14 map 8 x 8",
        ),
        KnownWrong(
            wrong("exclude_pad"),
            "the mean leaves the zero padding out (count_include_pad=False); the official AvgPool2d counts it, "
            "the default",
        ),
        KnownWrong(
            wrong("q_pooled"),
            "the queries were pooled too: only keys and values are squeezed; the queries keep one per token "
            "(no convolution, no pooling, just proj_q)",
        ),
        KnownWrong(
            lambda x, g, a: _conv_attention(x, g, a),
            "this is the chapter's convolutional projection (attn.conv_proj_q, _k, _v: depthwise conv + "
            "BatchNorm); the 'avg' method replaces it: no convolution for q, average pooling for k and v",
        ),
        KnownWrong(
            wrong("cls_dropped"),
            "the cls token was split off and never re-attached: put it back in front of q, k and v, before "
            "the linear layers",
        ),
        KnownWrong(
            wrong("cls_query_only"),
            "the cls token was re-attached to the queries only; it is a key and a value too: put it in front "
            "of the pooled keys and values as well",
        ),
        KnownWrong(
            wrong("head_dim_scale"),
            "the logits are scaled by head_dim**-0.5; CvT scales by the embedding width, attn.scale = dim**-0.5",
            19,
        ),
        KnownWrong(wrong("naive_softmax"), NAIVE_SOFTMAX),
    ]
    return run_check("cvt_avg_attention", fn, cases, _avg_attention, known_wrong=wrongs)
