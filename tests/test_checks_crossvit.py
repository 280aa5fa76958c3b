"""vitlab.checks.cross_attention_fusion: a right answer passes, each known mistake is named,
and the check's definition is what vitlab's CrossViT computes in its multi-scale block.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

import vitlab
from conftest import assert_named_mistake, assert_passes, run  # run: one printed line and a CheckResult

NAME = "cross_attention_fusion"

# ---------------------------------------------------------------- a right answer, written independently


def fusion_ok(
    x: Tensor, other: Tensor, f: nn.Module, g: nn.Module, wq: Tensor, wk: Tensor, wv: Tensor, wo: Tensor,
    num_heads: int, *, keys: str = "right", residual: str = "right", use_g: bool = True, use_wo: bool = True,
    heads: str = "h d", merge: str = "h d", scale: str = "head", softmax: str = "torch",
) -> Tensor:  # fmt: skip
    """Plain matrix products and view/transpose (the check uses einops and F.linear). The keywords make
    known mistakes: ``heads``/``merge`` the channel order of the split and of the merge, ``scale`` "width"
    (C_j**-0.5), ``softmax`` "naive" (exp / sum) or "queries" (dim=2)."""
    B, C = x.shape[0], other.shape[-1]
    d = C // num_heads
    t = f(x[:, 0:1])  # (B, 1, C)
    z = {
        "right": lambda: torch.cat((t, other[:, 1:]), dim=1),
        "other_only": lambda: other[:, 1:],
        "other_cls": lambda: other,
        "own": lambda: torch.cat((t, x[:, 1:]), dim=1),
    }[keys]()
    T = z.shape[1]

    def split(y: Tensor, n: int) -> Tensor:  # (B, n, C) -> (B, h, n, d)
        if heads == "d h":
            return y.view(B, n, d, num_heads).permute(0, 3, 1, 2)
        return y.view(B, n, num_heads, d).transpose(1, 2)

    q, k, v = split(t @ wq.T, 1), split(z @ wk.T, T), split(z @ wv.T, T)
    logits = q @ k.transpose(2, 3) / (C**0.5 if scale == "width" else d**0.5)  # (B, h, 1, T)
    if softmax == "naive":
        weights = torch.exp(logits) / torch.exp(logits).sum(3, keepdim=True)
    else:
        weights = torch.softmax(logits, dim=2 if softmax == "queries" else 3)
    if merge == "d h":
        out = (weights @ v).permute(0, 2, 3, 1).reshape(B, 1, C)
    else:
        out = (weights @ v).transpose(1, 2).reshape(B, 1, C)
    if use_wo:
        out = out @ wo.T
    back = g if use_g else (lambda y: y)
    if residual == "right":
        new = back(t + out)
    elif residual == "after_g":
        new = x[:, 0:1] + back(out)
    else:
        new = back(out)
    return torch.cat((new, x[:, 1:]), dim=1)


def fusion_with_einsum(x: Tensor, other: Tensor, f: Any, g: Any, wq: Tensor, wk: Tensor, wv: Tensor,
                       wo: Tensor, num_heads: int) -> Tensor:  # fmt: skip
    """A second style: einsum, heads kept as an explicit axis."""
    t = f(x[:, :1])
    z = torch.cat([t, other[:, 1:]], 1)
    h, C = num_heads, other.shape[-1]
    q = torch.einsum("bnc,oc->bno", t, wq).unflatten(-1, (h, C // h))  # (B, 1, h, d)
    k = torch.einsum("bnc,oc->bno", z, wk).unflatten(-1, (h, C // h))
    v = torch.einsum("bnc,oc->bno", z, wv).unflatten(-1, (h, C // h))
    logits = torch.einsum("bqhd,bkhd->bhqk", q, k) * (C // h) ** -0.5
    y = torch.einsum("bhqk,bkhd->bqhd", logits.softmax(-1), v).flatten(2)  # (B, 1, C)
    return torch.cat([g(t + torch.einsum("bnc,oc->bno", y, wo)), x[:, 1:]], 1)


@pytest.mark.parametrize("solution", [fusion_ok, fusion_with_einsum], ids=["matmul", "einsum"])
def test_a_right_answer_passes(capsys: pytest.CaptureFixture[str], solution: Any) -> None:
    assert_passes(capsys, NAME, solution)


W = pytest.param  # (student function, words the message must contain)
WRONG = [
    W(lambda *a: fusion_ok(*a, use_g=False), "g is missing", id="no_g"),
    W(lambda *a: fusion_ok(*a, keys="own"), "query's own branch", id="own_branch"),
    W(lambda *a: fusion_ok(*a, keys="other_only"), "left out of the keys", id="query_not_a_key"),
    W(lambda *a: fusion_ok(*a, keys="other_cls"), "other branch's own cls", id="other_cls_as_key"),
    W(lambda *a: fusion_ok(*a, residual="after_g"), "residual is added after g", id="residual_after_g"),
    W(lambda *a: fusion_ok(*a, residual="none"), "residual is missing", id="no_residual"),
    W(lambda *a: fusion_ok(*a, use_wo=False), "output projection wo is missing", id="no_wo"),
    W(lambda x, o, f, g, wq, wk, wv, wo, h: fusion_ok(x, o, f, g, wq.T, wk.T, wv.T, wo.T, h), "transposed",
      id="transposed"),
    W(lambda *a: fusion_ok(*a, scale="width"), "scaled by C_j**-0.5, the whole width", id="scale_by_width"),
    W(lambda *a: fusion_ok(*a, merge="d h"), "the heads are merged (d h)", id="merged_d_h"),
    W(lambda *a: fusion_ok(*a, heads="d h", merge="d h"), "split into heads (d h), so head g",
      id="split_and_merged_d_h"),
    W(lambda *a: fusion_ok(*a, heads="d h"), "split into heads (d h) but merged (h d)", id="split_d_h"),
    W(lambda *a: fusion_ok(*a, softmax="queries"), "with one query every weight is 1", id="softmax_over_queries"),
    W(lambda *a: fusion_ok(*a, softmax="naive"), "exp(x) / sum(exp(x)), which overflows", id="naive_softmax"),
]  # fmt: skip


@pytest.mark.parametrize(("fn", "words"), WRONG)
def test_each_known_mistake_is_named(capsys: pytest.CaptureFixture[str], fn: Any, words: str) -> None:
    assert_named_mistake(capsys, NAME, fn, words)


def test_a_softmax_that_overflows_fails_on_the_large_logit_case_only(capsys: pytest.CaptureFixture[str]) -> None:
    result, _ = run(capsys, NAME, lambda *a: fusion_ok(*a, softmax="naive"))
    assert result.cases_total is not None and result.cases_passed == result.cases_total - 1
    assert result.case is not None and "large logits" in result.case


def test_an_unknown_mistake_says_what_differs(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, NAME, lambda *a: fusion_ok(*a) * 1.5)
    assert not result and result.pitfall is None and "values differ" in line


def test_returning_only_the_cls_token_is_a_shape_error(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, NAME, lambda *a: fusion_ok(*a)[:, :1])
    assert not result and "expected shape" in line


def test_the_definition_is_what_the_multi_scale_block_computes() -> None:
    """With LayerNorm and biases neutral, fusion_ok gives vitlab's MultiScaleBlock outputs."""
    torch.manual_seed(0)
    block = vitlab.create_model("crossvit_tiny_240", num_encoders=1).eval().blocks[0]
    block.blocks = nn.ModuleList([nn.Identity(), nn.Identity()])  # the fusion alone
    xs = [torch.randn(2, 1 + 400, 96), torch.randn(2, 1 + 196, 192)]
    with torch.no_grad():
        for i in range(2):
            block.fusion[i].norm1 = nn.Identity()
            attn = block.fusion[i].attn
            for layer in (attn.q, attn.k, attn.v, attn.proj):
                if layer.bias is not None:
                    layer.bias.zero_()
        expected = block(xs)
        for i, j in ((0, 1), (1, 0)):
            attn = block.fusion[i].attn
            got = fusion_ok(xs[i], xs[j], block.projs[i], block.revert_projs[i], attn.q.weight, attn.k.weight,
                            attn.v.weight, attn.proj.weight, attn.num_heads)  # fmt: skip
            torch.testing.assert_close(got, expected[i], atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------- Exercise 1: the fusion's MACs

MACS = "fusion_macs"


def macs_by_layer(n_s: int, n_l: int, c_s: int, c_l: int) -> int:
    """Written independently: a list of (rows, inner, cols) products per direction."""
    total = 0
    for c_i, c_j, n_j in ((c_s, c_l, n_l), (c_l, c_s, n_s)):
        t = 1 + n_j  # keys: the projected cls token and branch j's patches
        products = [(1, c_i, c_j), (1, c_j, c_j), (t, c_j, c_j), (t, c_j, c_j), (1, c_j, t), (1, t, c_j)]
        products += [(1, c_j, c_j), (1, c_j, c_i)]  # output projection, g
        total += sum(a * b * c for a, b, c in products)
    return total


def macs_factored(n_s: int, n_l: int, c_s: int, c_l: int) -> int:
    """A second style: grouped by what each term depends on."""
    return 4 * c_s * c_l + sum(2 * c * c * (n + 2) + 2 * c * (n + 1) for n, c in ((n_l, c_l), (n_s, c_s)))


@pytest.mark.parametrize("solution", [macs_by_layer, macs_factored], ids=["by_layer", "factored"])
def test_fusion_macs_right_answers_pass(capsys: pytest.CaptureFixture[str], solution: Any) -> None:
    assert_passes(capsys, MACS, solution)


def _macs_without(n_s: int, n_l: int, c_s: int, c_l: int, **drop: bool) -> int:
    """macs_by_layer with parts left out or changed; the keywords make known mistakes."""
    total = 0
    for c_i, c_j, n_j, n_own in ((c_s, c_l, n_l, n_s), (c_l, c_s, n_s, n_l)):
        n = n_own if drop.get("swap") else n_j
        t = n if drop.get("no_query_key") else 1 + n
        queries = t if drop.get("all_queries") else 1
        total += 0 if drop.get("no_fg") else 2 * c_i * c_j
        total += queries * c_j * c_j + 2 * t * c_j * c_j + 2 * queries * t * c_j
        total += 0 if drop.get("no_wo") else queries * c_j * c_j
        if drop.get("one_direction"):
            break
    return 2 * total if drop.get("flops") else total


MACS_WRONG = [
    W(lambda *a: _macs_without(*a, flops=True), "these are FLOPs", id="flops"),
    W(lambda *a: _macs_without(*a, one_direction=True), "only one direction", id="one_direction"),
    W(lambda *a: _macs_without(*a, no_fg=True), "f and g are not counted", id="no_f_g"),
    W(lambda *a: _macs_without(*a, no_query_key=True), "left out of the keys", id="query_not_a_key"),
    W(lambda *a: _macs_without(*a, all_queries=True), "counted as a query", id="every_token_a_query"),
    W(lambda *a: _macs_without(*a, swap=True), "paired with the wrong branch", id="swapped_token_counts"),
    W(lambda *a: _macs_without(*a, no_wo=True), "output projection wo is missing", id="no_wo"),
]


@pytest.mark.parametrize(("fn", "words"), MACS_WRONG)
def test_fusion_macs_known_mistakes_are_named(capsys: pytest.CaptureFixture[str], fn: Any, words: str) -> None:
    assert_named_mistake(capsys, MACS, fn, words)


def test_fusion_macs_random_answer_fails_unnamed(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, MACS, lambda *a: 123_456_789 + sum(a))
    assert not result and result.pitfall is None and "known mistake" not in line


@pytest.mark.parametrize("name", ["crossvit_tiny_240", "crossvit_small_240", "crossvit_18_240"])
def test_fusion_macs_is_what_the_counter_measures(name: str) -> None:
    """The reference equals torch's FLOP counter (halved) on vitlab's fusion: f, attention, g."""
    from torch.utils.flop_counter import FlopCounterMode

    from vitlab.checks.crossvit import _fusion_macs

    model = vitlab.create_model(name, num_encoders=1).eval()
    vitlab.set_fused_attention(model, False)  # the counter has no formula for the fused CPU kernel
    block = model.blocks[0]
    block.blocks = nn.ModuleList([nn.Identity(), nn.Identity()])  # the fusion alone
    (c_s, c_l), (n_s, n_l) = model.config.embed_dim, model.config.num_patches
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        block([torch.zeros(1, 1 + n_s, c_s), torch.zeros(1, 1 + n_l, c_l)])
    assert counter.get_total_flops() // 2 == _fusion_macs(n_s, n_l, c_s, c_l)
