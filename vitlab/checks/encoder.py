"""Checks for chapter 3 (the ViT encoder): the pre-norm block by hand and ViT's parameter count."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from vitlab.checks._core import WHOLE, Case, CheckResult, KnownWrong, generator, run_check, shape, vary
from vitlab.checks._slips import NAIVE_SOFTMAX, naive_softmax_of, turned
from vitlab.layers.attention import Attention
from vitlab.layers.block import Block


class _HandBlock(Block):
    """A :class:`Block` that refuses ``block(x)``: the exercise composes its sub-modules."""

    def forward(self, x: Tensor, return_attn: bool = False) -> Tensor:
        raise RuntimeError(
            "compute the block by hand from block.norm1, block.attn, block.norm2 and block.mlp, not with block(x)"
        )


def _block(dim: int, num_heads: int, seed: int, *, query_gain: float = 1.0) -> Block:
    """A seeded block in eval mode; LayerNorm gains and biases random too, so each sub-module matters.

    ``query_gain`` multiplies the query rows of ``attn.qkv``: 60 gives logits of a few hundred.
    """
    with torch.random.fork_rng(devices=[]):  # nn.Linear's init must not move the notebook's global RNG
        block = _HandBlock(dim, num_heads=num_heads).eval()
    g = generator(seed)
    with torch.no_grad():
        for name, p in block.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.ndim == 2:  # a linear layer's weight, (C_out, C_in): fan-in scaling keeps activations O(1)
                p.copy_(noise * p.shape[1] ** -0.5)
            elif name.startswith("norm") and name.endswith("weight"):
                p.copy_(1 + 0.2 * noise)
            else:  # biases
                p.copy_(0.2 * noise)
        assert isinstance(block.attn, Attention)
        block.attn.qkv.weight[:dim] *= query_gain  # (qkv h d) rows: the queries come first
    return block


def _pre_norm(x: Tensor, block: Block) -> Tensor:
    """ViT's block, as :meth:`vitlab.layers.Block.forward` with no LayerScale or drop path."""
    x = x + block.attn(block.norm1(x))  # (B, N, C)
    return x + block.mlp(block.norm2(x))  # (B, N, C)


def _post_norm(x: Tensor, b: Block, *, residual: tuple[int, int] = (1, 1), norms: str = "12") -> Tensor:
    """The post-norm block; ``residual`` (0: none) and ``norms`` (after each sub-layer: ``"1"`` norm1,
    ``"2"`` norm2, ``"-"`` none, ``"p"`` a LayerNorm without weight and bias) make known wrong answers."""

    def norm(which: str, t: Tensor) -> Tensor:
        if which == "-":
            return t
        return F.layer_norm(t, t.shape[-1:]) if which == "p" else getattr(b, f"norm{which}")(t)

    x = norm(norms[0], residual[0] * x + b.attn(x))
    return norm(norms[1], residual[1] * x + b.mlp(x))


def _no_attention_residual(x: Tensor, b: Block) -> Tensor:
    x = b.attn(b.norm1(x))
    return x + b.mlp(b.norm2(x))


def _normalised_residual(x: Tensor, b: Block) -> Tensor:
    h = b.norm1(x)
    x = h + b.attn(h)
    h = b.norm2(x)
    return h + b.mlp(h)


def _norm_on_branch(x: Tensor, b: Block) -> Tensor:
    x = x + b.norm1(b.attn(x))
    return x + b.norm2(b.mlp(x))


def _norm1_twice(x: Tensor, b: Block) -> Tensor:
    x = x + b.attn(b.norm1(x))
    return x + b.mlp(b.norm1(x))


def _naive_attention(x: Tensor, b: Block) -> Tensor:
    """The pre-norm block with its attention written out and the softmax as exp(x) / sum(exp(x))."""
    a = b.attn
    assert isinstance(a, Attention)
    q, k, v = rearrange(a.qkv(b.norm1(x)), "B N (qkv h d) -> qkv B h N d", qkv=3, h=a.num_heads)
    out = naive_softmax_of(q @ k.transpose(-2, -1) * a.scale) @ v  # (B, h, N, d)
    x = x + a.proj(rearrange(out, "B h N d -> B N (h d)"))
    return x + b.mlp(b.norm2(x))


