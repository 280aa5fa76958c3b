"""Check for the CrossViT chapter: one direction of the cross-attention fusion, f and g included."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from vitlab.checks._core import (
    NAIVE_SOFTMAX,
    Case,
    CheckResult,
    Expect,
    KnownWrong,
    generator,
    naive_softmax_of,
    run_check,
    shape,
)
from vitlab.layers.attention import explicit_attention
from vitlab.models.crossvit import CrossAttentionBlock, projection

# (B, N_i, C_i, N_j, C_j, heads, query gain): the first case has equal widths, so that
# answers that skip g or attend over their own branch still run and can be named; then the
# two directions of a CrossViT with different widths (S -> L and L -> S); last, wq 50 times
# larger, so that the logits reach a few hundred.
_SIZES = ((2, 5, 8, 3, 8, 2, 1.0), (2, 6, 8, 4, 12, 3, 1.0), (1, 3, 12, 7, 8, 2, 1.0), (2, 6, 8, 4, 12, 3, 50.0))


def _randomise(module: nn.Module, g: torch.Generator) -> nn.Module:
    """Seeded weights for f or g (LayerNorm -> GELU -> Linear): LayerNorm not at identity."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if isinstance(module.get_submodule(name.rsplit(".", 1)[0]), nn.LayerNorm):
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * noise)
            else:
                p.copy_(noise * p.shape[-1] ** -0.5 if p.ndim == 2 else 0.1 * noise)
    return module.eval()


def _reference(x: Tensor, other: Tensor, f: nn.Module, g: nn.Module, wq: Tensor, wk: Tensor, wv: Tensor,
               wo: Tensor, num_heads: int) -> Tensor:  # fmt: skip
    """vitlab's fusion (``MultiScaleBlock``, one direction) with no LayerNorm and no biases."""
    width = other.shape[-1]
    block = CrossAttentionBlock(width, num_heads=num_heads, qkv_bias=False, fused_attn=False).eval()
    setattr(block, "norm1", nn.Identity())  # the exercise leaves out the pre-norm
    with torch.no_grad():
        for layer, w in zip((block.attn.q, block.attn.k, block.attn.v, block.attn.proj), (wq, wk, wv, wo)):
            layer.weight.copy_(w)
        block.attn.proj.bias.zero_()
        query = f(x[:, :1])  # (B, 1, C_j)
        fused = block(torch.cat([query, other[:, 1:]], dim=1))  # (B, 1, C_j): f(cls) + CA
        return torch.cat([g(fused), x[:, 1:]], dim=1)  # (B, 1 + N_i, C_i)


def _fusion(
    x: Tensor, other: Tensor, f: nn.Module, g: nn.Module, wq: Tensor, wk: Tensor, wv: Tensor, wo: Tensor,
    num_heads: int, *, keys: str = "query+other", residual: str = "before g", use_g: bool = True,
    use_wo: bool = True, transposed: bool = False, scale_by_width: bool = False, split: str = "h d",
    merge: str = "h d", softmax_dim: int = -1, naive_softmax: bool = False,
) -> Tensor:  # fmt: skip
    """The fusion written out; the keywords turn on the known wrong answers (``split``,
    ``merge``: the channel order of the heads, ``"h d"`` or ``"d h"``)."""
    linear = (lambda t, w: t @ w) if transposed else F.linear
    query = f(x[:, :1])  # (B, 1, C_j)
    if keys == "query+other":  # right: [f(cls_i), patches_j]
        z = torch.cat([query, other[:, 1:]], dim=1)
    elif keys == "other only":  # the query's own token left out of the keys
        z = other[:, 1:]
    elif keys == "other with its cls":  # [cls_j, patches_j]: the other branch's own cls
        z = other
    else:  # "own branch": [f(cls_i), patches_i], runs only when the widths are equal
        z = torch.cat([query, x[:, 1:]], dim=1)
    heads = f"B n ({split}) -> B h n d"
    q = rearrange(linear(query, wq), heads, h=num_heads)
    k = rearrange(linear(z, wk), heads, h=num_heads)
    v = rearrange(linear(z, wv), heads, h=num_heads)
    scale = other.shape[-1] ** -0.5 if scale_by_width else q.shape[-1] ** -0.5
    if softmax_dim == -1 and not naive_softmax:
        out, _ = explicit_attention(q, k, v, scale=scale)
    else:
        logits = q @ k.transpose(-2, -1) * scale  # (B, h, 1, N_keys)
        out = (naive_softmax_of(logits) if naive_softmax else logits.softmax(dim=softmax_dim)) @ v
    out = rearrange(out, f"B h n d -> B n ({merge})")
    if use_wo:
        out = linear(out, wo)
    if residual == "before g":  # right: g(f(cls) + CA)
        cls = g(query + out) if use_g else query + out
    elif residual == "after g":  # lucidrains: cls + g(CA)
        cls = x[:, :1] + (g(out) if use_g else out)
    else:  # no residual: g(CA)
        cls = g(out) if use_g else out
    return torch.cat([cls, x[:, 1:]], dim=1)


