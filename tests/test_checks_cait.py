"""vitlab.checks.class_attention against a student's own multi-head code (view/permute).

The right answers, the known mistakes written with test_checks.py's ``class_attention_ok``,
``layer_scale_init`` and the class-attention definition are tested in test_checks.py; here
the mistakes a student makes when splitting and merging the heads by hand are named.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

import vitlab.checks
from conftest import assert_named_mistake, assert_passes, run  # run: one printed line and a CheckResult
from vitlab.checks.cait import _class_attention_tokens


def heads_by_hand(
    x: Tensor, wq: Tensor, wk: Tensor, wv: Tensor, num_heads: int, *, split: str = "h d", merge: str = "h d",
    softmax: str = "torch", scale: bool = True,
) -> Tensor:  # fmt: skip
    """Class-attention with view/permute; ``split``/``merge`` the heads' channel order, ``softmax``
    "torch", "naive" (exp / sum) or "queries" (dim=-2), ``scale`` False: no 1/sqrt(d)."""
    B, T, C = x.shape
    h, d = num_heads, C // num_heads

    def heads(t: Tensor) -> Tensor:  # (B, n, C) -> (B, h, n, d)
        n = t.shape[1]
        return t.view(B, n, h, d).transpose(1, 2) if split == "h d" else t.view(B, n, d, h).permute(0, 3, 1, 2)

    q, k, v = heads(x[:, :1] @ wq.T), heads(x @ wk.T), heads(x @ wv.T)
    logits = q @ k.transpose(-2, -1) * (d**-0.5 if scale else 1.0)  # (B, h, 1, T)
    if softmax == "naive":
        weights = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)
    else:
        weights = logits.softmax(dim=-2 if softmax == "queries" else -1)
    out = weights @ v  # (B, h, 1, d)
    return out.transpose(1, 2).reshape(B, 1, C) if merge == "h d" else out.permute(0, 2, 3, 1).reshape(B, 1, C)


W = pytest.param  # (check, student function, words, pitfall)
WRONG = [
    W("class_attention", lambda *a: heads_by_hand(*a, scale=False), "not scaled", None, id="unscaled"),
    W("class_attention", lambda *a: heads_by_hand(*a, merge="d h"), "the heads are merged (d h)", None,
      id="merged_d_h"),
    W("class_attention", lambda *a: heads_by_hand(*a, split="d h", merge="d h"), "split into heads (d h), so head g",
      None, id="split_and_merged_d_h"),
    W("class_attention", lambda *a: heads_by_hand(*a, split="d h"), "split into heads (d h) but merged (h d)", None,
      id="split_d_h"),
    W("class_attention", lambda *a: heads_by_hand(*a, softmax="queries"), "with one query every weight is 1", None,
      id="softmax_over_queries"),
    W("class_attention", lambda *a: heads_by_hand(*a, softmax="naive"), "exp(x) / sum(exp(x)), which overflows", None,
      id="naive_softmax"),
]  # fmt: skip


def test_heads_by_hand_is_right(capsys: pytest.CaptureFixture[str]) -> None:
    assert_passes(capsys, "class_attention", heads_by_hand)


def test_a_softmax_that_overflows_fails_on_the_large_logit_case_only(capsys: pytest.CaptureFixture[str]) -> None:
    result, _ = run(capsys, "class_attention", lambda *a: heads_by_hand(*a, softmax="naive"))
    assert result.cases_total is not None and result.cases_passed == result.cases_total - 1
    assert result.case is not None and "large logits" in result.case


@pytest.mark.parametrize(("name", "fn", "words", "pitfall"), WRONG)
def test_each_known_mistake_is_named(
    capsys: pytest.CaptureFixture[str], name: str, fn: Any, words: str, pitfall: int | None
) -> None:
    assert_named_mistake(capsys, name, fn, words, pitfall)


# --- class_attention_tokens: class-attention with several class tokens (transfer exercise) ---


def tokens_right(x: Tensor, wq: Tensor, wk: Tensor, wv: Tensor, h: int, n: int) -> Tensor:
    """Written independently: a loop over the heads and plain matrix products."""
    B, T, C = x.shape
    d = C // h
    q, k, v = x[:, :n] @ wq.T, x @ wk.T, x @ wv.T
    outs = []
    for g in range(h):
        sl = slice(g * d, (g + 1) * d)
        w = torch.softmax(q[..., sl] @ k[..., sl].transpose(1, 2) / d**0.5, dim=-1)  # (B, n, T)
        outs.append(w @ v[..., sl])
    return torch.cat(outs, dim=-1)


def tokens_by_module(x: Tensor, wq: Tensor, wk: Tensor, wv: Tensor, h: int, n: int) -> Tensor:
    """Another style: PyTorch's fused F.scaled_dot_product_attention."""
    split = lambda t: t.unflatten(-1, (h, -1)).transpose(1, 2)  # noqa: E731
    out = torch.nn.functional.scaled_dot_product_attention(split(x[:, :n] @ wq.T), split(x @ wk.T), split(x @ wv.T))
    return out.transpose(1, 2).flatten(2)


def tokens_wrong(**knobs: Any):
    return lambda *args: _class_attention_tokens(*args, **knobs)


TOKENS_WRONG = {
    "one query": (tokens_wrong(queries=1), "only the first class token asks"),
    "keys from 1": (tokens_wrong(keys_from=1), "leave out the first class token"),
    "no class keys": (
        lambda x, wq, wk, wv, h, n: _class_attention_tokens(x, wq, wk, wv, h, n, keys_from=n),
        "leave out the class tokens",
    ),
    "softmax over queries": (tokens_wrong(softmax_dim=-2), "over the queries"),
    "scale by C": (tokens_wrong(scale_by_dim=True), "C**-0.5"),
}


@pytest.mark.parametrize("fn", [tokens_right, tokens_by_module], ids=["loop", "sdpa"])
def test_class_attention_tokens_right_answers_pass(fn, capsys) -> None:
    result = vitlab.checks.class_attention_tokens(fn)
    assert result.passed, capsys.readouterr().out


@pytest.mark.parametrize("name", list(TOKENS_WRONG))
def test_class_attention_tokens_wrong_answers_are_named(name: str) -> None:
    fn, words = TOKENS_WRONG[name]
    result = vitlab.checks.class_attention_tokens(fn)
    assert not result.passed
    assert words in result.message, result.message


def test_class_attention_tokens_random_answer_and_stub_fail() -> None:
    assert not vitlab.checks.class_attention_tokens(lambda x, wq, wk, wv, h, n: torch.randn_like(x[:, :n])).passed

    def stub(x, wq, wk, wv, num_heads, num_queries):
        raise NotImplementedError

    assert vitlab.checks.class_attention_tokens(stub).status == "not implemented"
