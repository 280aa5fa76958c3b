"""The DeepViT chapter's figure writes the numbers of the model it names.

Each expected number is computed here from the model itself (a forward pass or its
config), not by the figure function, so the figure cannot drift.
"""

from __future__ import annotations

import shutil

import pytest
import torch

import vitlab
from vitlab.diagrams import numbers_in, png_size
from vitlab.diagrams.deepvit import deepvit_figure
from vitlab.models.deepvit import ReAttention

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
MAX_PNG_WIDTH = 1120  # 560 CSS px at the figures' 2x resolution


def test_deepvit_figure_numbers() -> None:
    name = "deepvit_s"
    cfg = vitlab.get_config(name)
    model = vitlab.create_model(name).eval()
    image = torch.zeros(1, cfg.in_chans, cfg.img_size, cfg.img_size)
    with torch.no_grad():
        tokens = model.embed(image)  # (1, 1 + N, D)
        maps = [m.attn for m in vitlab.attention_maps(model, image)]  # depth x (1, h, T, T)
        logits = model(image)
        hidden = model.blocks[-1].mlp.fc1(tokens).shape[-1]
    T, D = tokens.shape[1:]
    kinds = [type(block.attn) is ReAttention for block in model.blocks]
    n_re, n_plain = sum(kinds), len(kinds) - sum(kinds)
    assert kinds == [False] * n_plain + [True] * n_re
    h = maps[-1].shape[1]
    texts = deepvit_figure(name).texts
    joined = "\n".join(texts)
    assert f"{T - 1} × {D}" in texts and f"{T} × {D}" in texts
    assert f"{h} × {T} × {T}" in texts
    assert f"ViT block × {n_plain}" in joined and f"re-attention block × {n_re}" in texts
    assert f"Θ ({h} × {h})" in joined and f"BatchNorm2d({h}): each head's map" in joined
    assert f"{h} heads × {D // h}" in joined and f"{D} → {hidden} → {D}" in joined
    assert str(logits.shape[-1]) in texts
    stem = model.patch_embed
    stem_numbers = {
        stem.conv1.kernel_size[0],
        stem.conv1.stride[0],
        stem.conv2.kernel_size[0],
        stem.proj.kernel_size[0],
    }
    assert numbers_in(texts) == {
        cfg.in_chans, cfg.img_size, T - 1, T, D, n_plain, n_re, h, D // h, hidden, logits.shape[-1],
    } | stem_numbers  # fmt: skip


@needs_dot
def test_deepvit_figure_fits_the_column() -> None:
    width, _ = png_size(deepvit_figure().png())
    assert width <= MAX_PNG_WIDTH