def cross_attention_fusion(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, other, f, g, wq, wk, wv, wo, num_heads) -> x_new``: one direction of
    CrossViT's cross-attention fusion, the projections between the widths included.

    ``x`` holds branch i's tokens ``[cls_i, patches_i]`` (width ``C_i``), ``other`` branch
    j's ``[cls_j, patches_j]`` (width ``C_j``). ``f`` maps a ``(B, 1, C_i)`` token to
    ``C_j`` and ``g`` maps ``C_j`` back to ``C_i`` (call them: they are
    :func:`vitlab.models.crossvit.projection` modules, LayerNorm -> GELU -> Linear).
    ``wq, wk, wv, wo`` are ``(C_j, C_j)`` weights stored as ``nn.Linear`` stores them.
    With ``t = f(cls_i)`` and ``z = [t, patches_j]`` (the projected query is one of the
    keys, as in the official code, timm and vitlab; ``cls_j`` is not):
    ``q = F.linear(t, wq)``, ``k = F.linear(z, wk)``, ``v = F.linear(z, wv)``, split into
    ``num_heads`` heads ``(h d)``, ``softmax(q k^T / sqrt(d)) v``, heads merged,
    ``F.linear(., wo)``; then the residual at width ``C_j`` and g:
    ``cls_new = g(t + attended)``. Return ``[cls_new, patches_i]``: the patch tokens pass
    through unchanged. No LayerNorm before the attention and no biases (vitlab's
    ``CrossAttentionBlock`` has both; the check removes them). In the last case ``wq`` is
    50 times larger, so the logits reach a few hundred (a softmax written as
    ``exp(x) / sum(exp(x))`` overflows there).

    Shape: x (B, 1 + N_i, C_i), other (B, 1 + N_j, C_j) -> (B, 1 + N_i, C_i).
    """
    cases = []
    for seed, (B, n_i, c_i, n_j, c_j, h, gain) in enumerate(_SIZES):
        gen = generator(100 + seed)
        x = torch.randn(B, 1 + n_i, c_i, generator=gen)
        other = torch.randn(B, 1 + n_j, c_j, generator=gen)
        f = _randomise(projection(c_i, c_j), gen)
        g = _randomise(projection(c_j, c_i), gen)
        wq, wk, wv, wo = (torch.randn(c_j, c_j, generator=gen) * c_j**-0.5 for _ in range(4))
        label = f"x {shape(x)}, other {shape(other)}, num_heads={h}"
        if gain != 1.0:
            wq = gain * wq
            label += f", large logits (wq x {gain:g})"
        cases.append(Case(label, (x, other, f, g, wq, wk, wv, wo, h)))

    def wrong(message: str, **knobs: Any) -> KnownWrong:
        return KnownWrong(lambda *args: _fusion(*args, **knobs), message)

    wrongs = [
        wrong("g is missing: the fused token f(cls) + CA is C_j wide; project it back with g, "
              "cls_new = g(f(cls) + CA)", use_g=False),
        wrong("the keys and values come from the query's own branch; the cls token asks the OTHER "
              "branch: z = [f(cls_i), patches_j]", keys="own branch"),
        wrong("the projected cls token is left out of the keys and values; CrossViT (official code, "
              "timm, vitlab) attends over z = [f(cls_i), patches_j], the query included", keys="other only"),
        wrong("the keys include the other branch's own cls token; replace it by the projected query: "
              "z = [f(cls_i), patches_j]", keys="other with its cls"),
        wrong("the residual is added after g, at the branch's own width (cls + g(CA), as lucidrains' "
              "vit-pytorch); CrossViT adds it at the other width, then applies g: g(f(cls) + CA)",
              residual="after g"),
        wrong("the residual is missing: cls_new = g(f(cls) + CA), not g(CA)", residual="none"),
        wrong("the output projection wo is missing: CA = F.linear(softmax(q k^T / sqrt(d)) v, wo)", use_wo=False),
        wrong("the weights are used transposed (t @ w); they are stored as nn.Linear stores them, "
              "(C_out, C_in): F.linear(t, w), i.e. t @ w.T", transposed=True),
        wrong("the logits are scaled by C_j**-0.5, the whole width of the other branch; scale by the head "
              "width: d**-0.5 with d = C_j / num_heads", scale_by_width=True),
        wrong("the heads are merged (d h): output channel c * h + g holds head g's channel c; merge them (h d), "
              "head by head as they were split: rearrange(out, 'B h n d -> B n (h d)')", merge="d h"),
        wrong("the channels are split into heads (d h), so head g gets every h-th channel; split (and merge) them "
              "(h d): head g owns channels g*d ... (g+1)*d - 1", split="d h", merge="d h"),
        wrong("the channels are split into heads (d h) but merged (h d); split them (h d): "
              "rearrange(t, 'B n (h d) -> B h n d', h=num_heads)", split="d h"),
        wrong("the softmax runs over the queries (dim=-2): with one query every weight is 1; take it over the "
              "keys, softmax(dim=-1)", softmax_dim=-2),
        wrong(NAIVE_SOFTMAX, naive_softmax=True),
    ]  # fmt: skip
    return run_check("cross_attention_fusion", fn, cases, _reference, known_wrong=wrongs)


def _direction_macs(c_i: int, c_j: int, n_j: int, *, keys: int = 1, queries: int = 1, fg: bool = True,
                    wo: bool = True) -> int:  # fmt: skip
    """MACs of one direction: branch i's cls token (width C_i) queries branch j (N_j patches, width C_j).

    ``keys=0`` leaves the projected cls token out of the keys; ``queries`` other than 1, ``fg``
    and ``wo`` make known wrong answers.
    """
    tokens = keys + n_j  # z = [f(cls_i), patches_j]
    macs = 2 * c_i * c_j if fg else 0  # f, then g, on one token each
    macs += queries * c_j * c_j + 2 * tokens * c_j * c_j  # q, then k and v
    macs += 2 * queries * tokens * c_j  # q k^T and attn v, all heads together
    return macs + (queries * c_j * c_j if wo else 0)  # output projection


def _fusion_macs(n_s: int, n_l: int, c_s: int, c_l: int) -> int:
    """Both directions: S's cls token queries L, L's cls token queries S."""
    return _direction_macs(c_s, c_l, n_l) + _direction_macs(c_l, c_s, n_s)


_FUSION_MAC_WRONGS = (
    KnownWrong(
        lambda ns, nl, cs, cl: 2 * _fusion_macs(ns, nl, cs, cl), "these are FLOPs (2 per multiply-add); MACs are half"
    ),
    KnownWrong(
        lambda ns, nl, cs, cl: _direction_macs(cs, cl, nl),
        "only one direction is counted (S's cls token querying L); L's cls token queries S as well",
    ),
    KnownWrong(
        lambda ns, nl, cs, cl: _direction_macs(cs, cl, nl, fg=False) + _direction_macs(cl, cs, ns, fg=False),
        "f and g are not counted: each is a Linear between the two widths, C_S C_L MACs on the one token, "
        "four of them in all (LayerNorm and GELU are not counted)",
    ),
    KnownWrong(
        lambda ns, nl, cs, cl: _direction_macs(cs, cl, nl, keys=0) + _direction_macs(cl, cs, ns, keys=0),
        "the projected cls token is left out of the keys and values; they come from z = [f(cls_i), patches_j], "
        "1 + N_j tokens",
    ),
    KnownWrong(
        lambda ns, nl, cs, cl: (
            _direction_macs(cs, cl, nl, queries=1 + nl) + _direction_macs(cl, cs, ns, queries=1 + ns)
        ),
        "every token of z is counted as a query, as in self-attention; the fusion has ONE query, f(cls_i): "
        "q and the output projection act on one token, and the map is 1 x (1 + N_j)",
    ),
    KnownWrong(
        lambda ns, nl, cs, cl: _direction_macs(cs, cl, ns) + _direction_macs(cl, cs, nl),
        "the token counts are paired with the wrong branch: S's cls token attends over L's tokens, so the "
        "direction at width C_L has 1 + N_L keys, and the one at width C_S has 1 + N_S",
    ),
    KnownWrong(
        lambda ns, nl, cs, cl: _direction_macs(cs, cl, nl, wo=False) + _direction_macs(cl, cs, ns, wo=False),
        "the output projection wo is missing: C_j^2 MACs on the one attended token, in each direction",
    ),
)


def fusion_macs(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(n_s, n_l, c_s, c_l) -> int``: the MACs of one multi-scale encoder's fusion.

    ``n_s``, ``n_l``: the patch tokens of the S and L branches; ``c_s``, ``c_l``: their
    widths. Both directions count: S's class token queries L (at width ``C_L``, over
    ``z = [f(cls_S), patches_L]``, ``1 + N_L`` tokens) and L's queries S (width ``C_S``,
    ``1 + N_S`` tokens). For the direction at width ``C_j`` over ``T = 1 + N_j`` tokens:
    ``f`` and ``g`` ``C_i C_j`` each (one token), ``q`` ``C_j^2`` (one token), ``k`` and
    ``v`` ``T C_j^2`` each, ``q k^T`` and ``attn v`` ``T C_j`` each (all heads together:
    splitting into heads does not change the count), the output projection ``C_j^2``.
    As :func:`vitlab.family.count_macs`: a product ``(n, a) @ (a, b)`` costs ``n a b``;
    biases, LayerNorm, GELU, softmax and additions are not counted. A whole number.

    Shape: ints -> int.
    """
    sizes = ((400, 196, 96, 192), (400, 196, 192, 384), (400, 196, 384, 768), (576, 324, 224, 448), (9, 4, 8, 16))
    labels = ("CrossViT-Ti", "CrossViT-S", "CrossViT-B", "CrossViT-18's widths on 24x24 and 18x18 grids", "a toy")
    cases = [
        Case(f"{label}: n_s={ns}, n_l={nl}, c_s={cs}, c_l={cl}", (ns, nl, cs, cl))
        for label, (ns, nl, cs, cl) in zip(labels, sizes)
    ]
    return run_check(
        "fusion_macs", fn, cases, _fusion_macs, known_wrong=_FUSION_MAC_WRONGS,
        expect=Expect(kind="number", integer=True, rtol=0.0, atol=1e-9),
    )  # fmt: skip
