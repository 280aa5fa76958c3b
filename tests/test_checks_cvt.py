"""The CvT chapter's new check: right answers pass, each known wrong answer is named."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from conftest import run as check_line
from vitlab.checks import CheckResult


def conv_proj(fmap: Tensor, proj: nn.Module, change: str | None = None) -> Tensor:
    """Depthwise conv + BatchNorm (eval) by hand, then flatten to tokens; ``change`` breaks the BatchNorm."""
    conv, bn = proj.conv, proj.bn
    out = F.conv2d(
        fmap,
        conv.weight,
        stride=conv.stride,
        padding=conv.padding,
        groups=fmap.shape[1],
    )
    per_channel = [t.view(1, -1, 1, 1) for t in (bn.running_mean, bn.running_var, bn.weight, bn.bias)]
    mean, var, weight, bias = per_channel
    if change == "batch_statistics":  # the batch's own statistics, as in training mode
        mean, var = out.mean((0, 2, 3), keepdim=True), out.var((0, 2, 3), unbiased=False, keepdim=True)
    if change == "no_affine":
        weight, bias = torch.ones_like(weight), torch.zeros_like(bias)
    eps = 0.0 if change == "no_eps" else bn.eps
    if change != "skipped":
        out = (out - mean) / torch.sqrt(var + eps) * weight + bias
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
    q = conv_proj(fmap, attn.conv_proj_q, change)
    k = conv_proj(fmap, attn.conv_proj_q if change == "kv_unsqueezed" else attn.conv_proj_k, change)
    v = conv_proj(fmap, attn.conv_proj_q if change == "kv_unsqueezed" else attn.conv_proj_v, change)
    if cls is not None and change == "cls_query_only":
        q = torch.cat([cls, q], 1)
    elif cls is not None and change not in ("cls_dropped", "cls_after_linear"):
        q, k, v = torch.cat([cls, q], 1), torch.cat([cls, k], 1), torch.cat([cls, v], 1)
    q, k, v = attn.proj_q(q), attn.proj_k(k), attn.proj_v(v)
    if cls is not None and change == "cls_after_linear":
        q, k, v = torch.cat([cls, q], 1), torch.cat([cls, k], 1), torch.cat([cls, v], 1)
    if change in ("split_d_h", "split_merge_d_h"):  # head g gets every h-th channel
        q, k, v = (t.reshape(B, t.shape[1], C // h, h).permute(0, 3, 1, 2) for t in (q, k, v))
    else:
        q, k, v = (t.reshape(B, t.shape[1], h, C // h).transpose(1, 2) for t in (q, k, v))
    scale = (C // h) ** -0.5 if change == "head_dim_scale" else C**-0.5  # CvT: the embedding width
    logits = torch.einsum("bhqd,bhkd->bhqk", q, k).mul(scale)
    if change == "naive_softmax":
        weights = logits.exp() / logits.exp().sum(-1, keepdim=True)
    else:
        weights = logits.softmax(-2 if change == "softmax_axis" else -1)
    if change in ("merge_d_h", "split_merge_d_h"):
        out = (weights @ v).permute(0, 2, 3, 1).reshape(B, -1, C)
    elif change == "merge_reshape":
        out = (weights @ v).reshape(B, -1, C)
    else:
        out = (weights @ v).transpose(1, 2).reshape(B, -1, C)
    return attn.proj(out)


def run(capsys: pytest.CaptureFixture[str], fn: Callable[..., Any]) -> tuple[CheckResult, str]:
    """The check's result and the one line it printed."""
    return check_line(capsys, "cvt_conv_attention", fn)


def test_right_answer_passes_fast(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, attention_ok)
    assert result.passed, line
    assert line == "PASS cvt_conv_attention: all 6 cases match the reference"


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
        ("head_dim_scale", "pitfall 19"),
        ("softmax_axis", "over the queries"),
        ("merge_d_h", "the heads are merged (d h)"),
        ("merge_reshape", "merged with a plain reshape"),
        ("split_merge_d_h", "split into heads (d h), so head g"),
        ("split_d_h", "split into heads (d h) but merged (h d)"),
        ("batch_statistics", "the batch's own statistics"),
        ("no_affine", "affine is missing"),
        ("no_eps", "eps is missing"),
        ("skipped", "the BatchNorm is skipped"),
        ("naive_softmax", "exp(x) / sum(exp(x)), which overflows"),
    ],
)
def test_wrong_answers_are_named(capsys: pytest.CaptureFixture[str], change: str, words: str) -> None:
    result, line = run(capsys, lambda x, g, a: attention_ok(x, g, a, change=change))
    assert not result.passed
    assert line.startswith("FAIL cvt_conv_attention [case ")
    assert words in line, line
    assert "ERRATA" not in line and "Pitfall" not in line  # the embedding-width scale is CvT's own, not a bug
    assert "a known mistake: " in line


