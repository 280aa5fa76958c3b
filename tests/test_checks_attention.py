"""vitlab.checks.qkv_weight_from_jax: a right answer passes, each known mistake is named.

The "student" functions are written independently of the check's reference (einops, other
orders of the same steps), and the reference itself is checked against what it means: a
fused nn.Linear that computes the JAX projections' q, k and v.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from conftest import assert_named_mistake, assert_passes, run  # run: one printed line and a CheckResult
from vitlab.checks import attention as attention_checks

NAME = "qkv_weight_from_jax"


def from_jax_ok(query: Tensor, key: Tensor, value: Tensor) -> Tensor:
    return rearrange(torch.stack([query, key, value]), "qkv C h d -> (qkv h d) C")


W = pytest.param  # (student function, words the message must contain, pitfall)
WRONG = [
    W(lambda q, k, v: rearrange(torch.stack([q, k, v]), "qkv C h d -> (h d qkv) C"), "interleaved feature by feature",
      5, id="h_d_qkv"),
    W(lambda q, k, v: rearrange(torch.stack([q, k, v]), "qkv C h d -> (h qkv d) C"), "interleaved head by head", None,
      id="h_qkv_d"),
    W(lambda q, k, v: rearrange(torch.stack([q, k, v]), "qkv C h d -> (qkv d h) C"), "ordered (d h)", None,
      id="d_h"),
    W(lambda q, k, v: rearrange(torch.stack([q, k, v]), "qkv C h d -> C (qkv h d)").reshape(-1, q.shape[0]),
      "instead of transposed", None, id="reshape_not_transpose"),
    W(lambda q, k, v: from_jax_ok(k, q, v), "order k, q, v", None, id="k_q_v"),
    W(lambda q, k, v: torch.stack([q, k, v]).reshape(3 * q.shape[0], q.shape[0]), "reshaped where it must be "
      "transposed", None, id="stacked_reshape"),
    W(lambda q, k, v: torch.cat([w.reshape(w.shape[0], -1) for w in (q, k, v)]), "reshaped where it must be "
      "transposed", None, id="cat_no_transpose"),
]  # fmt: skip


def test_reference_computes_the_jax_projections() -> None:
    """A Linear with the reference weight gives q, k, v in the (qkv h d) layout of vitlab's Attention."""
    C, h = 12, 3
    d = C // h
    g = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(C, h, d, generator=g) for _ in range(3))
    x = torch.randn(2, 5, C, generator=g)
    layer = nn.Linear(C, 3 * C, bias=False)
    with torch.no_grad():
        layer.weight.copy_(attention_checks._qkv_weight(query, key, value))
        q, k, v = rearrange(layer(x), "B N (qkv h d) -> qkv B N h d", qkv=3, h=h)
    for got, kernel in ((q, query), (k, key), (v, value)):
        torch.testing.assert_close(got, torch.einsum("bnc,chd->bnhd", x, kernel))


def test_correct_solution_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert_passes(capsys, NAME, from_jax_ok)


@pytest.mark.parametrize(("fn", "words", "pitfall"), WRONG)
def test_known_wrong_answer_fails_with_its_message(
    capsys: pytest.CaptureFixture[str], fn: Callable[..., Any], words: str, pitfall: int | None
) -> None:
    assert_named_mistake(capsys, NAME, fn, words, pitfall)


def test_a_random_answer_fails(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, NAME, lambda q, k, v: torch.randn(3 * q.shape[0], q.shape[0]))
    assert not result and "values differ from the reference" in line


def test_kernel_not_transposed_fails_on_its_shape(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, NAME, lambda q, k, v: from_jax_ok(q, k, v).T)
    assert not result and line.endswith("expected shape (24, 8), got (8, 24)"), line


# ---------------------------------------------------------------- padded_cross_attention

CROSS = "padded_cross_attention"


