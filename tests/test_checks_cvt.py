"""The CvT chapter's new check: right answers pass, each known wrong answer is named."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitlab import checks


def conv_proj(fmap: Tensor, proj: nn.Module) -> Tensor:
    """Depthwise conv + BatchNorm (eval) by hand, then flatten to tokens."""
    conv, bn = proj.conv, proj.bn
    out = F.conv2d(
        fmap,
        conv.weight,
        stride=conv.stride,
        padding=conv.padding,
        groups=fmap.shape[1],
    )
    out = F.batch_norm(out, bn.running_mean, bn.running_var, bn.weight, bn.bias, eps=bn.eps)
    return out.flatten(2).transpose(1, 2)


def attention_ok(x: Tensor, grid_size: tuple[int, int], attn: nn.Module, *, change: str | None = None) -> Tensor:
    """Written without einops and without the layer's forward; ``change`` injects one mistake."""
    B, _, C = x.shape
    H, W = grid_size
    h = attn.num_heads
    cls = None
    if attn.with_cls_token:
        cls, x = x[:, :1], x[:, 1:]
    if change == "naive_map":
        fmap = x.reshape(B, C, H, W)
    else:
        fmap = x.transpose(1, 2).reshape(B, C, H, W)
    q = conv_proj(fmap, attn.conv_proj_q)
    k = conv_proj(fmap, attn.conv_proj_q if change == "kv_unsqueezed" else attn.conv_proj_k)
    v = conv_proj(fmap, attn.conv_proj_q if change == "kv_unsqueezed" else attn.conv_proj_v)
    if cls is not None and change == "cls_query_only":
        q = torch.cat([cls, q], 1)
    elif cls is not None and change not in ("cls_dropped", "cls_after_linear"):
        q, k, v = torch.cat([cls, q], 1), torch.cat([cls, k], 1), torch.cat([cls, v], 1)
    q, k, v = attn.proj_q(q), attn.proj_k(k), attn.proj_v(v)
    if cls is not None and change == "cls_after_linear":
        q, k, v = torch.cat([cls, q], 1), torch.cat([cls, k], 1), torch.cat([cls, v], 1)
    q, k, v = (t.reshape(B, t.shape[1], h, C // h).transpose(1, 2) for t in (q, k, v))
    scale = (C // h) ** -0.5 if change == "head_dim_scale" else C**-0.5  # CvT: the embedding width
    weights = torch.einsum("bhqd,bhkd->bhqk", q, k).mul(scale).softmax(-2 if change == "softmax_axis" else -1)
    out = (weights @ v).transpose(1, 2).reshape(B, -1, C)
    return attn.proj(out)


def run(capsys: pytest.CaptureFixture[str], fn: Callable[..., Tensor]) -> tuple[checks.CheckResult, str]:
    result = checks.cvt_conv_attention(fn)
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    return result, out.strip()


def test_right_answer_passes_fast(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, attention_ok)
    assert result.passed, line
    assert line == "PASS cvt_conv_attention: all 4 cases match the reference"


def test_the_layer_itself_passes(capsys: pytest.CaptureFixture[str]) -> None:
    """The shortcut the exercise forbids passes: the check cannot tell (its docstring says so)."""
    result, _ = run(capsys, lambda x, g, attn: attn(x, g))
    assert result.passed


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ("naive_map", "reshaped straight to (B, C, H, W)"),
        ("cls_dropped", "never re-attached"),
        ("cls_query_only", "to the queries only"),
        ("cls_after_linear", "after the linear projections"),
        ("kv_unsqueezed", "query's projection (stride 1)"),
        ("head_dim_scale", "pitfall 14"),
        ("softmax_axis", "over the queries"),
    ],
)
def test_wrong_answers_are_named(capsys: pytest.CaptureFixture[str], change: str, words: str) -> None:
    result, line = run(capsys, lambda x, g, a: attention_ok(x, g, a, change=change))
    assert not result.passed
    assert line.startswith("FAIL cvt_conv_attention [case ")
    assert words in line, line
    assert "ERRATA" not in line  # the embedding-width scale is CvT's own, not a bug


def test_swapped_grid_and_convolved_cls_are_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def swapped(x: Tensor, grid_size: tuple[int, int], attn: nn.Module) -> Tensor:
        H, W = grid_size
        t = 1 if attn.with_cls_token else 0
        grid = x[:, t:].reshape(x.shape[0], W, H, -1).transpose(1, 2).reshape(x.shape[0], H * W, -1)
        out = attention_ok(torch.cat([x[:, :t], grid], 1), grid_size, attn)
        back = out[:, t:].reshape(x.shape[0], H, W, -1).transpose(1, 2).reshape(x.shape[0], H * W, -1)
        return torch.cat([out[:, :t], back], 1)

    result, line = run(capsys, swapped)
    assert not result.passed and "height and width are swapped" in line, line

    def convolved_cls(x: Tensor, grid_size: tuple[int, int], attn: nn.Module) -> Tensor:
        if not attn.with_cls_token:
            return attention_ok(x, grid_size, attn)
        B, _, C = x.shape
        cls_map = x[:, :1].reshape(B, C, 1, 1)
        fmap = x[:, 1:].transpose(1, 2).reshape(B, C, *grid_size)
        q, k, v = (
            torch.cat([conv_proj(cls_map, p), conv_proj(fmap, p)], 1)
            for p in (attn.conv_proj_q, attn.conv_proj_k, attn.conv_proj_v)
        )
        h = attn.num_heads
        q, k, v = (
            lin(t).reshape(B, t.shape[1], h, C // h).transpose(1, 2)
            for lin, t in ((attn.proj_q, q), (attn.proj_k, k), (attn.proj_v, v))
        )
        out = ((q @ k.transpose(-2, -1)) * C**-0.5).softmax(-1) @ v
        return attn.proj(out.transpose(1, 2).reshape(B, -1, C))

    result, line = run(capsys, convolved_cls)
    assert not result.passed and "cls token went through the convolutions" in line, line


def test_reference_is_the_models_attention() -> None:
    """The check's cases are vitlab ConvAttention layers: a CvT-13 stage-3 layer gives the same answer."""
    import vitlab

    model = vitlab.create_model("cvt_13", depths=(1, 1, 1)).eval()
    attn = model.stages[2].blocks[0].attn
    x = torch.randn(1, 1 + 14 * 14, 384, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(attention_ok(x, (14, 14), attn), attn(x, (14, 14)), atol=1e-4, rtol=1e-4)
