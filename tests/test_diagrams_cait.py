"""Chapter 6's figure: every number on it is the model's (config and a real forward pass)."""

from __future__ import annotations

import torch

import vitlab
from vitlab.diagrams import numbers_in, png_size
from vitlab.diagrams.cait import cait_figure


def test_cait_figure_numbers_are_the_models() -> None:
    name = "cait_xxs24_224"
    cfg = vitlab.get_config(name)
    with torch.device("meta"):  # a forward pass on the meta device: real shapes, no compute
        model = vitlab.create_model(name).eval()
    x = torch.zeros(1, 3, cfg.img_size, cfg.img_size, device="meta")
    with torch.no_grad():
        patches = model.forward_patches(x)  # (1, N, D) after the self-attention stage
        features = model.forward_features(x)  # (1, 1 + N, D)
        logits = model(x)
    N, D = patches.shape[1:]
    d = cait_figure(name)
    texts = "\n".join(d.texts)
    assert f"{N} × {D}" in texts and f"1 × {D}" in texts and f"{1 + N} × {D}" in texts
    assert f"block × {cfg.depth}" in texts and f"block × {cfg.depth_token_only}" in texts
    assert f"{cfg.num_heads} heads × {D // cfg.num_heads}" in texts
    assert f"map 1 × {features.shape[1]}" in texts
    assert f"{D} → {int(D * cfg.mlp_ratio)} → {D}" in texts
    assert f"{cfg.init_values:g}" in texts and str(logits.shape[-1]) in d.texts
    expected = {3, cfg.img_size, cfg.patch_size, N, D, 1 + N, 1, cfg.depth, cfg.depth_token_only, cfg.num_heads,
                D // cfg.num_heads, int(D * cfg.mlp_ratio), logits.shape[-1], 2, 5, 0}  # fmt: skip
    assert numbers_in(d.texts) <= expected | {int(s) for s in name if s.isdigit()} | {24, 224}
    # what CaiT changes against ViT is highlighted, and the figure fits the column
    assert sum(t.startswith("new:") for t in d.texts) >= 4
    assert png_size(d.png())[0] <= 1120