def cross_ok(q: Tensor, k: Tensor, v: Tensor, key_lengths: Tensor) -> Tensor:
    """One sequence at a time, its padding cut off: no mask at all."""
    outs = []
    for b, n in enumerate(key_lengths.tolist()):
        weights = torch.softmax(torch.einsum("hmd,hnd->hmn", q[b], k[b, :, :n]) / q.shape[-1] ** 0.5, dim=-1)
        outs.append(weights @ v[b, :, :n])
    return torch.stack(outs)


def cross_with(q: Tensor, k: Tensor, v: Tensor, key_lengths: Tensor, *, scale: float, keep: int = 0,
               mask: bool = True, dim: int = -1, fill: float = float("-inf"),
               zero_after: bool = False, after: float = 1.0, added: bool = False,
               renormalise: bool = False) -> Tensor:  # fmt: skip
    logits = torch.einsum("bhmd,bhnd->bhmn", q, k) * scale
    padding = (torch.arange(k.shape[2])[None, :] >= key_lengths[:, None] + keep)[:, None, None, :]
    if added:  # the 0/1 mask of the real keys added to the logits
        logits = logits + (~padding).float()
    elif mask and not zero_after:
        logits = logits.masked_fill(padding, fill)
    weights = logits.softmax(dim) * after
    if zero_after:
        weights = weights * ~padding
    if renormalise:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights @ v


def sdpa_padding_mask(q: Tensor, k: Tensor, v: Tensor, key_lengths: Tensor) -> Tensor:
    """True = padding, as nn.MultiheadAttention's key_padding_mask, given to SDPA (True = attend)."""
    padding = torch.arange(k.shape[2])[None, :] >= key_lengths[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=padding[:, None, None, :])


CROSS_WRONG = [
    W(lambda q, k, v, n: cross_with(q, k, v, n, scale=q.shape[-1] ** -0.5, mask=False), "not masked", 4,
      id="no_mask"),
    W(lambda q, k, v, n: cross_with(q, k, v, n, scale=q.shape[-1] ** -0.5, keep=1), "(not <=)", None,
      id="off_by_one"),
    W(lambda q, k, v, n: cross_with(q, k, v, n, scale=v.shape[-1] ** -0.5), "value width", 3, id="value_width"),
    W(lambda q, k, v, n: cross_with(q, k, v, n, scale=q.shape[-1] ** -0.5, dim=-2), "over the queries", None,
      id="softmax_over_queries"),
    W(lambda q, k, v, n: cross_with(q, k, v, n, scale=q.shape[-1] ** -0.5, fill=0.0), "set to 0", None,
      id="fill_zero"),
    W(lambda q, k, v, n: cross_with(q, k, v, n, scale=q.shape[-1] ** -0.5, zero_after=True), "after the softmax",
      None, id="zeroed_after"),
    W(lambda q, k, v, n: cross_with(q, k, v, n, scale=1.0), "not scaled", 3, id="unscaled"),
    W(lambda q, k, v, n: cross_with(q, k, v, n, scale=1.0, after=q.shape[-1] ** -0.5), "scaled after the softmax",
      3, id="scaled_after_softmax"),
    W(lambda q, k, v, n: cross_with(q, k, v, n, scale=(q.shape[1] * q.shape[-1]) ** -0.5), "whole embedding size",
      3, id="total_width"),
    W(lambda q, k, v, n: cross_with(q, k, v, n, scale=1 / q.shape[-1]), "divided by d", 3, id="by_d"),
    W(lambda q, k, v, n: cross_with(q, k, v, n, scale=q.shape[-1] ** -0.5, added=True), "0/1 mask is added", None,
      id="float_mask_added"),
    W(sdpa_padding_mask, "True = ignore", None, id="sdpa_true_ignores"),
    W(lambda q, k, v, n: cross_with(q, k, v, n, scale=q.shape[-1] ** -0.5, keep=-1), "one real key too few", None,
      id="one_too_few"),
    W(lambda q, k, v, n: cross_with(q, k, v, n, scale=q.shape[-1] ** -0.5, mask=False, zero_after=True,
      renormalise=True), "the rest renormalised", None, id="renormalised"),
]  # fmt: skip


