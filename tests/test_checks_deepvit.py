"""The DeepViT chapter's re-attention check: right answers pass, each known mistake is named."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import vitlab.checks
from vitlab.checks.deepvit import _re_attention_map
from vitlab.models.deepvit import ReAttention


def right_manual(scores: Tensor, theta: Tensor, bn: nn.BatchNorm2d) -> Tensor:
    """Written independently: a matrix product on the head axis and BatchNorm by hand."""
    B, H, N, _ = scores.shape
    attn = torch.exp(scores - scores.amax(-1, keepdim=True))
    attn = attn / attn.sum(-1, keepdim=True)
    mixed = (theta.T @ attn.permute(1, 0, 2, 3).reshape(H, -1)).reshape(H, B, N, N).permute(1, 0, 2, 3)
    mean = mixed.mean(dim=(0, 2, 3), keepdim=True)
    var = ((mixed - mean) ** 2).mean(dim=(0, 2, 3), keepdim=True)
    w, b = bn.weight.view(1, H, 1, 1), bn.bias.view(1, H, 1, 1)
    return (mixed - mean) / torch.sqrt(var + bn.eps) * w + b


def right_conv(scores: Tensor, theta: Tensor, bn: nn.BatchNorm2d) -> Tensor:
    """Another style: a 1x1 convolution with weight Θ^T, then the module."""
    return bn(nn.functional.conv2d(scores.softmax(dim=-1), theta.T[:, :, None, None]))


def mixed(scores: Tensor, theta: Tensor) -> Tensor:
    return torch.einsum("bhij,hg->bgij", scores, theta)


def instance_norm(x: Tensor, bn: nn.BatchNorm2d, dims: tuple[int, ...]) -> Tensor:
    mean, var = x.mean(dims, keepdim=True), x.var(dims, unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + bn.eps) * bn.weight.view(1, -1, 1, 1) + bn.bias.view(1, -1, 1, 1)


def layer_norm_over_heads(x: Tensor, bn: nn.BatchNorm2d) -> Tensor:
    y = nn.functional.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), bn.weight, bn.bias, eps=bn.eps)
    return y.permute(0, 3, 1, 2)


WRONG = {
    "transposed theta": (lambda s, t, bn: bn(mixed(s.softmax(-1), t.T)), "instead of its transpose"),
    "mix before softmax": (lambda s, t, bn: bn(mixed(s, t).softmax(-1)), "mixed before the softmax"),
    "no batchnorm": (lambda s, t, bn: mixed(s.softmax(-1), t), "BatchNorm is missing"),
    "batchnorm over queries": (
        lambda s, t, bn: bn(mixed(s.softmax(-1), t).transpose(1, 2)).transpose(1, 2),
        "over the query tokens",
    ),
    "layernorm over heads": (
        lambda s, t, bn: layer_norm_over_heads(mixed(s.softmax(-1), t), bn),
        "LayerNorm over the head axis",
    ),
    "per-image statistics": (
        lambda s, t, bn: instance_norm(mixed(s.softmax(-1), t), bn, (2, 3)),
        "normalised on its own",
    ),
    "softmax over queries": (lambda s, t, bn: bn(mixed(s.softmax(-2), t)), "over the queries"),
}


@pytest.mark.parametrize("fn", [right_manual, right_conv], ids=["manual", "conv"])
def test_right_answers_pass(fn, capsys) -> None:
    result = vitlab.checks.re_attention_map(fn)
    assert result.passed, capsys.readouterr().out


@pytest.mark.parametrize("name", list(WRONG))
def test_wrong_answers_are_named(name: str) -> None:
    fn, words = WRONG[name]
    result = vitlab.checks.re_attention_map(fn)
    assert not result.passed
    assert words in result.message, result.message


def test_not_implemented_is_todo() -> None:
    def stub(scores, theta, bn):
        raise NotImplementedError

    assert vitlab.checks.re_attention_map(stub).status == "not implemented"


def test_reference_is_the_models_forward() -> None:
    """The check's reference equals the map ReAttention.forward returns (training mode)."""
    torch.manual_seed(0)
    module = ReAttention(12, num_heads=3).train()
    with torch.no_grad():
        module.reatten_matrix.bias.zero_()
        module.var_norm.weight.uniform_(0.5, 1.5)
        module.var_norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(2, 5, 12)
    with torch.no_grad():
        _, expected = module(x, return_attn=True)
        q, k, _ = module.qkv(x).reshape(2, 5, 3, 3, 4).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) * module.scale
        theta = module.reatten_matrix.weight[:, :, 0, 0].T  # θ[h, g] = W[g, h]
        got = _re_attention_map(scores, theta, module.var_norm)
    torch.testing.assert_close(got, expected)