_BLOCK_WRONGS = (
    KnownWrong(_post_norm,
               "post-norm, LN(x + f(x)) as in the original Transformer: the LayerNorm comes after the residual add. "
               "ViT is pre-norm, each sub-layer reads a normalised copy and its output is added: x + f(LN(x))"),
    KnownWrong(lambda x, b: b.mlp(b.norm2(b.attn(b.norm1(x)))),
               "no residual connections: each sub-layer's output replaces the tokens; "
               "add it to them, x = x + attn(norm1(x)), then x = x + mlp(norm2(x))"),
    KnownWrong(_no_attention_residual,
               "the attention sub-layer has no residual: x = x + attn(norm1(x)), not x = attn(norm1(x))"),
    KnownWrong(lambda x, b: b.mlp(b.norm2(x + b.attn(b.norm1(x)))),
               "the MLP sub-layer has no residual: return x + mlp(norm2(x)), not mlp(norm2(x))"),
    KnownWrong(_normalised_residual,
               "the residual adds the normalised tokens LN(x); add the sub-layer's input x itself, x + attn(norm1(x)): "
               "the LayerNorm is on the branch only, the main path is a pure sum"),
    KnownWrong(_norm_on_branch,
               "the LayerNorm is applied to the sub-layer's output, x + LN(f(x)); it normalises the sub-layer's input: "
               "x + f(LN(x))"),
    KnownWrong(lambda x, b: x + b.attn(b.norm1(x)) + b.mlp(b.norm2(x)),
               "attention and MLP both read the block's input (a parallel block); the MLP reads the output of the "
               "attention sub-layer: x = x + attn(norm1(x)), then x = x + mlp(norm2(x))"),
    KnownWrong(_norm1_twice, "norm1 is used before the MLP too; each sub-layer has its own LayerNorm: mlp(norm2(x))"),
    KnownWrong(_naive_attention, f"in the attention written out, {NAIVE_SOFTMAX}; or call block.attn"),
)  # fmt: skip


