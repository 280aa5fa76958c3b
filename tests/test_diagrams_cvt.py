"""Chapter 11's figure: its numbers are the model's, checked by running the model's parts."""

from __future__ import annotations

import shutil

import pytest
import torch

import vitlab
from vitlab.diagrams import numbers_in
from vitlab.diagrams.cvt import cvt_figure

pytestmark = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")


def test_cvt_figure_numbers_are_the_models() -> None:
    name = "cvt_13"
    model = vitlab.create_model(name).eval()
    d = cvt_figure(name)
    texts = "\n".join(d.texts)
    expected = {1000, 224, 3, 2}
    x = torch.zeros(1, 3, 224, 224)
    with torch.no_grad():
        for i, stage in enumerate(model.stages):
            conv = stage.patch_embed.proj
            k, s = conv.kernel_size[0], conv.stride[0]
            tokens, (H, W) = stage.patch_embed(x)
            n, C = tokens.shape[1:]
            assert f"Conv {k}×{k}, stride {s} + LayerNorm" in texts
            attn = stage.blocks[0].attn
            keys = attn.conv_proj_k(tokens.transpose(1, 2).reshape(1, C, H, W)).shape[1]
            cls = 1 if stage.cls_token is not None else 0
            heads = attn.num_heads
            assert f"{heads} head{'s' if heads > 1 else ''}:\n{n + cls} queries, {keys + cls} keys" in texts
            # the tokens the blocks work on, and where the cls token joins
            assert f"{n + cls} × {C}" in texts
            assert (f"then prepend [cls]: {n} + 1 tokens" in texts) == bool(cls)
            hidden = stage.blocks[0].mlp.fc1.out_features
            assert f"MLP {C} → {hidden} → {C}" in texts and f"block × {len(stage.blocks)}" in texts
            expected |= {k, s, n, C, n + cls, keys + cls, heads, hidden, len(stage.blocks), i + 1}
            expected |= {attn.conv_proj_q.conv.kernel_size[0], attn.conv_proj_k.conv.stride[0]}
            x = stage(x)
            if isinstance(x, tuple):
                x = x[0]
    assert texts.count("prepend [cls]") == sum(s.cls_token is not None for s in model.stages) == 1
    assert numbers_in(d.texts) <= expected, numbers_in(d.texts) - expected


def test_cvt_figure_fits_the_column() -> None:
    width, height = vitlab.diagrams.png_size(cvt_figure().png())
    assert width <= 1120  # shown at 1/2 scale, at most 560 CSS px wide: not shrunk
    assert height / 2 <= 1100  # CSS px at 1280 px: shorter than a laptop screen
