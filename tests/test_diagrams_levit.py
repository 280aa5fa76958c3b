"""Chapter 10's figure: its numbers are the model's, checked by running the model stage by stage."""

from __future__ import annotations

import shutil

import pytest
import torch

import vitlab
from vitlab.diagrams import numbers_in
from vitlab.diagrams.levit import levit_figure

pytestmark = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")


def test_levit_figure_numbers_are_the_models() -> None:
    name = "levit_128s"
    model = vitlab.create_model(name).eval()
    d = levit_figure(name)
    texts = "\n".join(d.texts)
    expected = {1000, 224, 3, 2, 4}
    with torch.no_grad():
        fmap = model.stem(torch.zeros(1, 3, 224, 224))
        convs = [m for m in model.stem.modules() if isinstance(m, torch.nn.Conv2d)]
        chain = " → ".join(str(c) for c in [3] + [c.out_channels for c in convs])
        assert chain + " channels" in texts
        expected |= {c.out_channels for c in convs} | {convs[0].kernel_size[0], convs[0].stride[0]}
        x = fmap.flatten(2).transpose(1, 2)
        expected |= set(fmap.shape[1:])
        for number, stage in enumerate(model.stages, start=1):
            n_in = x.shape[1]
            if stage.downsample is not None and not isinstance(stage.downsample, torch.nn.Identity):
                shrink = stage.downsample.attn_downsample
                y = shrink(x)
                assert f"shrink attention: {shrink.num_heads} heads" in texts
                assert f"{n_in} keys → {y.shape[1]} queries" in texts
                expected |= {shrink.num_heads, y.shape[1]}
            x = stage(x)
            attn = stage.blocks[0].attn
            N, C = x.shape[1:]
            hidden = stage.blocks[0].mlp.ln1.linear.out_features
            assert f"{attn.num_heads} heads, key {attn.key_dim}, value {attn.val_dim}" in texts
            assert f"{N} × {C}" in texts and f"MLP {C} → {hidden} → {C}" in texts
            assert f"stage {number} (× {len(stage.blocks)})" in texts
            expected |= {N, C, hidden, attn.num_heads, attn.key_dim, attn.val_dim, len(stage.blocks)}
            expected.add(number)
    assert numbers_in(d.texts) <= expected, numbers_in(d.texts) - expected


def test_levit_figure_fits_the_column() -> None:
    width, _ = vitlab.diagrams.png_size(levit_figure().png())
    assert width <= 1120
