"""vitlab.checks.encoder_block_macs, attention_macs and fusion_macs: a right answer passes, each known
mistake is named, and the references are what vitlab.family.count_macs measures.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import vitlab
from conftest import assert_named_mistake, assert_passes, run  # run: one printed line and a CheckResult
from vitlab.checks import family as family_checks
from vitlab.family import count_macs
from vitlab.layers import Block, explicit_attention

NAMES = ["encoder_block_macs", "attention_macs"]

# ---------------------------------------------------------------- right answers, written independently


def block_ok(tokens: int, dim: int, mlp_ratio: float) -> int:
    hidden = int(dim * mlp_ratio)
    linears = [(dim, 3 * dim), (dim, dim), (dim, hidden), (hidden, dim)]  # qkv, proj, fc1, fc2
    return sum(tokens * a * b for a, b in linears) + 2 * tokens * tokens * dim


def attention_ok(n_queries: int, n_keys: int, qk_dim: int, v_dim: int) -> int:
    return n_queries * n_keys * (qk_dim + v_dim)


SOLUTIONS: dict[str, Callable[..., Any]] = {"encoder_block_macs": block_ok, "attention_macs": attention_ok}

W = pytest.param  # (check, student function, words the message must contain)
WRONG = [
    W("encoder_block_macs", lambda n, d, r: n * (4 * d * d + 2 * d * int(d * r)), "only the Linear layers",
      id="no_attention_products"),
    W("encoder_block_macs", lambda n, d, r: n * (4 * d * d + 2 * d * int(d * r)) + n * n * d,
      "attn v is not", id="no_attn_v"),
    W("encoder_block_macs", lambda n, d, r: 2 * block_ok(n, d, r), "FLOPs", id="flops"),
    W("encoder_block_macs", lambda n, d, r: block_ok(n, d, r) - n * d * d, "output projection", id="no_proj"),
    W("encoder_block_macs", lambda n, d, r: block_ok(n, d, r) - n * d * int(d * r), "MLP is counted once",
      id="one_mlp_layer"),
    W("attention_macs", lambda q, k, a, b: q * q * (a + b), "N_q x N_q", id="square_queries"),
    W("attention_macs", lambda q, k, a, b: k * k * (a + b), "N_k x N_k", id="square_keys"),
    W("attention_macs", lambda q, k, a, b: q * k * a, "only q k^T", id="only_qk"),
    W("attention_macs", lambda q, k, a, b: 2 * q * k * a, "key width", id="value_width"),
    W("attention_macs", lambda q, k, a, b: 2 * attention_ok(q, k, a, b), "FLOPs", id="flops"),
]  # fmt: skip

# ---------------------------------------------------------------- the references are what count_macs measures


@pytest.mark.parametrize(("tokens", "dim", "ratio"), family_checks._BLOCKS)
def test_block_reference_is_count_macs_of_a_vitlab_block(tokens: int, dim: int, ratio: float) -> None:
    with torch.device("meta"):  # shapes only: no memory, no arithmetic
        block = Block(dim, num_heads=4, mlp_ratio=ratio)  # the head count does not change the MACs

    class Wrap(nn.Module):  # count_macs takes an image-shaped input size; feed (1, N, D) through it
        def __init__(self) -> None:
            super().__init__()
            self.block = block

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.block(x[0])

    assert count_macs(Wrap(), (1, 1, tokens, dim)) == family_checks._block_macs(tokens, dim, ratio)


@pytest.mark.parametrize(("n_q", "n_k", "qk", "v"), family_checks._ATTENTION)
def test_attention_reference_is_what_the_flop_counter_measures(n_q: int, n_k: int, qk: int, v: int) -> None:
    heads = 4
    q = torch.empty(1, heads, n_q, qk // heads, device="meta")
    k = torch.empty(1, heads, n_k, qk // heads, device="meta")
    values = torch.empty(1, heads, n_k, v // heads, device="meta")
    counter = FlopCounterMode(display=False)
    with counter:
        explicit_attention(q, k, values, scale=1.0)
    assert counter.get_total_flops() // 2 == family_checks._attention_macs(n_q, n_k, qk, v)


# ---------------------------------------------------------------- both checks
# (Exported and documented: test_checks.py's test_every_check_is_exported_documented_and_tested.)

RIGHT = [
    *((name, fn) for name, fn in SOLUTIONS.items()),
    ("encoder_block_macs", lambda n, d, r: float(n * (4 + 2 * r) * d * d + 2 * n * n * d)),  # a whole float
]


@pytest.mark.parametrize(("name", "fn"), RIGHT, ids=["block", "attention", "block_float"])
def test_right_answers_pass(capsys: pytest.CaptureFixture[str], name: str, fn: Callable[..., Any]) -> None:
    assert_passes(capsys, name, fn)


@pytest.mark.parametrize(("name", "fn", "words"), WRONG)
def test_known_wrong_answer_is_named(
    capsys: pytest.CaptureFixture[str], name: str, fn: Callable[..., Any], words: str
) -> None:
    assert_named_mistake(capsys, name, fn, words)


def not_implemented(*args: Any) -> Any:
    raise NotImplementedError


BROKEN = [  # (student function, status, how the printed line ends)
    (not_implemented, "not implemented", ": not implemented yet"),
    (lambda *args: 1 / 0, "failed", "]: raised ZeroDivisionError: division by zero"),
    (lambda *args: None, "failed", "]: returned None (is a `return` missing?)"),
    (lambda *args: args[0] + 0.5, "failed", "expected a whole number"),
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("fn", "status", "ending"), BROKEN, ids=["stub", "crash", "no_return", "fraction"])
def test_broken_answers_fail_without_raising(
    capsys: pytest.CaptureFixture[str], name: str, fn: Callable[..., Any], status: str, ending: str
) -> None:
    result, line = run(capsys, name, fn)
    assert result.status == status and not result
    assert (line == f"TODO {name}{ending}") if status == "not implemented" else (ending in line), line


def test_unexplained_wrong_answers_say_what_differs(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, "attention_macs", lambda *a: attention_ok(*a) + 1)
    assert not result and re.search(r"\[case 1/6: .+\]: expected \S+, got \S+$", line), line


# ---------------------------------------------------------------- fusion_macs (CrossViT chapter)

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
    model = vitlab.create_model(name, num_encoders=1).eval()
    vitlab.set_fused_attention(model, False)  # the counter has no formula for the fused CPU kernel
    block = model.blocks[0]
    block.blocks = nn.ModuleList([nn.Identity(), nn.Identity()])  # the fusion alone
    (c_s, c_l), (n_s, n_l) = model.config.embed_dim, model.config.num_patches
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        block([torch.zeros(1, 1 + n_s, c_s), torch.zeros(1, 1 + n_l, c_l)])
    assert counter.get_total_flops() // 2 == family_checks._fusion_macs(n_s, n_l, c_s, c_l)
