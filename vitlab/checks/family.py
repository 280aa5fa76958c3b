"""Checks that count multiply-accumulates (MACs) by hand: a ViT block, attention, CrossViT's fusion.

The references are the formulas :func:`vitlab.family.count_macs` measures on the models
(``tests/test_checks_family.py`` compares them): a product ``(n, a) @ (a, b)`` costs
``n * a * b`` MACs; biases, norms, activations, softmax and additions are not counted.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from vitlab.checks._core import WHOLE, Case, CheckResult, KnownWrong, run_check, vary

FLOPS = "these are FLOPs (2 per multiply-add); MACs are half"

# (tokens, dim, mlp_ratio): ViT-S/16, ViT-B/16, a tiny ViT, PiT-S stages 1 and 3, DeepViT-S, T2T-ViT-14.
_BLOCKS = (
    (197, 384, 4.0), (197, 768, 4.0), (5, 32, 4.0), (730, 144, 4.0), (50, 576, 4.0), (197, 396, 3.0),
    (197, 384, 3.0),
)  # fmt: skip


def _block_macs(tokens: int, dim: int, mlp_ratio: float) -> int:
    N, D, hidden = tokens, dim, int(dim * mlp_ratio)
    return N * 4 * D * D + 2 * N * D * hidden + 2 * N * N * D  # qkv + proj, MLP, q k^T + attn v


def encoder_block_macs(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(tokens, dim, mlp_ratio) -> int``: the MACs of one pre-norm ViT block.

    qkv ``3 N D^2`` + output projection ``N D^2`` + MLP ``2 N D * int(D * mlp_ratio)`` +
    ``q k^T`` and ``attn v`` ``N^2 D`` each (all heads together).

    Shape: ints (and a float ratio) -> int.
    """
    rows = vary(_BLOCKS, lambda r: (r.randint(2, 800), 16 * r.randint(1, 64), r.choice((2.0, 3.0, 4.0))))
    cases = [Case(f"tokens={n}, dim={d}, mlp_ratio={r}", (n, d, r)) for n, d, r in rows]
    wrongs = [
        KnownWrong(lambda n, d, r: n * (4 * d * d + 2 * d * int(d * r)),
                   "only the Linear layers are counted; the attention's two matrix products, "
                   "q k^T and attn v, add 2 N^2 D"),
        KnownWrong(lambda n, d, r: n * (4 * d * d + 2 * d * int(d * r)) + n * n * d,
                   "q k^T is counted but attn v is not; each costs N^2 D"),
        KnownWrong(lambda n, d, r: 2 * _block_macs(n, d, r), FLOPS),
        KnownWrong(lambda n, d, r: _block_macs(n, d, r) - n * d * d,
                   "the attention's output projection (D x D, applied to every token) is missing"),
        KnownWrong(lambda n, d, r: _block_macs(n, d, r) - n * d * int(d * r),
                   "the MLP is counted once; it has two Linear layers, D -> hidden and hidden -> D"),
    ]  # fmt: skip
    return run_check("encoder_block_macs", fn, cases, _block_macs, known_wrong=wrongs, expect=WHOLE)


# (n_queries, n_keys, qk_dim, v_dim), widths over all heads: ViT-S; CaiT class attention; LeViT-128S
# stage 1 and its first shrink attention; CvT-13 stage 1 (keys squeezed by stride 2); PiT-S stage 1.
_ATTENTION = (
    (197, 197, 384, 384), (1, 197, 192, 192), (196, 196, 64, 128), (49, 196, 128, 512), (3136, 784, 64, 64),
    (730, 730, 144, 144),
)  # fmt: skip


def _attention_macs(n_queries: int, n_keys: int, qk_dim: int, v_dim: int) -> int:
    return n_queries * n_keys * qk_dim + n_queries * n_keys * v_dim  # q k^T, then attn v


