"""vitlab.checks.layer_scale_init and class_attention: right answers pass, each known
mistake is named, and the class-attention definition is vitlab's layer.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_checks import (  # run: one printed line and a CheckResult
    assert_named_mistake,
    assert_passes,
    class_attention_ok,
    run,
)
from torch import nn

import vitlab

# ---------------------------------------------------------------- right answers, written independently


def layer_scale_ok(layer_index: int, depth: int) -> float:
    return 0.1 if depth <= 18 else 1e-5 if depth <= 24 else 1e-6


def test_right_answers_pass(capsys: pytest.CaptureFixture[str]) -> None:
    assert_passes(capsys, "layer_scale_init", layer_scale_ok)
    assert_passes(capsys, "class_attention", class_attention_ok)


W = pytest.param  # (check, student function, words, erratum)
WRONG = [
    W("layer_scale_init", lambda i, depth: layer_scale_ok(i, i + 1), "follows the layer index", 8, id="note"),
    W("layer_scale_init", lambda i, depth: layer_scale_ok(i, depth + 2), "class-attention blocks are counted", None,
      id="ca_counted"),
    W("layer_scale_init", lambda i, depth: 0.1 if depth < 18 else 1e-5 if depth < 24 else 1e-6, "exactly 18", None,
      id="strict"),
    W("layer_scale_init", lambda i, depth: 1e-5, "1e-5 whatever the depth", None, id="constant"),
    W("class_attention", lambda *a: class_attention_ok(*a, kv="patches"), "leave out the cls token", None,
      id="patches_only"),
    W("class_attention", lambda x, wq, wk, wv, h: class_attention_ok(x, wq.T, wk.T, wv.T, h), "used transposed",
      None, id="transposed"),
    W("class_attention", lambda x, wq, wk, wv, h: class_attention_ok(x, wq, wk, wv, 1), "one head over all C", None,
      id="one_head"),
    W("class_attention", lambda *a: class_attention_ok(*a, scale="embed"), "scaled by C**-0.5", None, id="scale"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "fn", "words", "erratum"), WRONG)
def test_each_known_mistake_is_named(
    capsys: pytest.CaptureFixture[str], name: str, fn: Any, words: str, erratum: int | None
) -> None:
    assert_named_mistake(capsys, name, fn, words, erratum)


def test_depth_17_tells_two_mistakes_apart(capsys: pytest.CaptureFixture[str]) -> None:
    # At depth 18, "depth + 2" and "depth < 18" both give 1e-5; depth 17 tells them apart.
    _, line = run(capsys, "layer_scale_init", lambda i, depth: 0.1 if depth < 18 else 1e-5 if depth < 24 else 1e-6)
    assert "depth=18]" in line and "exactly 18" in line


def test_class_attention_definition_is_the_models_layer() -> None:
    torch.manual_seed(0)
    model = vitlab.create_model("cait_xxs24_224", depth=1, embed_dim=12, num_heads=3).eval()
    layer = model.blocks_token_only[0].attn
    with torch.no_grad():
        for lin in (layer.q, layer.k, layer.v):
            if lin.bias is not None:
                lin.bias.zero_()
        layer.proj = nn.Identity()
        x = torch.randn(2, 7, 12)
        expected = layer(x)
    got = class_attention_ok(x, layer.q.weight, layer.k.weight, layer.v.weight, 3)
    torch.testing.assert_close(got, expected)
