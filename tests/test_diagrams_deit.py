"""The DeiT chapter's figure writes the numbers of the model it names.

Each expected number is computed here from the model itself (a forward pass or its
config), not by the figure function, so the figure cannot drift.
"""

from __future__ import annotations

import shutil

import pytest
import torch

import vitlab
from vitlab.diagrams import numbers_in, png_size
from vitlab.diagrams.deit import distilled_figure

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
MAX_PNG_WIDTH = 1120  # 560 CSS px at the figures' 2x resolution


@pytest.mark.parametrize("name", ["deit_tiny_distilled_patch16_224", "deit_small_distilled_patch16_224"])
def test_distilled_figure_numbers(name: str) -> None:
    cfg = vitlab.get_config(name)
    model = vitlab.create_model(name).train()
    image = torch.zeros(1, cfg.in_chans, cfg.img_size, cfg.img_size)
    with torch.no_grad():
        patches = model.patch_embed(image)  # (1, N, D)
        tokens = model.embed(image)  # (1, 2 + N, D)
        cls_logits, dist_logits = model(image)
        hidden = model.blocks[0].mlp.fc1(tokens).shape[-1]
    N, D = patches.shape[1:]
    T = tokens.shape[1]
    texts = distilled_figure(name).texts
    joined = "\n".join(texts)
    assert f"{N} × {D}" in texts and f"{T} × {D}" in texts and T == N + 2
    assert f"{cfg.num_heads} heads × {D // cfg.num_heads}" in joined
    assert f"{D} → {hidden} → {D}" in joined
    assert f"ViT block × {len(model.blocks)}" in joined
    assert "[cls, dist, patches]" in joined and "head_dist" in joined
    assert f"{cls_logits.shape[-1]} logits" in joined and dist_logits.shape == cls_logits.shape
    p = cfg.patch_size
    assert numbers_in(texts) == {
        cfg.in_chans, cfg.img_size, p, N, D, T, len(model.blocks), cfg.num_heads, D // cfg.num_heads,
        hidden, cls_logits.shape[-1], 0, 1, 2,  # "token 0", "token 1", "Conv2d"
    }  # fmt: skip


def test_distilled_figure_needs_a_distilled_preset() -> None:
    with pytest.raises(ValueError, match="distillation token"):
        distilled_figure("deit_tiny_patch16_224")


@needs_dot
def test_distilled_figure_fits_the_column() -> None:
    width, _ = png_size(distilled_figure().png())
    assert width <= MAX_PNG_WIDTH
