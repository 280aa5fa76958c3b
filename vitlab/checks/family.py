"""Checks for the comparison chapter: counting multiply-accumulates (MACs) by hand.

The references are the formulas that :func:`vitlab.family.count_macs` measures on the
models (``tests/test_checks_family.py`` checks each against the counter): a matrix
product ``(n, a) @ (a, b)`` costs ``n * a * b`` MACs, and nothing else is counted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vitlab.checks._core import Case, CheckResult, Expect, KnownWrong, run_check

_WHOLE = Expect(kind="number", integer=True, rtol=0.0, atol=1e-9)

# (tokens, dim, mlp_ratio): ViT-S/16, ViT-B/16, this chapter's tiny ViT, PiT-S stages 1 and
# 3, DeepViT-S (mlp ratio 3), T2T-ViT-14's backbone.
_BLOCKS = (
    (197, 384, 4.0), (197, 768, 4.0), (5, 32, 4.0), (730, 144, 4.0), (50, 576, 4.0), (197, 396, 3.0),
    (197, 384, 3.0),
)  # fmt: skip


def _block_macs(tokens: int, dim: int, mlp_ratio: float) -> int:
    N, D, hidden = tokens, dim, int(dim * mlp_ratio)
    return N * 4 * D * D + 2 * N * D * hidden + 2 * N * N * D  # qkv + proj, MLP, q k^T + attn v


def encoder_block_macs(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(tokens, dim, mlp_ratio) -> int``: the MACs of one pre-norm ViT block.

    For ``N = tokens``, ``D = dim`` and the MLP's hidden width ``int(D * mlp_ratio)``:
    qkv ``3 N D^2`` + output projection ``N D^2`` + MLP ``2 N D * hidden`` (two Linear
    layers) + ``q k^T`` ``N^2 D`` + ``attn v`` ``N^2 D`` (all heads together). Biases,
    LayerNorm, softmax, GELU and the residual additions are not counted, as
    :func:`vitlab.family.count_macs`. The answer is a whole number.

    Shape: ints (and a float ratio) -> int.
    """
    cases = [Case(f"tokens={n}, dim={d}, mlp_ratio={r}", (n, d, r)) for n, d, r in _BLOCKS]
    wrongs = [
        KnownWrong(
            lambda n, d, r: n * (4 * d * d + 2 * d * int(d * r)),
            "only the Linear layers are counted; the attention's two matrix products, q k^T and attn v, add 2 N^2 D",
        ),
        KnownWrong(
            lambda n, d, r: n * (4 * d * d + 2 * d * int(d * r)) + n * n * d,
            "q k^T is counted but attn v is not; each costs N^2 D",
        ),
        KnownWrong(lambda n, d, r: 2 * _block_macs(n, d, r), "these are FLOPs (2 per multiply-add); MACs are half"),
        KnownWrong(
            lambda n, d, r: _block_macs(n, d, r) - n * d * d,
            "the attention's output projection (D x D, applied to every token) is missing",
        ),
        KnownWrong(
            lambda n, d, r: _block_macs(n, d, r) - n * d * int(d * r),
            "the MLP is counted once; it has two Linear layers, D -> hidden and hidden -> D",
        ),
    ]
    return run_check("encoder_block_macs", fn, cases, _block_macs, known_wrong=wrongs, expect=_WHOLE)


# (n_queries, n_keys, qk_dim, v_dim), widths over all heads: ViT-S; CaiT-XXS class attention
# (one query); LeViT-128S stage 1 (4 heads, key 16, value 32) and its first shrink attention
# (8 heads, key 16, value 64, queries on every second row and column); CvT-13 stage 1 (keys
# and values squeezed by stride 2); PiT-S stage 1.
_ATTENTION = (
    (197, 197, 384, 384), (1, 197, 192, 192), (196, 196, 64, 128), (49, 196, 128, 512), (3136, 784, 64, 64),
    (730, 730, 144, 144),
)  # fmt: skip


def _attention_macs(n_queries: int, n_keys: int, qk_dim: int, v_dim: int) -> int:
    return n_queries * n_keys * qk_dim + n_queries * n_keys * v_dim  # q k^T, then attn v


def attention_macs(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(n_queries, n_keys, qk_dim, v_dim) -> int``: the MACs of attention's two products.

    ``q`` is ``(N_q, qk_dim)`` and ``k`` is ``(N_k, qk_dim)``, ``v`` is ``(N_k, v_dim)``, the
    widths summed over the heads (splitting into heads does not change the count):
    ``q k^T`` costs ``N_q N_k qk_dim`` and ``attn v`` costs ``N_q N_k v_dim``. Queries and
    keys differ in class attention (one query), LeViT's shrink attention (a quarter of the
    queries; values wider than keys) and CvT (keys squeezed by a stride). The projections
    that make q, k and v are not part of it. The answer is a whole number.

    Shape: ints -> int.
    """
    cases = [Case(f"n_queries={q}, n_keys={k}, qk_dim={a}, v_dim={b}", (q, k, a, b)) for q, k, a, b in _ATTENTION]
    wrongs = [
        KnownWrong(
            lambda q, k, a, b: q * q * (a + b),
            "the map is taken as N_q x N_q; it has one row per query and one column per key, N_q x N_k",
        ),
        KnownWrong(
            lambda q, k, a, b: k * k * (a + b),
            "the map is taken as N_k x N_k; it has one row per query and one column per key, N_q x N_k",
        ),
        KnownWrong(lambda q, k, a, b: q * k * a, "only q k^T is counted; attn v adds N_q N_k v_dim"),
        KnownWrong(
            lambda q, k, a, b: 2 * q * k * a,
            "attn v is counted with the key width; it multiplies by v, whose width is v_dim (LeViT's values "
            "are 2 to 4 times wider than its keys)",
        ),
        KnownWrong(lambda q, k, a, b: 2 * _attention_macs(q, k, a, b), "these are FLOPs; MACs are half"),
    ]
    return run_check("attention_macs", fn, cases, _attention_macs, known_wrong=wrongs, expect=_WHOLE)
