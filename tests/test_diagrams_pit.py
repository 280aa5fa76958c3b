"""Chapter 9's figure: its numbers are the model's, checked by running the model stage by stage."""

from __future__ import annotations

import shutil

import pytest
import torch

import vitlab
from vitlab.diagrams import numbers_in
from vitlab.diagrams.pit import pit_figure

pytestmark = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")


def test_pit_figure_numbers_are_the_models() -> None:
    name = "pit_s_224"
    model = vitlab.create_model(name).eval()
    cfg = model.config
    d = pit_figure(name)
    texts = "\n".join(d.texts)
    expected = {1000, cfg.img_size, cfg.in_chans, cfg.patch_size, cfg.patch_stride}
    with torch.no_grad():
        x = model.patch_embed(torch.zeros(1, 3, cfg.img_size, cfg.img_size)) + model.pos_embed
        cls = model.cls_token
        for i, stage in enumerate(model.transformers):
            if stage.pool is not None:
                conv = stage.pool.conv
                assert conv.groups == conv.in_channels and conv.out_channels == 2 * conv.in_channels
                assert f"(groups={conv.in_channels}) {conv.in_channels} → {conv.out_channels} channels" in texts
                assert f"Linear {stage.pool.fc.in_features} → {stage.pool.fc.out_features}" in texts
            side_in = x.shape[-1]
            x, cls = stage(x, cls)
            B, C, H, W = x.shape
            heads = stage.blocks[0].attn.num_heads
            assert f"{1 + H * W} × {C}" in texts
            assert f"ViT block × {len(stage.blocks)}\n{heads} heads × {C // heads}\n{H}×{W} grid" in texts
            expected |= {1 + H * W, C, H, W, heads, C // heads, len(stage.blocks), side_in}
            if i == len(model.transformers) - 1:
                expected.add(C)
    assert "new: pooling" in texts and "new: conv stem" in texts
    assert numbers_in(d.texts) <= expected | {2, 3, 1}, numbers_in(d.texts) - expected


def test_pit_figure_fits_the_column() -> None:
    width, height = vitlab.diagrams.png_size(pit_figure().png())
    assert width <= 1120  # shown at 1/2 scale, at most 560 CSS px wide: not shrunk
    assert height / 2 <= 1100  # CSS px at 1280 px: shorter than a laptop screen
