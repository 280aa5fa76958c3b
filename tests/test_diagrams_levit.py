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
        assert "between: " + chain in texts
        expected |= {c.out_channels for c in convs} | {convs[0].kernel_size[0], convs[0].stride[0]}
        x = fmap.flatten(2).transpose(1, 2)
        expected |= set(fmap.shape[1:])
        for number, stage in enumerate(model.stages, start=1):
            n_in = x.shape[1]
            if stage.downsample is not None and not isinstance(stage.downsample, torch.nn.Identity):
                shrink = stage.downsample.attn_downsample
                y = shrink(x)
                hidden = stage.downsample.mlp.ln1.linear.out_features
                assert f"shrink attention: {shrink.num_heads} heads,\nvalue {shrink.val_dim}" in texts
                assert f"{n_in} keys → {y.shape[1]} queries" in texts
                assert f"+ MLP {y.shape[2]} → {hidden} → {y.shape[2]}" in texts
                expected |= {shrink.num_heads, shrink.val_dim, y.shape[1], hidden}
            x = stage(x)
            attn = stage.blocks[0].attn
            N, C = x.shape[1:]
            hidden = stage.blocks[0].mlp.ln1.linear.out_features
            assert f"{attn.num_heads} heads, key {attn.key_dim}, value {attn.val_dim}" in texts
            assert f"{N} × {C}" in texts and f"MLP {C} → {hidden} → {C}" in texts
            assert f"stage {number}: block × {len(stage.blocks)}" in texts
            expected |= {N, C, hidden, attn.num_heads, attn.key_dim, attn.val_dim, len(stage.blocks)}
            expected.add(number)
    # the initial BatchNorm weights: 0 at the end of every residual branch, 1 after shrink attention
    block, shrink = model.stages[0].blocks[0], model.stages[1].downsample.attn_downsample
    zero = {block.attn.proj.bn.weight.unique().item(), block.mlp.ln2.bn.weight.unique().item()}
    one = shrink.proj.bn.weight.unique().item()
    assert zero == {0.0} and one == 1.0
    assert texts.count("last BN, γ = 0") == 2 and "last BN, γ = 1" in texts and "(last BN γ = 0)" in texts
    expected |= {0, 1}
    assert numbers_in(d.texts) <= expected, numbers_in(d.texts) - expected


def test_levit_figure_draws_the_residuals() -> None:
    """Two residual additions inside a block, none around shrink attention."""
    d = levit_figure()
    source = d.source()
    assert d.texts.count("+") == 2
    assert source.count("style=dashed") == 2  # the two skip connections
    assert "shrink attention\n(no residual)" in "\n".join(d.texts)


def test_levit_figure_fits_the_column() -> None:
    width, height = vitlab.diagrams.png_size(levit_figure().png())
    assert width <= 1120  # shown at 1/2 scale, at most 560 CSS px wide: not shrunk
    assert height / 2 <= 1100  # CSS px at 1280 px: shorter than a laptop screen
