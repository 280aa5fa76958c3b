"""vitlab.checks: a correct solution passes, each known wrong answer is named, nothing raises.

The "student" functions below are written the way a student would write them (other ops
than the checks' references), so a pass means two independent implementations agree.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

import vitlab.checks as checks
from conftest import assert_named_mistake, assert_passes, run  # run: one printed line and a CheckResult
from vitlab.checks import CheckResult
from vitlab.models.cait import ClassAttn
from vitlab.models.cvt import ConvProjection

# ---------------------------------------------------------------- correct solutions


def patchify_ok(images: Tensor, patch_size: int) -> Tensor:
    B, C, _, _ = images.shape
    P = patch_size
    windows = images.unfold(2, P, P).unfold(3, P, P)  # (B, C, h, w, P, P)
    return windows.permute(0, 2, 3, 4, 5, 1).reshape(B, -1, P * P * C)


def unpatchify_ok(patches: Tensor, patch_size: int, grid_size: tuple[int, int]) -> Tensor:
    B, _, D = patches.shape
    (h, w), P = grid_size, patch_size
    x = patches.view(B, h, w, P, P, D // (P * P)).permute(0, 5, 1, 3, 2, 4)  # (B, C, h, P, w, P)
    return x.reshape(B, -1, h * P, w * P)


def attention_ok(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def split_heads_ok(x: Tensor, num_heads: int) -> Tensor:
    B, N, C = x.shape
    return x.view(B, N, num_heads, C // num_heads).transpose(1, 2)


def hard_ok(cls_logits: Tensor, dist_logits: Tensor, teacher_logits: Tensor, labels: Tensor, alpha: float = 0.5):
    teacher_labels = teacher_logits.argmax(dim=1)
    return (1 - alpha) * F.cross_entropy(cls_logits, labels) + alpha * F.cross_entropy(dist_logits, teacher_labels)


def soft_ok(
    cls_logits: Tensor, dist_logits: Tensor, teacher_logits: Tensor, labels: Tensor, alpha: float, tau: float,
    *, head: str = "dist", reverse: bool = False, tau_squared: bool = True, divide_by: str = "numel",
) -> Tensor:  # fmt: skip
    """Soft distillation; the keywords make the wrong versions below."""
    student = dist_logits if head == "dist" else cls_logits
    log_p_s, log_p_t = F.log_softmax(student / tau, dim=1), F.log_softmax(teacher_logits / tau, dim=1)
    kl = (log_p_s.exp() * (log_p_s - log_p_t)).sum() if reverse else (log_p_t.exp() * (log_p_t - log_p_s)).sum()
    kl = kl * tau**2 if tau_squared else kl
    kl = kl / (student.numel() if divide_by == "numel" else student.shape[0])
    return (1 - alpha) * F.cross_entropy(cls_logits, labels) + alpha * kl


def layer_scale_ok(layer_index: int, depth: int) -> float:
    if depth <= 18:
        return 0.1
    if depth <= 24:
        return 1e-5
    return 1e-6


def class_attention_ok(
    x: Tensor, wq: Tensor, wk: Tensor, wv: Tensor, num_heads: int, *, kv: str = "all", scale: str = "head"
) -> Tensor:
    B, T, C = x.shape
    d = C // num_heads
    z = x if kv == "all" else x[:, 1:]
    q = (x[:, :1] @ wq.T).view(B, 1, num_heads, d).transpose(1, 2)
    k = (z @ wk.T).view(B, z.shape[1], num_heads, d).transpose(1, 2)
    v = (z @ wv.T).view(B, z.shape[1], num_heads, d).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v, scale=None if scale == "head" else C**-0.5)
    return out.transpose(1, 2).reshape(B, 1, C)


def squeezed_ok(x: Tensor, grid_size: tuple[int, int], weight: Tensor, stride: int, *, padding: int | None = None):
    B, _, C = x.shape
    fmap = x.transpose(1, 2).reshape(B, C, *grid_size)
    pad = weight.shape[-1] // 2 if padding is None else padding
    return F.conv2d(fmap, weight, stride=stride, padding=pad, groups=C).flatten(2).transpose(1, 2)


def levit_idx_ok(resolution: int) -> Tensor:
    """The official LeViT numbering: offsets in the order they are first met."""
    points = list(itertools.product(range(resolution), range(resolution)))
    offsets: dict[tuple[int, int], int] = {}
    idxs = []
    for p1 in points:
        for p2 in points:
            offset = (abs(p1[0] - p2[0]), abs(p1[1] - p2[1]))
            offsets.setdefault(offset, len(offsets))
            idxs.append(offsets[offset])
    return torch.tensor(idxs).view(len(points), len(points))


def levit_logits_ok(q: Tensor, k: Tensor, bias: Tensor, scale: float) -> Tensor:
    return torch.einsum("bhqd,bhkd->bhqk", q, k) * scale + bias


SOLUTIONS: dict[str, Callable[..., Any]] = {
    "patchify": patchify_ok,
    "unpatchify": unpatchify_ok,
    "scaled_dot_product_attention": attention_ok,
    "split_heads": split_heads_ok,
    "hard_distillation_loss": hard_ok,
    "soft_distillation_loss": soft_ok,
    "layer_scale_init": layer_scale_ok,
    "class_attention": class_attention_ok,
    "squeezed_kv_projection": squeezed_ok,
    "levit_bias_indices": levit_idx_ok,
    "levit_attention_logits": levit_logits_ok,
}
NUMBER_CHECKS = {"layer_scale_init"}

# ---------------------------------------------------------------- known wrong answers


def note_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """A MultiHeadAttention as tutorial code writes it (pitfall 3): softmax(energy) / emb_size**0.5."""
    energy = torch.einsum("bhqd, bhkd -> bhqk", q, k)
    if mask is not None:
        energy = energy.masked_fill(~mask, float("-inf"))
    emb_size = q.shape[1] * q.shape[-1]
    att = F.softmax(energy, dim=-1) / emb_size**0.5
    return att @ v


def explicit(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, scale: float, after: float = 1.0,
             invert: bool = False, dim: int = -1) -> Tensor:  # fmt: skip
    energy = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        energy = energy.masked_fill(mask if invert else ~mask, float("-inf"))
    return energy.softmax(dim=dim) * after @ v


def noop_masked_fill(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    energy = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        energy.masked_fill(~mask, float("-inf"))  # pitfall 4: the result is thrown away
    return energy.softmax(dim=-1) @ v


def signed_levit_idx(r: int) -> Tensor:
    ys, xs = torch.meshgrid(torch.arange(r), torch.arange(r), indexing="ij")
    dy = ys.flatten()[:, None] - ys.flatten()[None, :] + r - 1
    dx = xs.flatten()[:, None] - xs.flatten()[None, :] + r - 1
    return dy * (2 * r - 1) + dx


def xy_levit_idx(r: int) -> Tensor:
    ys, xs = torch.meshgrid(torch.arange(r), torch.arange(r), indexing="xy")  # pitfall 13
    points = torch.stack([ys.flatten(), xs.flatten()])
    offsets = (points[:, :, None] - points[:, None, :]).abs()
    return offsets[0] * r + offsets[1]


def masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, how: str = "right") -> Tensor:
    """Attention with the mask applied as ``how`` says: "right", "zero" (logits set to 0), "after" (weights
    zeroed after the softmax), "naive" (the softmax as exp(x) / sum(exp(x))), "max" (the same with the max
    subtracted, which is right), "float64" (in float64, right too)."""
    if how == "float64":
        return attention_ok(q.double(), k.double(), v.double(), mask)
    logits = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
    if mask is not None and how != "after":
        logits = logits.masked_fill(~mask, 0.0 if how == "zero" else float("-inf"))
    if how == "naive":
        weights = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)
    elif how == "max":
        e = torch.exp(logits - logits.amax(-1, keepdim=True))
        weights = e / e.sum(-1, keepdim=True)
    else:
        weights = torch.softmax(logits, dim=-1)
    if mask is not None and how == "after":
        weights = weights * mask
    return weights @ v


def naive_ce(logits: Tensor, labels: Tensor, how: str) -> Tensor:
    """Cross-entropy from the formula: "softmax" (exp / sum, then log) or "log_of_softmax" (softmax, then log)."""
    probs = torch.exp(logits) / torch.exp(logits).sum(1, keepdim=True) if how == "softmax" else logits.softmax(1)
    return -torch.log(probs[torch.arange(len(labels)), labels]).mean()


def soft_by_hand(c: Tensor, d: Tensor, t: Tensor, y: Tensor, *, alpha: float, tau: float, how: str) -> Tensor:
    """Soft distillation as students write it: "target_probs" (F.kl_div with softmax targets, right),
    "log_of_softmax" (torch.log(F.softmax(...)) as the input), "naive" (exp / sum both sides)."""
    if how == "naive":
        p_s = torch.exp(d / tau) / torch.exp(d / tau).sum(1, keepdim=True)
        p_t = torch.exp(t / tau) / torch.exp(t / tau).sum(1, keepdim=True)
        kl = (p_t * (p_t.log() - p_s.log())).sum()
    else:
        log_p_s = torch.log(F.softmax(d / tau, dim=1)) if how == "log_of_softmax" else F.log_softmax(d / tau, dim=1)
        kl = F.kl_div(log_p_s, F.softmax(t / tau, dim=1), reduction="sum")
    return (1 - alpha) * F.cross_entropy(c, y) + alpha * kl * tau**2 / d.numel()


def same_pad(x: Tensor, kernel: int, stride: int) -> Tensor:
    """TensorFlow's "SAME" padding: the extra row and column at the bottom and right."""
    pads = []
    for n in (x.shape[-1], x.shape[-2]):
        total = max((math.ceil(n / stride) - 1) * stride + kernel - n, 0)
        pads += [total // 2, total - total // 2]
    return F.pad(x, pads)


def padded_squeeze(x: Tensor, grid_size: tuple[int, int], weight: Tensor, stride: int, *, how: str) -> Tensor:
    """squeezed_ok with the padding done another way: "reflect", "replicate", "same", "before" (top and left
    only), "after" (bottom and right only) or "twice" (by F.pad, then by padding=)."""
    B, _, C = x.shape
    fmap = x.transpose(1, 2).reshape(B, C, *grid_size)
    p = weight.shape[-1] // 2
    sides = {"before": (p, 0, p, 0), "after": (0, p, 0, p), "twice": (p,) * 4}
    if how in sides:
        fmap = F.pad(fmap, sides[how])
    else:
        fmap = same_pad(fmap, 2 * p + 1, stride) if how == "same" else F.pad(fmap, (p,) * 4, mode=how)
    return (
        F.conv2d(fmap, weight, stride=stride, padding=p if how == "twice" else 0, groups=C).flatten(2).transpose(1, 2)
    )


def d(q: Tensor) -> int:
    return q.shape[-1]


def D(q: Tensor) -> int:
    return q.shape[1] * q.shape[-1]


W = pytest.param  # (check, student function, words the message must contain, pitfall)
WRONG = [
    W("patchify", lambda x, P: F.unfold(x, P, stride=P).transpose(1, 2), "(c p1 p2) order", None, id="unfold"),
    W("patchify", lambda x, P: x.unfold(2, P, P).unfold(3, P, P).permute(0, 3, 2, 4, 5, 1).flatten(1, 2).flatten(2),
      "column by column (w h)", None, id="columns"),
    W("patchify", lambda x, P: x.unfold(2, P, P).unfold(3, P, P).permute(0, 2, 3, 5, 4, 1).flatten(1, 2).flatten(2),
      "(p2 p1 c)", None, id="transposed_patch"),
    W("patchify", lambda x, P: x.reshape(x.shape[0], -1, P * P * x.shape[1]), "plain reshape", None, id="reshape"),
    W("unpatchify", lambda x, P, g: x.view(x.shape[0], *g, -1, P, P).permute(0, 3, 1, 4, 2, 5).flatten(4).flatten(2, 3),
      "read as (c p1 p2)", None, id="unfold_order"),
    W("unpatchify", lambda x, P, g: x.view(x.shape[0], g[1], g[0], P, P, -1).permute(0, 5, 2, 3, 1, 4).flatten(4)
      .flatten(2, 3), "read column by column", None, id="columns"),
    W("unpatchify", lambda x, P, g: x.reshape(x.shape[0], -1, g[0] * P, g[1] * P), "plain reshape", None,
      id="reshape"),
    W("scaled_dot_product_attention", note_attention, "emb_size**0.5", 3, id="note"),
    W("scaled_dot_product_attention", lambda q, k, v, mask=None: explicit(q, k, v, mask, scale=1, after=d(q) ** -0.5),
      "after the softmax (rows no longer sum to 1)", 3, id="after_softmax"),
    W("scaled_dot_product_attention", lambda q, k, v, mask=None: explicit(q, k, v, mask, scale=D(q) ** -0.5),
      "whole embedding size", 3, id="embed_dim"),
    W("scaled_dot_product_attention", lambda q, k, v, mask=None: explicit(q, k, v, mask, scale=1 / d(q)),
      "divided by d; divide by sqrt(d)", 3, id="by_d"),
    W("scaled_dot_product_attention", lambda q, k, v, mask=None: explicit(q, k, v, mask, scale=1), "not scaled", 3,
      id="unscaled"),
    W("scaled_dot_product_attention", noop_masked_fill, "the mask has no effect", 4, id="noop_mask"),
    W("scaled_dot_product_attention", lambda *a, **k: masked_attention(*a, **k, how="zero"),
      "masked logits are set to 0", None, id="mask_fill_zero"),
    W("scaled_dot_product_attention", lambda *a, **k: masked_attention(*a, **k, how="after"),
      "zeroes the weights after the softmax", None, id="mask_after_softmax"),
    W("scaled_dot_product_attention", lambda *a, **k: masked_attention(*a, **k, how="naive"),
      "exp(x) / sum(exp(x)), which overflows for large logits", None, id="naive_softmax"),
    W("scaled_dot_product_attention", lambda q, k, v, mask=None: explicit(q, k, v, mask, scale=d(q) ** -0.5,
      invert=True), "mask is inverted", None, id="inverted_mask"),
    W("scaled_dot_product_attention", lambda q, k, v, mask=None: explicit(q, k, v, mask, scale=d(q) ** -0.5, dim=-2),
      "over the queries (dim=-2)", None, id="softmax_dim"),
    W("split_heads", lambda x, h: x.view(x.shape[0], h, x.shape[1], -1), "plain reshape", None, id="view"),
    W("split_heads", lambda x, h: x.view(*x.shape[:2], -1, h).permute(0, 3, 1, 2), "split (d h)", None, id="d_h"),
    W("hard_distillation_loss", lambda c, d, t, y, alpha=0.5: (1 - alpha) * F.cross_entropy(c, y)
      + alpha * F.cross_entropy(c, t.argmax(1)), "supervise the class head", 9, id="cls_head"),
    W("hard_distillation_loss", lambda c, d, t, y, alpha=0.5: F.cross_entropy(c, t.argmax(1)),
      "teacher_labels) alone, so the true labels", 9, id="cls_only"),
    W("hard_distillation_loss", lambda c, d, t, y, alpha=0.5: hard_ok(d, c, t, y, alpha), "targets are swapped", 9,
      id="swapped_heads"),
    W("hard_distillation_loss", lambda c, d, t, y, alpha=0.5: hard_ok(c, d, t, y), "alpha is ignored", None,
      id="alpha_ignored"),
    W("hard_distillation_loss", lambda c, d, t, y, alpha=0.5: (1 - alpha) * naive_ce(c, y, "softmax")
      + alpha * naive_ce(d, t.argmax(1), "softmax"), "the loss is NaN for large logits", None, id="naive_softmax"),
    W("hard_distillation_loss", lambda c, d, t, y, alpha=0.5: (1 - alpha) * naive_ce(c, y, "log_of_softmax")
      + alpha * naive_ce(d, t.argmax(1), "log_of_softmax"), "the loss is inf for large logits", None,
      id="log_of_softmax"),
    W("hard_distillation_loss", lambda c, d, t, y, alpha=0.5: hard_ok(c, d, t, y, 1 - alpha), "alpha weights the wrong",
      None, id="swapped_alpha"),
    W("hard_distillation_loss", lambda c, d, t, y, alpha=0.5: (1 - alpha) * F.cross_entropy(c, y)
      + alpha * F.cross_entropy(d, t.softmax(1)), "teacher's probabilities", None, id="probabilities"),
    W("soft_distillation_loss", lambda *a, **k: soft_ok(*a, **k, head="cls"), "supervises the class head", 9,
      id="cls_head"),
    W("soft_distillation_loss", lambda c, d, t, y, *, alpha, tau: (1 - alpha) * F.cross_entropy(c, y)
      + alpha * F.kl_div(F.softmax(d / tau, 1), F.softmax(t / tau, 1), reduction="sum") * tau**2 / d.numel(),
      "got the student's probabilities", None, id="kl_div_probabilities"),
    W("soft_distillation_loss", lambda c, d, t, y, *, alpha, tau: (1 - alpha) * F.cross_entropy(c, y)
      + alpha * F.kl_div(F.log_softmax(d / tau, 1), F.log_softmax(t / tau, 1), reduction="sum") * tau**2 / d.numel(),
      "log_target=True is missing", None, id="log_target_missing"),
    W("soft_distillation_loss", lambda c, d, t, y, *, alpha, tau: soft_ok(c, d, t * tau, y, alpha, tau),
      "teacher's logits are not divided by tau", None, id="teacher_tau"),
    W("soft_distillation_loss", lambda *a, **k: soft_by_hand(*a, **k, how="naive"), "the loss is NaN for large logits",
      None, id="naive_softmax"),
    W("soft_distillation_loss", lambda *a, **k: soft_by_hand(*a, **k, how="log_of_softmax"),
      "the loss is NaN for large logits", None, id="log_of_softmax"),  # kl_div's 0 * -inf where p = 0
    W("soft_distillation_loss", lambda *a, **k: soft_ok(*a, **k, reverse=True), "KL divergence is reversed", None,
      id="reversed"),
    W("soft_distillation_loss", lambda *a, **k: soft_ok(*a, **k, tau_squared=False), "not multiplied by tau**2", None,
      id="tau_squared"),
    W("soft_distillation_loss", lambda *a, **k: soft_ok(*a, **k, divide_by="batch"), "reduction='batchmean'", None,
      id="batchmean"),
    W("layer_scale_init", lambda i, depth: layer_scale_ok(i, i + 1), "follows the layer index", 10, id="note"),
    W("layer_scale_init", lambda i, depth: layer_scale_ok(i, depth + 2), "class-attention blocks are counted", None,
      id="plus_two"),
    W("layer_scale_init", lambda i, depth: 0.1 if depth < 18 else 1e-5 if depth < 24 else 1e-6, "exactly 18", None,
      id="strict"),
    W("layer_scale_init", lambda i, depth: 1e-5, "1e-5 whatever the depth", None, id="constant"),
    W("class_attention", lambda *a: class_attention_ok(*a, kv="patches"), "leave out the cls token", None,
      id="patches_only"),
    W("class_attention", lambda x, wq, wk, wv, h: class_attention_ok(x, wq.T, wk.T, wv.T, h), "used transposed", None,
      id="transposed"),
    W("class_attention", lambda x, wq, wk, wv, h: class_attention_ok(x, wq, wk, wv, 1), "one head over all C", None,
      id="one_head"),
    W("class_attention", lambda *a: class_attention_ok(*a, scale="embed"), "scaled by C**-0.5", None, id="scale"),
    W("squeezed_kv_projection", lambda x, g, w, s: F.conv2d(x.reshape(x.shape[0], -1, *g), w, stride=s, padding=1,
      groups=x.shape[-1]).flatten(2).transpose(1, 2), "reshaped straight to (B, C, H, W)", None, id="naive_map"),
    W("squeezed_kv_projection", lambda x, g, w, s: squeezed_ok(x, g, w, s).transpose(1, 2).reshape(x.shape[0], -1,
      x.shape[-1]), "reshaped straight back", None, id="naive_tokens"),
    W("squeezed_kv_projection", lambda *a: squeezed_ok(*a, padding=0), "not padded", None, id="no_padding"),
    W("squeezed_kv_projection", lambda x, g, w, s: F.conv2d(x.transpose(1, 2).reshape(x.shape[0], -1, g[1], g[0])
      .transpose(2, 3), w, stride=s, padding=w.shape[-1] // 2, groups=x.shape[-1]).transpose(2, 3).flatten(2)
      .transpose(1, 2),
      "height and width are swapped", None, id="swapped_grid"),
    W("squeezed_kv_projection", lambda *a: padded_squeeze(*a, how="reflect"), "padded by reflection", None,
      id="reflect"),
    W("squeezed_kv_projection", lambda *a: padded_squeeze(*a, how="replicate"), "repeating its border", None,
      id="replicate"),
    W("squeezed_kv_projection", lambda *a: padded_squeeze(*a, how="same"), "lopsided", None, id="same"),
    *(W("squeezed_kv_projection", lambda *a, how=how: padded_squeeze(*a, how=how), words, None, id=how)
      for how, words in (("before", "top and left only"), ("after", "bottom and right only"), ("twice", "twice"))),
    W("squeezed_kv_projection", lambda *a: squeezed_ok(*a, padding=1), "hard-coded", None, id="padding_1"),
    W("squeezed_kv_projection", lambda x, g, w, s: squeezed_ok(x, g[::-1], w, s), "unpacked as (W, H)", None,
      id="grid_w_h"),
    W("levit_bias_indices", xy_levit_idx, "indexing='xy'", 13, id="meshgrid_xy"),
    W("levit_bias_indices", signed_levit_idx, "signed offsets", None, id="signed"),
    W("levit_attention_logits", lambda q, k, b, s: (q @ k.transpose(-2, -1) + b) * s, "added before scaling", 14,
      id="bias_before_scale"),
    W("levit_attention_logits", lambda q, k, b, s: q @ k.transpose(-2, -1) * s + b / s, "the bias is rescaled", 14,
      id="bias_rescaled"),
    W("levit_attention_logits", lambda *a: levit_logits_ok(*a).softmax(-1), "after the softmax", None, id="softmax"),
    W("levit_attention_logits", lambda q, k, b, s: q @ k.transpose(-2, -1) / s + b, "divided by scale", None,
      id="divided"),
    W("levit_attention_logits", lambda q, k, b, s: q @ k.transpose(-2, -1) * s, "bias is missing", None,
      id="no_bias"),
]  # fmt: skip

NAMES = sorted(SOLUTIONS)
# Every check the package exports.
EXPORTED = sorted(n for n in checks.__all__ if n != "CheckResult")


# ---------------------------------------------------------------- every check


@pytest.mark.parametrize("name", NAMES)
def test_correct_solution_passes(capsys: pytest.CaptureFixture[str], name: str) -> None:
    assert_passes(capsys, name, SOLUTIONS[name])


@pytest.mark.parametrize(("name", "fn", "words", "pitfall"), WRONG)
def test_known_wrong_answer_fails_with_its_message(
    capsys: pytest.CaptureFixture[str], name: str, fn: Callable[..., Any], words: str, pitfall: int | None
) -> None:
    assert_named_mistake(capsys, name, fn, words, pitfall)


@pytest.mark.parametrize("name", EXPORTED)
def test_stub_is_not_implemented_yet(capsys: pytest.CaptureFixture[str], name: str) -> None:
    def stub(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    result, line = run(capsys, name, stub)
    assert not result and result.status == "not implemented"
    assert line == f"TODO {name}: not implemented yet"


@pytest.mark.parametrize("name", NAMES)
def test_crash_is_a_failure_that_names_the_exception(capsys: pytest.CaptureFixture[str], name: str) -> None:
    def crashes(*args: Any, **kwargs: Any) -> Any:
        return 1 / 0

    result, line = run(capsys, name, crashes)
    assert not result and result.status == "failed"
    assert re.fullmatch(rf"FAIL {name} \[case 1/\d+: .+\]: raised ZeroDivisionError: division by zero", line)


@pytest.mark.parametrize("name", NAMES)
def test_wrong_shape_says_expected_and_got(capsys: pytest.CaptureFixture[str], name: str) -> None:
    result, line = run(capsys, name, lambda *args, **kwargs: torch.zeros(3, 1))
    assert not result
    if name in NUMBER_CHECKS:
        assert line.endswith("expected one number, got a tensor of shape (3, 1)")
    else:
        assert re.search(r"expected shape \([\d, ]*\), got \(3, 1\)$", line), line


@pytest.mark.parametrize("name", NAMES)
def test_missing_return_and_wrong_type(capsys: pytest.CaptureFixture[str], name: str) -> None:
    result, line = run(capsys, name, lambda *args, **kwargs: None)
    assert not result and line.endswith("returned None (is a `return` missing?)")
    result, line = run(capsys, name, lambda *args, **kwargs: "answer")
    kind = "a number" if name in NUMBER_CHECKS else "a torch.Tensor"
    assert not result and line.endswith(f"expected {kind}, got str")


# ---------------------------------------------------------------- numerics: large logits and float precision

OTHER_RIGHT = [  # (check, a right answer written another way): each must pass
    W("scaled_dot_product_attention", lambda *a, **k: masked_attention(*a, **k), id="einsum_torch_softmax"),
    W("scaled_dot_product_attention", lambda *a, **k: masked_attention(*a, **k, how="max"), id="exp_minus_max"),
    W("scaled_dot_product_attention", lambda *a, **k: masked_attention(*a, **k, how="float64"), id="float64"),
    W("hard_distillation_loss", lambda c, d, t, y, alpha=0.5: hard_ok(c.double(), d.double(), t, y, alpha),
      id="hard_float64"),
    W("soft_distillation_loss", lambda *a, **k: soft_by_hand(*a, **k, how="target_probs"), id="kl_div_probabilities"),
    W("layer_scale_init", lambda i, depth: torch.tensor(layer_scale_ok(i, depth), dtype=torch.float32),
      id="layer_scale_float32"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "fn"), OTHER_RIGHT)
def test_right_answers_written_another_way_pass(capsys: pytest.CaptureFixture[str], name: str, fn: Any) -> None:
    assert_passes(capsys, name, fn)


NAIVE = [  # (check, an answer whose softmax or cross-entropy is written from the formula)
    W("scaled_dot_product_attention", lambda *a, **k: masked_attention(*a, **k, how="naive"), id="attention"),
    W("hard_distillation_loss", lambda c, d, t, y, alpha=0.5: (1 - alpha) * naive_ce(c, y, "softmax")
      + alpha * naive_ce(d, t.argmax(1), "softmax"), id="hard"),
    W("soft_distillation_loss", lambda *a, **k: soft_by_hand(*a, **k, how="naive"), id="soft"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "fn"), NAIVE)
def test_a_softmax_that_overflows_fails_on_the_large_logit_case_only(
    capsys: pytest.CaptureFixture[str], name: str, fn: Any
) -> None:
    """exp(x) / sum(exp(x)) is right for small logits and NaN past ~88 in float32: one case, named."""
    result, line = run(capsys, name, fn)
    assert not result and result.cases_total is not None and result.cases_passed == result.cases_total - 1
    assert result.case is not None and "large logits" in result.case and "overflows" in line, line


# ---------------------------------------------------------------- the machinery


def test_not_a_function(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, "patchify", 3)
    assert not result and line == "FAIL patchify: expected a function to check, got int"


def test_an_unknown_wrong_answer_reports_the_largest_error(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, "scaled_dot_product_attention", lambda q, k, v, mask=None: v)
    assert not result and result.pitfall is None
    assert re.search(r"\[case 1/5: q, k, v \(1, 2, 4, 8\)\]: values differ from the reference: max error [\d.e+-]+ "
                     r"at index \(\d, \d, \d, \d\) \(expected [-\d.e+]+, got [-\d.e+]+\)$", line), line  # fmt: skip


def test_not_implemented_in_a_later_case_names_the_case(capsys: pytest.CaptureFixture[str]) -> None:
    def no_mask_yet(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        if mask is not None:
            raise NotImplementedError("masks come next")
        return attention_ok(q, k, v)

    result, line = run(capsys, "scaled_dot_product_attention", no_mask_yet)
    assert not result and result.status == "not implemented"
    assert line.startswith("TODO scaled_dot_product_attention [case 3/5: ") and line.endswith("not implemented yet")


def test_a_check_does_not_catch_keyboard_interrupt() -> None:
    def interrupted(*args: Any) -> Any:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        checks.t2t_token_count(interrupted)


def test_in_place_edits_of_the_inputs_do_not_leak_between_calls(capsys: pytest.CaptureFixture[str]) -> None:
    def unscaled_then_zeroes_its_inputs(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        out = explicit(q, k, v, mask, scale=1.0)
        q.zero_()  # the known wrong answers must still see the case's inputs
        k.zero_()
        return out

    result, line = run(capsys, "scaled_dot_product_attention", unscaled_then_zeroes_its_inputs)
    assert result.pitfall == 3 and "not scaled" in line


def test_wrong_answers_agreeing_on_one_case_are_told_apart_by_the_others(capsys: pytest.CaptureFixture[str]) -> None:
    # At depth 18, "depth + 2" and "depth < 18" both give 1e-5; depth 17 tells them apart.
    strict = next(p.values[1] for p in WRONG if p.id == "strict")
    _, line = run(capsys, "layer_scale_init", strict)
    assert "depth=18]" in line and "exactly 18" in line


def test_index_checks_want_an_integer_tensor(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, "levit_bias_indices", lambda r: levit_idx_ok(r).float())
    assert not result and line.endswith("expected an integer tensor (e.g. torch.long), got torch.float32")


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bool])
def test_index_checks_refuse_a_mask_dtype(capsys: pytest.CaptureFixture[str], dtype: torch.dtype) -> None:
    """uint8 (or bool) indices select by True/False: right values in that dtype still fail, named."""
    result, line = run(capsys, "levit_bias_indices", lambda r: levit_idx_ok(r).to(dtype))
    assert not result and f"the indices are {dtype}, which PyTorch reads as a mask" in line, line
    assert_passes(capsys, "levit_bias_indices", lambda r: levit_idx_ok(r).int())  # int32 indexes like long


def soft_split_ok(x: Tensor, kernel: int, stride: int, padding: int) -> Tensor:
    return nn.Unfold(kernel, stride=stride, padding=padding)(x).permute(0, 2, 1)


def cross_ok(q: Tensor, k: Tensor, v: Tensor, key_lengths: Tensor) -> Tensor:
    mask = (torch.arange(k.shape[2]) < key_lengths[:, None])[:, None, None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def under_no_grad(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    def answer(*args: Any, **kwargs: Any) -> Tensor:
        with torch.no_grad():
            return fn(*args, **kwargs)

    return answer


def rebuilt(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    return lambda *args, **kwargs: torch.tensor(fn(*args, **kwargs).tolist())


DETACHED = [
    W("soft_split", under_no_grad(soft_split_ok), id="soft_split_no_grad"),
    W("soft_split", rebuilt(soft_split_ok), id="soft_split_torch_tensor"),
    W("soft_split", lambda *a: soft_split_ok(*a).detach(), id="soft_split_detach"),
    W("padded_cross_attention", under_no_grad(cross_ok), id="cross_no_grad"),
    W("padded_cross_attention", rebuilt(cross_ok), id="cross_torch_tensor"),
    W("hard_distillation_loss", under_no_grad(hard_ok), id="loss_no_grad"),
]


@pytest.mark.parametrize(("name", "fn"), DETACHED)
def test_a_detached_answer_fails_and_is_named(capsys: pytest.CaptureFixture[str], name: str, fn: Any) -> None:
    """Right values that autograd cannot reach (no_grad, detach, torch.tensor) fail on the gradient case only."""
    result, line = run(capsys, name, fn)
    assert not result and result.cases_passed == (result.cases_total or 0) - 1
    assert "with gradients]: detached: no gradient reaches the inputs" in line, line
    assert_passes(capsys, name, {"soft_split": soft_split_ok, "padded_cross_attention": cross_ok}.get(name, hard_ok))


def test_check_result_is_truthy_only_when_passed() -> None:
    assert CheckResult("x", "passed", "PASS x")
    assert not CheckResult("x", "failed", "FAIL x")
    assert not CheckResult("x", "not implemented", "TODO x")


# ---------------------------------------------------------------- the definitions are vitlab's


def test_class_attention_definition_is_the_models_class_attn() -> None:
    torch.manual_seed(0)
    layer = ClassAttn(12, num_heads=3, qkv_bias=False, fused_attn=False).eval()
    layer.proj = nn.Identity()  # pyright: ignore[reportAttributeAccessIssue]
    x = torch.randn(2, 7, 12)
    with torch.no_grad():
        expected = layer(x)
    got = class_attention_ok(x, layer.q.weight, layer.k.weight, layer.v.weight, 3)
    torch.testing.assert_close(got, expected)


def test_squeezed_kv_definition_is_the_models_conv_projection() -> None:
    torch.manual_seed(0)
    layer = ConvProjection(6, kernel_size=3, stride=2).eval()
    layer.bn = nn.Identity()  # pyright: ignore[reportAttributeAccessIssue]
    x = torch.randn(2, 5 * 7, 6)
    with torch.no_grad():
        expected = layer(rearrange(x, "B (H W) C -> B C H W", H=5))
    torch.testing.assert_close(squeezed_ok(x, (5, 7), layer.conv.weight.detach(), 2), expected)


# ---------------------------------------------------------------- partial credit and results as data


def right_count(n: int, k: int, s: int, p: int) -> int:
    return (n + 2 * p - k) // s + 1


def test_every_case_runs_and_the_fraction_is_the_partial_credit(capsys: pytest.CaptureFixture[str]) -> None:
    def wrong_at_224(n: int, k: int, s: int, p: int) -> int:
        return 0 if n == 224 else right_count(n, k, s, p)

    result, line = run(capsys, "t2t_token_count", wrong_at_224)
    total = result.cases_total
    assert total is not None and total >= 4
    assert result.status == "failed" and result.cases_passed == total - 1
    assert result.fraction == pytest.approx((total - 1) / total)
    assert line == f"FAIL t2t_token_count [case 1/{total}: {result.case}]: expected 56, got 0"  # the first failure


def test_a_crash_in_one_case_costs_that_case_only(capsys: pytest.CaptureFixture[str]) -> None:
    def crashes_at_56(n: int, k: int, s: int, p: int) -> int:
        if n == 56:
            raise ValueError("boom")
        return right_count(n, k, s, p)

    result, line = run(capsys, "t2t_token_count", crashes_at_56)
    assert result.status == "failed" and "[case 2/" in line and line.endswith("raised ValueError: boom")
    assert result.cases_passed == (result.cases_total or 0) - 1


def test_a_stub_and_a_non_function_score_zero(capsys: pytest.CaptureFixture[str]) -> None:
    def stub(*args: Any) -> Any:
        raise NotImplementedError

    result, _ = run(capsys, "t2t_token_count", stub)
    assert (result.status, result.cases_passed, result.fraction) == ("not implemented", 0, 0.0)
    result, _ = run(capsys, "t2t_token_count", 3)
    assert result.fraction == 0.0


def test_a_known_mistake_is_still_named_when_every_case_runs(capsys: pytest.CaptureFixture[str]) -> None:
    result, line = run(capsys, "t2t_token_count", lambda n, k, s, p: (n + 2 * p - k) / (k - s) + 1)
    assert result.pitfall == 11 and "Pitfall 11: " in line
    assert result.cases_passed is not None and 0 <= result.fraction < 1


def test_the_result_as_data_is_json_and_the_same_on_every_run(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from vitlab.checks._core import DATA_VERSION

    first, _ = run(capsys, "scaled_dot_product_attention", attention_ok)
    again, _ = run(capsys, "scaled_dot_product_attention", attention_ok)
    data = first.to_dict()
    assert json.dumps(data, sort_keys=True) == json.dumps(again.to_dict(), sort_keys=True)
    assert data == json.loads(json.dumps(data))
    assert data["version"] == DATA_VERSION and data["status"] == "passed" and data["message"] == first.message
    assert data["cases_passed"] == data["cases_total"] and data["fraction"] == 1.0


def test_under_the_grader_a_check_shows_its_line_and_its_data(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With VITLAB_CHECK_DATA=1 in IPython: one display with the same text/plain line and the JSON."""
    import IPython.core.getipython
    import IPython.display

    from vitlab.checks._core import DATA_ENV, DATA_MIME

    shown: list[tuple[dict[str, Any], bool]] = []
    monkeypatch.setattr(IPython.display, "display", lambda data, raw=False: shown.append((data, raw)))
    monkeypatch.setattr(IPython.core.getipython, "get_ipython", lambda: object())
    monkeypatch.setenv(DATA_ENV, "1")
    result = checks.t2t_token_count(lambda n, k, s, p: (n + 2 * p - k) // s)
    assert capsys.readouterr().out == ""  # shown, not printed
    ((data, raw),) = shown
    assert raw and set(data) == {"text/plain", DATA_MIME}
    assert data["text/plain"] == result.message and data[DATA_MIME] == result.to_dict()
    monkeypatch.setattr(IPython.core.getipython, "get_ipython", lambda: None)  # plain Python: printed
    checks.t2t_token_count(right_count)
    assert capsys.readouterr().out.startswith("PASS t2t_token_count") and len(shown) == 1
