"""The DeepViT chapter's re-attention checks: right answers pass, each known mistake is named."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import vitlab.checks
from vitlab.checks.deepvit import _re_attention_heads
from vitlab.models.deepvit import ReAttention


def mixed(scores: Tensor, theta: Tensor) -> Tensor:
    return torch.einsum("bhij,hg->bgij", scores, theta)


def layer_norm_over_heads(x: Tensor, bn: nn.BatchNorm2d) -> Tensor:
    y = nn.functional.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), bn.weight, bn.bias, eps=bn.eps)
    return y.permute(0, 3, 1, 2)


# --- Exercise 1: re-attention with a LayerNorm across the heads (lucidrains' variant) ---


def ln_right_module(attn: Tensor, theta: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """As lucidrains' vit-pytorch writes it: an nn.LayerNorm(H) between two permutes."""
    H = theta.shape[0]
    norm = nn.LayerNorm(H)
    with torch.no_grad():
        norm.weight.copy_(weight)
        norm.bias.copy_(bias)
    mixed = torch.einsum("bhij,hg->bgij", attn, theta)
    return norm(mixed.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def ln_right_manual(attn: Tensor, theta: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """Written independently: a matrix product over the heads and the statistics by hand."""
    mixed = (attn.permute(0, 2, 3, 1) @ theta).permute(0, 3, 1, 2)  # (B, H, N, N)
    mean = mixed.mean(dim=1, keepdim=True)
    var = ((mixed - mean) ** 2).mean(dim=1, keepdim=True)
    return (mixed - mean) / torch.sqrt(var + 1e-5) * weight.view(1, -1, 1, 1) + bias.view(1, -1, 1, 1)


def standardise(
    x: Tensor, dims: tuple[int, ...], w: Tensor, b: Tensor, unbiased: bool = False, eps: float = 1e-5,
    eps_in_root: bool = True,
) -> Tensor:  # fmt: skip
    mean, var = x.mean(dims, keepdim=True), x.var(dims, unbiased=unbiased, keepdim=True)
    std = torch.sqrt(var + eps) if eps_in_root else x.std(dims, unbiased=unbiased, keepdim=True) + eps
    return (x - mean) / std * w.view(1, -1, 1, 1) + b.view(1, -1, 1, 1)


LN_WRONG = {
    "batchnorm per head": (lambda a, t, w, b: standardise(mixed(a, t), (0, 2, 3), w, b), "official BatchNorm2d"),
    "over the keys": (lambda a, t, w, b: standardise(mixed(a, t), (3,), w, b), "over the keys"),
    "per image": (lambda a, t, w, b: standardise(mixed(a, t), (1, 2, 3), w, b), "GroupNorm with one group"),
    "transposed theta": (lambda a, t, w, b: ln_right_manual(a, t.T, w, b), "instead of its transpose"),
    "unbiased variance": (lambda a, t, w, b: standardise(mixed(a, t), (1,), w, b, True), "unbiased"),
    "no affine": (
        lambda a, t, w, b: ln_right_manual(a, t, torch.ones_like(w), torch.zeros_like(b)),
        "not applied",
    ),
    "eps outside the root": (
        lambda a, t, w, b: standardise(mixed(a, t), (1,), w, b, eps_in_root=False),
        "added to the standard deviation",
    ),
    "no eps": (lambda a, t, w, b: standardise(mixed(a, t), (1,), w, b, eps=0.0), "eps is missing"),
    "timm's eps": (
        lambda a, t, w, b: nn.functional.layer_norm(mixed(a, t).permute(0, 2, 3, 1), (t.shape[1],), w, b, eps=1e-6)
        .permute(0, 3, 1, 2),
        "eps is 1e-6",
    ),
    "instance norm": (lambda a, t, w, b: standardise(mixed(a, t), (2, 3), w, b), "InstanceNorm"),
    "weight and bias swapped": (lambda a, t, w, b: ln_right_manual(a, t, b, w), "swapped"),
    "norm before mixing": (
        lambda a, t, w, b: mixed(nn.functional.layer_norm(a.permute(0, 2, 3, 1), (t.shape[0],), w, b)
                                 .permute(0, 3, 1, 2), t),
        "runs before the mixing",
    ),
}  # fmt: skip


@pytest.mark.parametrize("fn", [ln_right_module, ln_right_manual], ids=["module", "manual"])
def test_layernorm_variant_right_answers_pass(fn, capsys) -> None:
    result = vitlab.checks.re_attention_layernorm(fn)
    assert result.passed, capsys.readouterr().out


@pytest.mark.parametrize("name", list(LN_WRONG))
def test_layernorm_variant_wrong_answers_are_named(name: str) -> None:
    fn, words = LN_WRONG[name]
    result = vitlab.checks.re_attention_layernorm(fn)
    assert not result.passed
    assert words in result.message, result.message


def test_layernorm_variant_random_answer_fails_unnamed() -> None:
    result = vitlab.checks.re_attention_layernorm(lambda a, t, w, b: torch.randn_like(a))
    assert not result.passed
    assert result.status == "failed"


# --- Exercise 2: re-attention that changes the number of heads (H_in -> H_out) ---


def heads_right_conv(q: Tensor, k: Tensor, v: Tensor, theta: Tensor, bn: nn.BatchNorm2d) -> Tensor:
    """A 1x1 convolution with weight Θ^T, (H_out, H_in, 1, 1), as ReAttention's reatten_matrix."""
    attn = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
    out = bn(nn.functional.conv2d(attn, theta.T[:, :, None, None])) @ v  # (B, H_out, N, d_v)
    return out.transpose(1, 2).flatten(2)


def heads_right_manual(
    q: Tensor, k: Tensor, v: Tensor, theta: Tensor, bn: nn.BatchNorm2d, *, scale: str = "key", merge: str = "h d",
    bn_mode: str = "batch", softmax: str = "stable", mix: str = "after softmax",
) -> Tensor:  # fmt: skip
    """Written independently: a stable softmax, the mixing as a matrix product, BatchNorm by hand.
    The keywords make known mistakes."""
    B, h_in, N, d_k = q.shape
    h_out, d_v = v.shape[1], v.shape[-1]
    width = {"key": d_k, "value": d_v, "total": h_in * d_k}.get(scale, 1)  # "none", "after": not before
    logits = torch.einsum("bhid,bhjd->bhij", q, k) / width**0.5
    if softmax == "naive":
        attn = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)
    else:
        attn = torch.exp(logits - logits.amax(-1, keepdim=True))
        attn = attn / attn.sum(-1, keepdim=True)
    if scale == "after":
        attn = attn / d_k**0.5
    src = logits if mix == "before softmax" else attn
    mixed = (src.permute(0, 2, 3, 1) @ theta).permute(0, 3, 1, 2)  # (B, H_out, N, N)
    if mix == "before softmax":
        mixed = mixed.softmax(-1)
    if bn_mode == "running":
        assert bn.running_mean is not None and bn.running_var is not None
        mean, var = bn.running_mean.view(1, -1, 1, 1), bn.running_var.view(1, -1, 1, 1)
    else:
        mean = mixed.mean((0, 2, 3), keepdim=True)
        var = ((mixed - mean) ** 2).mean((0, 2, 3), keepdim=True)
    normed = (mixed - mean) / torch.sqrt(var + bn.eps) * bn.weight.view(1, -1, 1, 1) + bn.bias.view(1, -1, 1, 1)
    out = normed @ v  # (B, H_out, N, d_v)
    if merge == "d h":
        return out.permute(0, 2, 3, 1).reshape(B, N, d_v * h_out)
    if merge == "reshape":
        return out.reshape(B, N, h_out * d_v)
    return out.permute(0, 2, 1, 3).reshape(B, N, h_out * d_v)


def heads_no_bn(q: Tensor, k: Tensor, v: Tensor, theta: Tensor, bn: nn.BatchNorm2d) -> Tensor:
    attn = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(-1)
    return (mixed(attn, theta) @ v).transpose(1, 2).flatten(2)


def heads_bn_first(q: Tensor, k: Tensor, v: Tensor, theta: Tensor, bn: nn.BatchNorm2d) -> Tensor:
    attn = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(-1)
    return (mixed(bn(attn), theta) @ v).transpose(1, 2).flatten(2)


def heads_theta_transposed(q: Tensor, k: Tensor, v: Tensor, theta: Tensor, bn: nn.BatchNorm2d) -> Tensor:
    attn = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(-1)
    return (bn(mixed(attn, theta.T)) @ v).transpose(1, 2).flatten(2)


def heads_softmax_over_queries(q: Tensor, k: Tensor, v: Tensor, theta: Tensor, bn: nn.BatchNorm2d) -> Tensor:
    attn = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(-2)
    return (bn(mixed(attn, theta)) @ v).transpose(1, 2).flatten(2)


def heads_layernorm(q: Tensor, k: Tensor, v: Tensor, theta: Tensor, bn: nn.BatchNorm2d) -> Tensor:
    attn = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(-1)
    return (layer_norm_over_heads(mixed(attn, theta), bn) @ v).transpose(1, 2).flatten(2)


HEADS_WRONG = {
    "transposed theta": (heads_theta_transposed, "instead of its transpose"),
    "mix before softmax": (lambda *a: heads_right_manual(*a, mix="before softmax"), "mixed before the softmax"),
    "batchnorm before mixing": (heads_bn_first, "BatchNorm runs before the mixing"),
    "no batchnorm": (heads_no_bn, "BatchNorm is missing"),
    "running statistics": (lambda *a: heads_right_manual(*a, bn_mode="running"), "running statistics"),
    "layernorm over heads": (heads_layernorm, "across the heads at each (query, key) pair"),
    "softmax over queries": (heads_softmax_over_queries, "over the queries"),
    "scale by value width": (lambda *a: heads_right_manual(*a, scale="value"), "scaled by the value head width"),
    "merged d h": (lambda *a: heads_right_manual(*a, merge="d h"), "merged (d h)"),
    "naive softmax": (lambda *a: heads_right_manual(*a, softmax="naive"), "exp(x) / sum(exp(x)), which overflows"),
    "unscaled": (lambda *a: heads_right_manual(*a, scale="none"), "not scaled"),
    "scaled after softmax": (lambda *a: heads_right_manual(*a, scale="after"), "scaled after the softmax"),
    "scale by total width": (lambda *a: heads_right_manual(*a, scale="total"), "whole embedding size"),
    "merged by reshape": (lambda *a: heads_right_manual(*a, merge="reshape"), "merged by a reshape"),
}


@pytest.mark.parametrize("fn", [heads_right_conv, heads_right_manual], ids=["conv", "manual"])
def test_heads_variant_right_answers_pass(fn, capsys) -> None:
    result = vitlab.checks.re_attention_heads(fn)
    assert result.passed, capsys.readouterr().out


@pytest.mark.parametrize("name", list(HEADS_WRONG))
def test_heads_variant_wrong_answers_are_named(name: str) -> None:
    fn, words = HEADS_WRONG[name]
    result = vitlab.checks.re_attention_heads(fn)
    assert not result.passed
    assert words in result.message, result.message


def test_heads_variant_naive_softmax_fails_on_the_large_logit_case_only() -> None:
    result = vitlab.checks.re_attention_heads(HEADS_WRONG["naive softmax"][0])
    assert result.cases_total is not None and result.cases_passed == result.cases_total - 1
    assert result.case is not None and "large logits" in result.case


def test_heads_variant_random_answer_fails_unnamed() -> None:
    result = vitlab.checks.re_attention_heads(
        lambda q, k, v, t, bn: torch.randn(q.shape[0], q.shape[2], v[0, :, 0].numel())
    )
    assert not result.passed and result.status == "failed"
    assert "known mistake" not in result.message


def test_heads_variant_with_square_theta_is_the_models_forward() -> None:
    """With H_in == H_out the reference is ReAttention.forward before its output projection."""
    torch.manual_seed(0)
    module = ReAttention(12, num_heads=3).train()
    with torch.no_grad():
        module.reatten_matrix.bias.zero_()
    x = torch.randn(2, 5, 12)
    with torch.no_grad():
        _, reattn = module(x, return_attn=True)
        q, k, v = module.qkv(x).reshape(2, 5, 3, 3, 4).permute(2, 0, 3, 1, 4)
        theta = module.reatten_matrix.weight[:, :, 0, 0].T
        got = _re_attention_heads(q, k, v, theta, module.var_norm)
    torch.testing.assert_close(got, (reattn @ v).transpose(1, 2).flatten(2))