def attention_macs(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(n_queries, n_keys, qk_dim, v_dim) -> int``: the MACs of ``q k^T`` and ``attn v``.

    ``N_q N_k qk_dim + N_q N_k v_dim``, the widths summed over the heads; the projections
    that make q, k and v are not part of it.

    Shape: ints -> int.
    """
    rows = vary(_ATTENTION, lambda r: (r.randint(1, 999), r.randint(1, 999), r.randint(8, 512), r.randint(8, 512)))
    cases = [Case(f"n_queries={q}, n_keys={k}, qk_dim={a}, v_dim={b}", (q, k, a, b)) for q, k, a, b in rows]
    wrongs = [
        KnownWrong(lambda q, k, a, b: q * q * (a + b),
                   "the map is taken as N_q x N_q; it has one row per query and one column per key, N_q x N_k"),
        KnownWrong(lambda q, k, a, b: k * k * (a + b),
                   "the map is taken as N_k x N_k; it has one row per query and one column per key, N_q x N_k"),
        KnownWrong(lambda q, k, a, b: q * k * a, "only q k^T is counted; attn v adds N_q N_k v_dim"),
        KnownWrong(lambda q, k, a, b: 2 * q * k * a,
                   "attn v is counted with the key width; it multiplies by v, whose width is v_dim (LeViT's values are "
                   "2 to 4 times wider than its keys)"),
        KnownWrong(lambda q, k, a, b: 2 * _attention_macs(q, k, a, b), "these are FLOPs; MACs are half"),
    ]  # fmt: skip
    return run_check("attention_macs", fn, cases, _attention_macs, known_wrong=wrongs, expect=WHOLE)


def _direction_macs(c_i: int, c_j: int, n_j: int, *, keys: int = 1, all_query: bool = False, fg: bool = True,
                    wo: bool = True) -> int:  # fmt: skip
    """Branch i's cls token (width C_i) queries branch j (N_j patches, width C_j); keywords make wrong answers."""
    tokens = keys + n_j  # z = [f(cls_i), patches_j]
    queries = tokens if all_query else 1
    macs = 2 * c_i * c_j if fg else 0  # f, then g, on one token each
    macs += queries * c_j * c_j + 2 * tokens * c_j * c_j  # q, then k and v
    macs += 2 * queries * tokens * c_j  # q k^T and attn v, all heads together
    return macs + (queries * c_j * c_j if wo else 0)  # output projection


def _fusion_macs(n_s: int, n_l: int, c_s: int, c_l: int, **knobs: Any) -> int:
    """S queries L, L queries S; the keywords of :func:`_direction_macs` make wrong answers."""
    return _direction_macs(c_s, c_l, n_l, **knobs) + _direction_macs(c_l, c_s, n_s, **knobs)


_FUSION_MAC_WRONGS = (
    KnownWrong(lambda ns, nl, cs, cl: 2 * _fusion_macs(ns, nl, cs, cl), FLOPS),
    KnownWrong(lambda ns, nl, cs, cl: _direction_macs(cs, cl, nl),
               "only one direction is counted (S's cls token querying L); L's cls token queries S as well"),
    KnownWrong(partial(_fusion_macs, fg=False),
               "f and g are not counted: each is a Linear between the two widths, C_S C_L MACs on the one token, four "
               "of them in all (LayerNorm and GELU are not counted)"),
    KnownWrong(partial(_fusion_macs, keys=0),
               "the projected cls token is left out of the keys and values; they come from z = [f(cls_i), patches_j], "
               "1 + N_j tokens"),
    KnownWrong(partial(_fusion_macs, all_query=True),
               "every token of z is counted as a query, as in self-attention; the fusion has ONE query, f(cls_i): "
               "q and the output projection act on one token, and the map is 1 x (1 + N_j)"),
    KnownWrong(lambda ns, nl, cs, cl: _direction_macs(cs, cl, ns) + _direction_macs(cl, cs, nl),
               "the token counts are paired with the wrong branch: S's cls token attends over L's tokens, so the "
               "direction at width C_L has 1 + N_L keys, and the one at width C_S has 1 + N_S"),
    KnownWrong(partial(_fusion_macs, wo=False),
               "the output projection wo is missing: C_j^2 MACs on the one attended token, in each direction"),
)  # fmt: skip


def fusion_macs(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(n_s, n_l, c_s, c_l) -> int``: the MACs of CrossViT's fusion, both directions.

    S's cls token queries ``z = [f(cls_S), patches_L]`` at width ``C_L`` and L's queries S.
    One direction at width ``C_j`` over ``T = 1 + N_j`` tokens: ``f`` and ``g`` ``C_i C_j``
    each, ``q`` ``C_j^2``, ``k`` and ``v`` ``T C_j^2`` each, ``q k^T`` and ``attn v``
    ``T C_j`` each, the output projection ``C_j^2``.

    Shape: ints -> int.
    """
    sizes = ((400, 196, 96, 192), (400, 196, 192, 384), (400, 196, 384, 768), (576, 324, 224, 448), (9, 4, 8, 16))
    sizes = vary(sizes, lambda r: (r.randint(4, 600), r.randint(4, 600), 8 * r.randint(1, 64), 8 * r.randint(1, 96)))
    labels = ("CrossViT-Ti", "CrossViT-S", "CrossViT-B", "CrossViT-18's widths on 24x24 and 18x18 grids", "a toy")
    cases = [
        Case(f"{label}: n_s={ns}, n_l={nl}, c_s={cs}, c_l={cl}", (ns, nl, cs, cl))
        for label, (ns, nl, cs, cl) in zip(labels, sizes, strict=True)
    ]
    return run_check("fusion_macs", fn, cases, _fusion_macs, known_wrong=_FUSION_MAC_WRONGS, expect=WHOLE)
