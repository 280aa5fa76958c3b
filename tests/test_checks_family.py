"""vitlab.checks.encoder_block_macs and attention_macs: a right answer passes, each known
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
