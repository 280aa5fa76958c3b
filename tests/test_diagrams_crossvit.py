"""Chapter 8's figure: both branches' token counts and widths, and the fusion's, are the model's."""

from __future__ import annotations

import torch

import vitlab
from vitlab.diagrams import png_size
from vitlab.diagrams.crossvit import crossvit_figure


def test_crossvit_figure_numbers_are_the_models() -> None:
    name = "crossvit_tiny_240"  # the model the chapter computes with
    cfg = vitlab.get_config(name)
    with torch.device("meta"):  # a forward pass on the meta device: real shapes, no compute
        model = vitlab.create_model(name).eval()
    x = torch.zeros(1, 3, cfg.img_size, cfg.img_size, device="meta")
    with torch.no_grad():
        x_s, x_l = model.embed(x)  # [cls, patches] of each branch
        # the first encoder's cross-attention maps: S cls over L, L cls over S
        maps = [m.attn for m in vitlab.attention_maps(model, x) if m.kind == "cross"][:2]
        logits = model(x)
    d = crossvit_figure(name)
    texts = "\n".join(d.texts)
    (n_s, c_s), (n_l, c_l) = x_s.shape[1:], x_l.shape[1:]
    assert f"{n_s - 1} × {c_s}" in texts and f"{n_l - 1} × {c_l}" in texts  # patches
    assert f"{n_s} × {c_s}" in texts and f"{n_l} × {c_l}" in texts  # with [cls]
    assert f"map 1 × {maps[0].shape[-1]}" in texts and f"map 1 × {maps[1].shape[-1]}" in texts
    assert f"f: {c_s} → {c_l}" in texts and f"f: {c_l} → {c_s}" in texts
    assert f"g: {c_l} → {c_s}" in texts and f"g: {c_s} → {c_l}" in texts
    assert f"ViT block × {cfg.depth[0]}" in texts and f"ViT block × {cfg.depth[1]}" in texts
    assert f"encoder × {cfg.num_encoders}" in texts and str(logits.shape[-1]) in d.texts
    assert f"patch embedding {cfg.patch_size[0]}×" in texts and f"resized to {cfg.branch_img_size[1]} px" in texts
    assert "dashed: patch tokens, not fused" in texts  # the patches bypass the fusion
    assert png_size(d.png())[0] <= 1120
