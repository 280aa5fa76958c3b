"""vitlab.checks.encoder_block and vit_param_count: a right answer passes, each known mistake is named.

The "student" functions are written independently of the checks' references (other ops, other
groupings), and the references themselves are compared with vitlab's Block and ViT.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import vitlab
from conftest import assert_named_mistake, assert_passes, run  # run: one printed line and a CheckResult
from vitlab.checks import encoder as encoder_checks
from vitlab.layers import Block
from vitlab.models.vit import ViT, ViTConfig

NAMES = ["encoder_block", "vit_param_count", "post_norm_block"]

# ---------------------------------------------------------------- right answers


def layer_norm(x: Tensor, norm: torch.nn.LayerNorm) -> Tensor:
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def block_ok(x: Tensor, block: Block) -> Tensor:
    attended = block.attn(layer_norm(x, block.norm1))
    x = attended + x
    return block.mlp(layer_norm(x, block.norm2)) + x


def count_ok(embed_dim: int, depth: int, patch_size: int, num_classes: int, img_size: int) -> int:
    D, tokens = embed_dim, 1 + (img_size // patch_size) ** 2
    embedding = (3 * patch_size**2 + 1) * D + D + tokens * D  # conv, cls token, position embedding
    per_block = (3 * D * D + 3 * D) + (D * D + D) + (4 * D * D + 4 * D) + (4 * D * D + D) + 2 * 2 * D
    return embedding + depth * per_block + 2 * D + num_classes * (D + 1)


def post_norm_ok(x: Tensor, block: Block) -> Tensor:
    x = layer_norm(block.attn(x) + x, block.norm1)
    return layer_norm(block.mlp(x) + x, block.norm2)


SOLUTIONS: dict[str, Callable[..., Any]] = {
    "encoder_block": block_ok,
    "vit_param_count": count_ok,
    "post_norm_block": post_norm_ok,
}

# ---------------------------------------------------------------- known wrong answers


def post_norm(x: Tensor, b: Block) -> Tensor:
    x = b.norm1(b.attn(x) + x)  # the original Transformer: LN after the residual add
    return b.norm2(b.mlp(x) + x)


def attention_by_hand(x: Tensor, b: Block, *, naive: bool = False) -> Tensor:
    """The block with its attention written out from block.attn's qkv and proj; ``naive``: exp / sum softmax."""
    B, N, C = x.shape
    h = b.attn.num_heads
    q, k, v = b.attn.qkv(layer_norm(x, b.norm1)).view(B, N, 3, h, C // h).permute(2, 0, 3, 1, 4)
    logits = q @ k.transpose(-2, -1) * (C // h) ** -0.5  # (B, h, N, N)
    weights = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True) if naive else logits.softmax(-1)
    x = x + b.attn.proj((weights @ v).transpose(1, 2).reshape(B, N, C))
    return x + b.mlp(layer_norm(x, b.norm2))


def normalised_residual(x: Tensor, b: Block) -> Tensor:
    x = b.norm1(x)  # x is overwritten by its normalised copy, which then also feeds the residual
    x = x + b.attn(x)
    x = b.norm2(x)
    return x + b.mlp(x)


def without(*parts: str) -> Callable[..., int]:
    """count_ok minus some of its parts."""

    def fn(D: int, L: int, P: int, K: int, img: int) -> int:
        N = (img // P) ** 2
        sizes = {
            "cls": D, "pos": (1 + N) * D, "norms": L * 4 * D + 2 * D, "final_norm": 2 * D,
            "biases": L * 9 * D + D + K, "head": K * D + K,
        }  # fmt: skip
        return count_ok(D, L, P, K, img) - sum(sizes[p] for p in parts)

    return fn


W = pytest.param  # (check, student function, words the message must contain, pitfall)
WRONG = [
    W("encoder_block", post_norm, "post-norm, LN(x + f(x))", None, id="post_norm"),
    W("encoder_block", lambda x, b: b.mlp(b.norm2(b.attn(b.norm1(x)))), "no residual connections", None,
      id="no_residual"),
    W("encoder_block", lambda x, b: (y := b.attn(b.norm1(x))) + b.mlp(b.norm2(y)), "attention sub-layer has no "
      "residual", None, id="no_attn_residual"),
    W("encoder_block", lambda x, b: b.mlp(b.norm2(x + b.attn(b.norm1(x)))), "MLP sub-layer has no residual", None,
      id="no_mlp_residual"),
    W("encoder_block", normalised_residual, "adds the normalised tokens", None, id="normalised_residual"),
    W("encoder_block", lambda x, b: (y := x + b.norm1(b.attn(x))) + b.norm2(b.mlp(y)), "applied to the sub-layer's "
      "output", None, id="norm_on_branch"),
    W("encoder_block", lambda x, b: x + b.attn(b.norm1(x)) + b.mlp(b.norm2(x)), "parallel block", None,
      id="parallel"),
    W("encoder_block", lambda x, b: (y := x + b.attn(b.norm1(x))) + b.mlp(b.norm1(y)), "norm1 is used before the MLP",
      None, id="norm1_twice"),
    W("encoder_block", lambda x, b: attention_by_hand(x, b, naive=True), "exp(x) / sum(exp(x)), which overflows", None,
      id="naive_softmax"),
    W("vit_param_count", without("cls", "pos"), "torchsummary total", 6, id="torchsummary"),
    W("vit_param_count", without("cls"), "class token (D)", None, id="no_cls_token"),
    W("vit_param_count", lambda D, L, P, K, img: count_ok(D, L, P, K, img) - D, "(1 + N) * D, not N * D", None,
      id="pos_embed_rows"),
    W("vit_param_count", without("norms"), "LayerNorms are not counted", None, id="no_layernorm"),
    W("vit_param_count", without("final_norm"), "final LayerNorm", None, id="no_final_norm"),
    W("vit_param_count", without("biases"), "biases are not counted", None, id="no_biases"),
    W("vit_param_count", without("norms", "biases"), "neither the LayerNorms nor the biases", None, id="weights_only"),
    W("vit_param_count", without("head"), "classification head", None, id="no_head"),
    W("vit_param_count", lambda D, L, P, K, img: count_ok(D, L, P, K, img) - 2 * P * P * D, "3 colour channels", None,
      id="one_channel"),
    W("vit_param_count", lambda D, L, P, K, img: count_ok(D, L, P, K, img) - ((img // P) ** 2 - img // P) * D,
      "counts the patches along one side", None, id="patches_one_side"),
    W("post_norm_block", block_ok, "ViT's pre-norm block", None, id="post_norm_is_not_pre_norm"),
    W("post_norm_block", lambda x, b: (y := x + b.norm1(b.attn(x))) + b.norm2(b.mlp(y)), "sub-layer's output only",
      None, id="post_norm_on_branch"),
    W("post_norm_block", lambda x, b: b.norm2(b.mlp(b.norm1(b.attn(x)))), "no residual connections", None,
      id="post_norm_no_residual"),
    W("post_norm_block", lambda x, b: b.norm2(b.norm1(b.attn(x) + x) + b.mlp(x)), "MLP reads the block's input",
      None, id="post_norm_mlp_reads_input"),
    W("post_norm_block", lambda x, b: b.norm1((y := b.norm2(b.attn(x) + x)) + b.mlp(y)), "swapped", None,
      id="post_norm_swapped"),
    W("post_norm_block", lambda x, b: b.norm2((y := b.norm1(x + b.attn(b.norm1(x)))) + b.mlp(b.norm2(y))),
      "also reads a normalised copy", None, id="post_norm_sandwich"),
    W("post_norm_block", lambda x, b: b.norm2((y := b.norm1(b.attn(x))) + b.mlp(y)), "attention sub-layer has no "
      "residual", None, id="post_norm_no_attn_residual"),
    W("post_norm_block", lambda x, b: b.norm2(b.mlp(b.norm1(x + b.attn(x)))), "MLP sub-layer has no residual", None,
      id="post_norm_no_mlp_residual"),
    W("post_norm_block", lambda x, b: b.norm1((y := b.norm1(x + b.attn(x))) + b.mlp(y)), "norm1 is used after the "
      "MLP too", None, id="post_norm_norm1_twice"),
    W("post_norm_block", lambda x, b: b.norm2((y := x + b.attn(x)) + b.mlp(y)), "(norm1) is missing", None,
      id="post_norm_no_norm1"),
    W("post_norm_block", lambda x, b: (y := b.norm1(x + b.attn(x))) + b.mlp(y), "(norm2) is missing", None,
      id="post_norm_no_norm2"),
    W("post_norm_block", lambda x, b: F.layer_norm((y := F.layer_norm(x + b.attn(x), x.shape[-1:])) + b.mlp(y),
      x.shape[-1:]), "no weight and bias", None, id="post_norm_no_affine"),
    W("vit_param_count", lambda D, L, P, K, img: count_ok(D, L, P, K, img) - 3 * L * D, "qkv biases", None,
      id="no_qkv_bias"),
    W("vit_param_count", lambda D, L, P, K, img: count_ok(D, L, P, K, img) - (2 * L + 1) * D, "a gain and a bias",
      None, id="layernorm_gain_only"),
    W("vit_param_count", lambda D, L, P, K, img: count_ok(D, L, P, K, img) - L * (6 * D * D + 3 * D), "hidden layer "
      "is counted D wide", None, id="mlp_ratio_1"),
]  # fmt: skip


# ---------------------------------------------------------------- the references are vitlab's


def test_block_reference_is_vitlab_block() -> None:
    for seed, (C, h) in enumerate(((8, 2), (24, 3))):
        block = encoder_checks._block(C, h, seed)
        x = torch.randn(2, 7, C, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            torch.testing.assert_close(encoder_checks._pre_norm(x, block), Block.forward(block, x))


def test_post_norm_reference_is_vaswani_post_norm() -> None:
    """The reference written with torch.nn.functional, independently of the check's code."""
    block = encoder_checks._block(16, 4, 3)
    x = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(encoder_checks._post_norm(x, block), post_norm_ok(x, block))
        assert not torch.allclose(encoder_checks._post_norm(x, block), Block.forward(block, x))


def test_a_random_post_norm_answer_fails(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, "post_norm_block", lambda x, b: torch.randn(x.shape, generator=torch.Generator()))
    assert not result and "values differ from the reference" in line


def test_count_reference_is_vitlab_count() -> None:
    for D, L, P, K, img in encoder_checks._CONFIGS:
        with torch.device("meta"):  # no memory, no init cost: ViT-L/16 has 304 M parameters
            heads = max(D // 64, 1)
            config = ViTConfig(embed_dim=D, depth=L, patch_size=P, num_classes=K, img_size=img, num_heads=heads)
            model = ViT(config)
        assert encoder_checks._count(D, L, P, K, img) == vitlab.count_parameters(model)
    assert encoder_checks._count(768, 12, 16, 1000, 224) == 86_567_656  # ViT-B/16, book/reference_numbers.md
    assert encoder_checks._count(1024, 24, 16, 1000, 224) == 304_326_632  # timm vit_large_patch16_224


# ---------------------------------------------------------------- both checks


@pytest.mark.parametrize("name", NAMES)
def test_correct_solution_passes(capsys: pytest.CaptureFixture[str], name: str) -> None:
    assert_passes(capsys, name, SOLUTIONS[name])


@pytest.mark.parametrize(("name", "fn", "words", "pitfall"), WRONG)
def test_known_wrong_answer_fails_with_its_message(
    capsys: pytest.CaptureFixture[str], name: str, fn: Callable[..., Any], words: str, pitfall: int | None
) -> None:
    assert_named_mistake(capsys, name, fn, words, pitfall)


def test_attention_by_hand_passes_and_its_naive_softmax_fails_on_large_logits_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert_passes(capsys, "encoder_block", attention_by_hand)
    result, line = run(capsys, "encoder_block", lambda x, b: attention_by_hand(x, b, naive=True))
    assert result.cases_total is not None and result.cases_passed == result.cases_total - 1
    assert result.case is not None and "large attention logits" in result.case and "overflows" in line


def test_calling_the_block_itself_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, "encoder_block", lambda x, block: block(x))
    assert not result and "raised RuntimeError" in line and "not with block(x)" in line


@pytest.mark.parametrize("name", NAMES)
def test_crash_wrong_shape_and_missing_return_fail(capsys: pytest.CaptureFixture[str], name: str) -> None:
    result, line = run(capsys, name, lambda *args: 1 / 0)
    assert not result and re.fullmatch(rf"FAIL {name} \[case 1/\d+: .+\]: raised ZeroDivisionError: division by zero",
                                       line)  # fmt: skip
    result, line = run(capsys, name, lambda *args: torch.zeros(3, 1))
    assert not result and line.endswith(
        "expected shape (1, 5, 8), got (3, 1)"
        if name in ("encoder_block", "post_norm_block")
        else "got a tensor of shape (3, 1)"
    )
    result, line = run(capsys, name, lambda *args: None)
    assert not result and line.endswith("returned None (is a `return` missing?)")


def test_unexplained_wrong_answers_say_what_differs(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, "encoder_block", lambda x, b: 2 * block_ok(x, b))
    assert not result and "values differ from the reference: max error" in line
    result, line = run(capsys, "vit_param_count", lambda *config: count_ok(*config) + 1)
    assert not result and re.search(r"\[case 1/6: .+\]: expected \S+, got \S+$", line), line


def test_checks_leave_the_global_rng_alone(capsys: pytest.CaptureFixture[str]) -> None:
    state = torch.random.get_rng_state()
    run(capsys, "encoder_block", block_ok)
    assert torch.equal(state, torch.random.get_rng_state())