def encoder_block(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, block) -> out``: a pre-norm :class:`vitlab.layers.Block` from its sub-modules.

    ``x = x + block.attn(block.norm1(x))``, then ``x + block.mlp(block.norm2(x))``; ``block(x)`` is switched off.

    Shape: x (B, N, C), block Block(C, num_heads=h) -> (B, N, C).
    """
    cases = []
    sizes = ((1, 5, 8, 2), (2, 10, 16, 4), (2, 17, 24, 3), (1, 50, 64, 4), (2, 10, 16, 4))
    for seed, (B, N, C, h) in enumerate(sizes):
        x = 2 * torch.randn(B, N, C, generator=generator(100 + seed)) + 0.5
        large = seed == 4
        label = f"x {shape(x)}, num_heads={h}" + (", large attention logits (queries x 60)" if large else "")
        cases.append(Case(label, (x, _block(C, h, seed, query_gain=60.0 if large else 1.0))))
    return run_check("encoder_block", fn, cases, _pre_norm, known_wrong=_BLOCK_WRONGS)


# ---------------------------------------------------------------- the parameter count

# (embed_dim, depth, patch_size, num_classes, img_size): ViT-Ti/16, ViT-B/16 (86,567,656),
# ViT-B/16 at 384 px, ViT-B/32, ViT-L/16 (304,326,632), and a small CIFAR-10 ViT.
_CONFIGS = (
    (192, 12, 16, 1000, 224), (768, 12, 16, 1000, 224), (768, 12, 16, 1000, 384),
    (768, 12, 32, 1000, 224), (1024, 24, 16, 1000, 224), (64, 2, 4, 10, 32),
)  # fmt: skip


def _parts(embed_dim: int, depth: int, patch_size: int, num_classes: int, img_size: int) -> dict[str, int]:
    """ViT's parameters part by part (3 input channels, MLP ratio 4, qkv bias, class token)."""
    D, L, P, K = embed_dim, depth, patch_size, num_classes
    N = (img_size // P) ** 2  # patch tokens
    return {
        "patch_weight": 3 * P * P * D,  # Conv2d(3, D, P, stride=P)
        "patch_bias": D,
        "cls_token": D,
        "pos_embed": (1 + N) * D,  # one row per token, the class token's included
        "block_weights": L * 12 * D * D,  # qkv 3D^2, proj D^2, fc1 4D^2, fc2 4D^2
        "block_biases": L * 9 * D,  # qkv 3D, proj D, fc1 4D, fc2 D
        "block_norms": L * 4 * D,  # norm1 and norm2: a gain and a bias each
        "norm": 2 * D,  # the final LayerNorm
        "head_weight": K * D,
        "head_bias": K,
    }


def _count(*config: int, without: tuple[str, ...] = (), extra: Callable[..., int] | None = None) -> int:
    """The total; ``without`` leaves parts out and ``extra`` adds a term (the known wrong answers)."""
    total = sum(n for part, n in _parts(*config).items() if part not in without)
    return total + (extra(*config) if extra is not None else 0)


def _miscount(
    message: str, *without: str, extra: Callable[..., int] | None = None, pitfall: int | None = None
) -> KnownWrong:
    """The known wrong count :func:`_count` gives with ``without`` and ``extra``."""
    return KnownWrong(lambda *config: _count(*config, without=without, extra=extra), message, pitfall)


_COUNT_WRONGS = (
    _miscount("the class token and the position embedding are not counted (the torchsummary total, 86,415,592 "
              "for ViT-B/16): add D + (1 + N) * D, 152,064 for ViT-B/16", "cls_token", "pos_embed", pitfall=6),
    _miscount("D parameters short: count the class token (D) and give the position embedding one row per token, "
              "the class token's included: (1 + N) * D, not N * D", "cls_token"),
    _miscount("the LayerNorms are not counted: 2 per block and the final one, each with a gain and a bias "
              "of D values (4 * D per block, 2 * D at the end)", "block_norms", "norm"),
    _miscount("the final LayerNorm (2 * D, a gain and a bias) is not counted", "norm"),
    _miscount("the biases are not counted: 9 * D per block (qkv 3D, proj D, fc1 4D, fc2 D), D for the patch "
              "embedding and num_classes for the head", "block_biases", "patch_bias", "head_bias"),
    _miscount("neither the LayerNorms nor the biases are counted; 12 * D**2 per block is only the weight matrices",
              "block_norms", "norm", "block_biases", "patch_bias", "head_bias"),
    _miscount("the classification head (num_classes * D + num_classes) is not counted", "head_weight", "head_bias"),
    _miscount("the patch embedding has P * P * D weights; each patch has 3 colour channels: 3 * P * P * D "
              "(+ D biases)", extra=lambda D, L, P, K, img: -2 * P * P * D),
    _miscount("the qkv biases are not counted: ViT's qkv Linear has a bias (qkv_bias=True), 3 * D per block",
              extra=lambda D, L, P, K, img: -3 * L * D),
    _miscount("the MLP's hidden layer is counted D wide; it is 4 * D (MLP ratio 4): fc1 4 * D * D + 4 * D, "
              "fc2 4 * D * D + D", extra=lambda D, L, P, K, img: -L * (6 * D * D + 3 * D)),
    _miscount("each LayerNorm is counted as D parameters; it has a gain and a bias, 2 * D",
              extra=lambda D, L, P, K, img: -(2 * L + 1) * D),
    _miscount("N = img_size / patch_size counts the patches along one side; an image has (img_size / patch_size)**2",
              "pos_embed", extra=lambda D, L, P, K, img: (1 + img // P) * D),
)  # fmt: skip


def vit_param_count(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(embed_dim, depth, patch_size, num_classes, img_size) -> int``: every parameter of a ViT.

    3 channels, MLP ratio 4, qkv bias, a class token, ``(1 + N, D)`` position embedding, final
    LayerNorm, linear head: ``fn(768, 12, 16, 1000, 224) == 86_567_656`` (ViT-B/16).

    Shape: ints -> int.
    """
    configs = vary(
        _CONFIGS, lambda r: (r.randint(8, 1024), r.randint(1, 24), 16, r.randint(2, 999), 16 * r.randint(1, 24))
    )
    cases = [Case(f"embed_dim={D}, depth={L}, patch_size={P}, num_classes={K}, img_size={img}",
                  (D, L, P, K, img)) for D, L, P, K, img in configs]  # fmt: skip
    return run_check("vit_param_count", fn, cases, _count, known_wrong=_COUNT_WRONGS, expect=WHOLE)


def _sandwich(x: Tensor, b: Block) -> Tensor:
    x = b.norm1(x + b.attn(b.norm1(x)))
    return b.norm2(x + b.mlp(b.norm2(x)))


_POST_NORM_SLIPS = turned(_post_norm, (
    ("no residual connections: LN(f(x)) replaces the tokens; add the sub-layer's input before the LayerNorm, "
     "LN(x + f(x))", None, {"residual": (0, 0)}),
    ("the attention sub-layer has no residual: x = norm1(x + attn(x))", None, {"residual": (0, 1)}),
    ("the MLP sub-layer has no residual: norm2(x + mlp(x))", None, {"residual": (1, 0)}),
    ("norm1 and norm2 are swapped: norm1 follows the attention sub-layer, norm2 the MLP", None, {"norms": "21"}),
    ("norm1 is used after the MLP too; each sub-layer has its own LayerNorm: norm2(x + mlp(x))", None,
     {"norms": "11"}),
    ("the LayerNorm after the attention sub-layer (norm1) is missing", None, {"norms": "-2"}),
    ("the LayerNorm after the MLP sub-layer (norm2) is missing", None, {"norms": "1-"}),
    ("the LayerNorms have no weight and bias (F.layer_norm(x, shape) alone); call block.norm1 and block.norm2, "
     "whose gain and bias are learned", None, {"norms": "pp"}),
))  # fmt: skip
_POST_NORM_WRONGS = (
    KnownWrong(_pre_norm,
               "this is ViT's pre-norm block, x + f(LN(x)); the post-norm block of the original Transformer normalises "
               "after the residual add: x = norm1(x + attn(x)), then x = norm2(x + mlp(x))"),
    KnownWrong(_norm_on_branch,
               "the LayerNorm is applied to the sub-layer's output only, x + LN(f(x)); post-norm normalises the sum: "
               "LN(x + f(x))"),
    *_POST_NORM_SLIPS,
    KnownWrong(lambda x, b: b.norm2(b.norm1(x + b.attn(x)) + b.mlp(x)),
               "the MLP reads the block's input; it reads the output of the attention sub-layer: "
               "x = norm1(x + attn(x)), then x = norm2(x + mlp(x))"),
    KnownWrong(_sandwich,
               "each sub-layer also reads a normalised copy, LN(x + f(LN(x))); in the post-norm block the sub-layer "
               "reads x itself: LN(x + f(x))"),
)  # fmt: skip


def post_norm_block(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, block) -> out``: the original Transformer's post-norm block from ``block``'s sub-modules.

    ``x = block.norm1(x + block.attn(x))``, then ``block.norm2(x + block.mlp(x))``.

    Shape: x (B, N, C), block Block(C, num_heads=h) -> (B, N, C).
    """
    cases = []
    for seed, (B, N, C, h) in enumerate(((1, 5, 8, 2), (2, 10, 16, 4), (2, 17, 24, 3))):
        x = 2 * torch.randn(B, N, C, generator=generator(200 + seed)) + 0.5
        cases.append(Case(f"x {shape(x)}, num_heads={h}", (x, _block(C, h, 10 + seed))))
    return run_check("post_norm_block", fn, cases, _post_norm, known_wrong=_POST_NORM_WRONGS)