def test_cross_reference_ignores_the_padding() -> None:
    """The reference's output for a sequence does not depend on its padding keys and values."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 2, 3, 4, generator=g), torch.randn(2, 2, 6, 4, generator=g), torch.randn(2, 2, 6, 5)
    lengths = torch.tensor([6, 2])
    out = attention_checks._padded_cross(q, k, v, lengths)
    k2, v2 = k.clone(), v.clone()
    k2[1, :, 2:], v2[1, :, 2:] = 50.0, -50.0
    torch.testing.assert_close(attention_checks._padded_cross(q, k2, v2, lengths), out)
    torch.testing.assert_close(out, cross_ok(q, k, v, lengths))


@pytest.mark.parametrize(
    "fn",
    [
        cross_ok,
        lambda q, k, v, n: F.scaled_dot_product_attention(
            q, k, v, attn_mask=(torch.arange(k.shape[2]) < n[:, None])[:, None, None]
        ),
        lambda q, k, v, n: cross_with(q, k, v, n, scale=q.shape[-1] ** -0.5, fill=-1e4),
    ],
    ids=["per_sequence", "sdpa", "fill_-1e4"],
)
def test_cross_correct_solution_passes(capsys: pytest.CaptureFixture[str], fn: Callable[..., Tensor]) -> None:
    assert_passes(capsys, CROSS, fn)


@pytest.mark.parametrize(("fn", "words", "pitfall"), CROSS_WRONG)
def test_cross_known_wrong_answer_fails_with_its_message(
    capsys: pytest.CaptureFixture[str], fn: Callable[..., Any], words: str, pitfall: int | None
) -> None:
    assert_named_mistake(capsys, CROSS, fn, words, pitfall)


@pytest.mark.parametrize("d", [4, 8, 16])
def test_cross_scale_from_a_notebook_variable_is_named(capsys: pytest.CaptureFixture[str], d: int) -> None:
    """A scale fixed by a notebook's earlier ``d`` (4 in chapter 2) is not called "the value width"."""
    result, line = run(capsys, CROSS, lambda q, k, v, n: cross_with(q, k, v, n, scale=d**-0.5))
    assert not result and f"the scale is {d}**-0.5 in every case" in line and "value width" not in line, line


def test_cross_random_answer_fails(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, CROSS, lambda q, k, v, n: torch.randn(*q.shape[:-1], v.shape[-1]))
    assert not result and "values differ from the reference" in line


def test_cross_queries_masked_instead_of_keys_fails(capsys: pytest.CaptureFixture[str]) -> None:
    """A mask over the query axis does not even fit when there are more keys than queries."""

    def query_mask(q: Tensor, k: Tensor, v: Tensor, n: Tensor) -> Tensor:
        logits = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        mask = (torch.arange(k.shape[2])[None, :] < n[:, None])[:, None, :, None]  # (B, 1, N, 1)
        return logits.masked_fill(~mask, float("-inf")).softmax(-1) @ v

    result, line = run(capsys, CROSS, query_mask)
    assert not result and "RuntimeError" in line, line


def test_cross_softmax_that_overflows_fails_on_the_large_logit_case_only(capsys: pytest.CaptureFixture[str]) -> None:
    """exp(x) / sum(exp(x)) is NaN past logits of ~88 in float32; the check's last case has such logits."""

    def naive(q: Tensor, k: Tensor, v: Tensor, key_lengths: Tensor) -> Tensor:
        logits = torch.einsum("bhmd,bhnd->bhmn", q, k) * q.shape[-1] ** -0.5
        padding = (torch.arange(k.shape[2])[None, :] >= key_lengths[:, None])[:, None, None, :]
        e = logits.masked_fill(padding, float("-inf")).exp()
        return e / e.sum(-1, keepdim=True) @ v

    result, line = run(capsys, CROSS, naive)
    assert result.cases_total is not None and result.cases_passed == result.cases_total - 1
    assert result.case is not None and "large logits" in result.case and "overflows" in line, line