def test_each_numerics_case_alone_catches_its_slip(capsys: pytest.CaptureFixture[str]) -> None:
    """No eps only where the running variances are small, and a softmax that overflows: one case each, named."""

    def no_eps_where_var_is_small(x: Tensor, grid_size: tuple[int, int], attn: nn.Module) -> Tensor:
        small = bool(attn.conv_proj_q.bn.running_var.max() < 0.01)
        return attention_ok(x, grid_size, attn, change="no_eps" if small else None)

    for fn, case, words in (
        (no_eps_where_var_is_small, "running variances about 1e-3", "eps is missing"),
        (lambda x, g, a: attention_ok(x, g, a, change="naive_softmax"), "large logits", "overflows"),
    ):
        result, line = run(capsys, fn)
        assert result.cases_total is not None and result.cases_passed == result.cases_total - 1, line
        assert result.case is not None and case in result.case and words in line, line


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

    model = vitlab.create_model("cvt_13", depth=(1, 1, 1)).eval()
    attn = model.stages[2].blocks[0].attn
    x = torch.randn(1, 1 + 14 * 14, 384, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(attention_ok(x, (14, 14), attn), attn(x, (14, 14)), atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- the "avg" projection (exercise 2)


def avg_attention_ok(x: Tensor, grid_size: tuple[int, int], attn: nn.Module, *, change: str | None = None) -> Tensor:
    """Written without einops: nn.AvgPool2d for keys and values, plain reshapes; ``change`` injects one mistake."""
    B, _, C = x.shape
    H, W = grid_size
    h = attn.num_heads
    cls, tokens = (x[:, :1], x[:, 1:]) if attn.with_cls_token else (None, x)
    fmap = tokens.transpose(1, 2).reshape(B, C, H, W)
    pool = nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=change != "floor", count_include_pad=change != "exclude_pad")
    kv = pool(fmap).flatten(2).transpose(1, 2)
    q, k, v = (kv if change == "q_pooled" else tokens), kv, kv
    if cls is not None and change != "cls_dropped":
        q = torch.cat([cls, q], dim=1)
        if change != "cls_query_only":
            k, v = torch.cat([cls, k], dim=1), torch.cat([cls, v], dim=1)

    def heads(t: Tensor) -> Tensor:
        return t.reshape(B, t.shape[1], h, C // h).transpose(1, 2)

    q, k, v = heads(attn.proj_q(q)), heads(attn.proj_k(k)), heads(attn.proj_v(v))
    scale = (C // h) ** -0.5 if change == "head_dim_scale" else attn.scale
    logits = q @ k.transpose(-2, -1) * scale
    if change == "naive_softmax":
        out = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True) @ v
    else:
        out = torch.softmax(logits, dim=-1) @ v
    return attn.proj(out.transpose(1, 2).reshape(B, -1, C))


def run_avg(capsys: pytest.CaptureFixture[str], fn: Callable[..., Any]) -> tuple[CheckResult, str]:
    """The check's result and the one line it printed."""
    return check_line(capsys, "cvt_avg_attention", fn)


def test_avg_right_answer_passes(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run_avg(capsys, avg_attention_ok)
    assert result.passed, line
    assert line == "PASS cvt_avg_attention: all 5 cases match the reference"


@pytest.mark.parametrize(
    ("change", "words", "pitfall"),
    [
        ("floor", "rounded down (AvgPool2d without ceil_mode=True)", None),
        ("exclude_pad", "count_include_pad=False", None),
        ("q_pooled", "the queries were pooled too", None),
        ("cls_dropped", "never re-attached", None),
        ("cls_query_only", "re-attached to the queries only", None),
        ("head_dim_scale", "scaled by head_dim**-0.5", 19),
        ("naive_softmax", "exp(x) / sum(exp(x)), which overflows", None),
    ],
)
def test_avg_wrong_answers_are_named(
    capsys: pytest.CaptureFixture[str], change: str, words: str, pitfall: int | None
) -> None:
    result, line = run_avg(capsys, lambda x, g, a: avg_attention_ok(x, g, a, change=change))
    assert not result.passed and line.startswith("FAIL cvt_avg_attention [case ")
    tag = f"Pitfall {pitfall}: " if pitfall is not None else "a known mistake: "
    assert tag in line and words in line, line


def test_avg_the_convolutional_projection_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    """The chapter's own layer (depthwise conv + BatchNorm) is not the 'avg' projection."""
    result, line = run_avg(capsys, lambda x, g, a: a(x, g))
    assert not result.passed and "chapter's convolutional projection" in line, line


def test_avg_a_random_answer_fails_without_a_name(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run_avg(capsys, lambda x, g, a: torch.randn_like(x))
    assert not result.passed and "known mistake" not in line and "Pitfall" not in line


def test_avg_keys_round_up() -> None:
    """ceil_mode=True: a 14 x 14 map gives 8 x 8 keys (the stride-2 convolution gives 7 x 7)."""
    pool = nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True)
    assert pool(torch.zeros(1, 1, 14, 14)).shape[-2:] == (8, 8)
    assert F.conv2d(torch.zeros(1, 1, 14, 14), torch.zeros(1, 1, 3, 3), stride=2, padding=1).shape[-2:] == (7, 7)
