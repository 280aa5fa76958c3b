"""Chapter 7's figure: grids, token counts and widths are the model's (real forward pass)."""

from __future__ import annotations

import math

import torch

import vitlab
from vitlab.diagrams import png_size
from vitlab.diagrams.t2t_vit import t2t_figure


def test_t2t_figure_numbers_are_the_models() -> None:
    name = "t2t_vit_14"
    cfg = vitlab.get_config(name)
    with torch.device("meta"):  # a forward pass on the meta device: real shapes, no compute
        model = vitlab.create_model(name).eval()
    t2t = model.tokens_to_token
    x = torch.zeros(1, 3, cfg.img_size, cfg.img_size, device="meta")
    with torch.no_grad():  # the module's steps by hand, as the chapter writes them
        t0 = t2t.soft_split0(x).transpose(1, 2)  # (1, L0, 147)
        y0 = t2t.attention1(t0)
        s0 = int(math.isqrt(y0.shape[1]))
        t1 = t2t.soft_split1(y0.transpose(1, 2).reshape(1, -1, s0, s0)).transpose(1, 2)
        y1 = t2t.attention2(t1)
        s1 = int(math.isqrt(y1.shape[1]))
        t2 = t2t.soft_split2(y1.transpose(1, 2).reshape(1, -1, s1, s1)).transpose(1, 2)
        out = t2t.project(t2)
        assert out.shape == t2t(x).shape
        features = model.forward_features(x)
    texts = "\n".join(t2t_figure(name).texts)
    for t in (t0, t1, t2):
        L, width = t.shape[1:]
        side = math.isqrt(L)
        assert f"{side}×{side} = {L} tokens\n× {width}" in texts
    assert [math.isqrt(t.shape[1]) for t in (t0, t1, t2)] == list(cfg.grid_sizes)
    assert f"{t0.shape[-1]} → {y0.shape[-1]}" in texts and f"{t1.shape[-1]} → {y1.shape[-1]}" in texts
    assert f"{y0.shape[2]} × {s0} × {s0}" in texts and f"{y1.shape[2]} × {s1} × {s1}" in texts  # re-structurized
    # the splits are numbered 1, 2, 3, as in the chapter's headings and printouts
    assert all(f"soft split {i}:" in texts for i in (1, 2, 3)) and "soft split 0" not in texts
    assert f"Linear {t2.shape[-1]} → {out.shape[-1]}" in texts
    assert f"{features.shape[1]} × {cfg.embed_dim}" in texts and f"block × {cfg.depth}" in texts
    assert "unfold 7×7\nstride 4, padding 2" in texts and texts.count("unfold 3×3\nstride 2, padding 1") == 2
    assert png_size(t2t_figure(name).png())[0] <= 1120
