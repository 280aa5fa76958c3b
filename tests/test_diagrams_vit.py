"""The figures of chapters 1-3 write the numbers of the model they name.

Each expected number is computed here from the model itself (a forward pass, its
parameters or its config), not by the figure function, so a figure cannot drift.
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest
import torch

import vitlab
from vitlab.diagrams import numbers_in, png_size
from vitlab.diagrams.vit import attention_figure, encoder_figure, patches_figure

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
MAX_PNG_WIDTH = 1120  # 560 CSS px at the figures' 2x resolution


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "vit_small_patch16_224"])
def test_patches_figure_numbers(name: str) -> None:
    cfg = vitlab.get_config(name)
    model: Any = vitlab.create_model(name).eval()
    image = torch.zeros(1, cfg.in_chans, cfg.img_size, cfg.img_size)
    with torch.no_grad():
        grid = model.patch_embed.proj(image)  # (1, D, h, w)
        tokens = model.embed(image)  # (1, 1 + N, D)
    _, width, grid_h, grid_w = grid.shape
    patch_len = cfg.patch_size**2 * cfg.in_chans
    texts = patches_figure(name).texts
    assert f"{grid_h} × {grid_w} grid" in "\n".join(texts)
    assert f"{grid_h * grid_w} × {patch_len} (N × P²C)" in texts
    assert f"{patch_len} → {width}" in "\n".join(texts)
    assert f"{tokens.shape[1]} × {tokens.shape[2]} ((1 + N) × D)" in texts
    shown = {cfg.in_chans, cfg.img_size, grid_h, grid_w, cfg.patch_size}
    shown |= {grid_h * grid_w, patch_len, width, tokens.shape[1]}
    assert numbers_in(texts) == shown | {1, 2}  # and "(1 + N)", "P²C"


@pytest.mark.parametrize("name", ["vit_small_patch16_224", "vit_tiny_patch16_224"])
def test_attention_figure_numbers(name: str) -> None:
    model: Any = vitlab.create_model(name).eval()
    cfg = model.config
    attn = model.blocks[0].attn
    image = torch.zeros(1, cfg.in_chans, cfg.img_size, cfg.img_size)
    with torch.no_grad():
        tokens = model.embed(image)
        _, attn_map = attn(model.blocks[0].norm1(tokens), return_attn=True)  # block 0's own map
    _, n_tokens, width = tokens.shape
    _, heads, _, _ = attn_map.shape
    texts = attention_figure(name).texts
    assert f"qkv: Linear {width} → {attn.qkv.out_features}" in texts
    assert f"{n_tokens} × {width // heads}" in texts  # one head's q, k, v
    assert f"{n_tokens} × {n_tokens}" in texts  # one head's map
    assert f"q kᵀ / √{width // heads}" in texts
    assert f"concatenate the {heads} heads" in texts
    assert f"proj: Linear {width} → {attn.proj.out_features}" in texts
    assert numbers_in(texts) == {n_tokens, width, 3 * width, width // heads, heads}


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "vit_small_patch16_224"])
def test_encoder_figure_numbers(name: str) -> None:
    model: Any = vitlab.create_model(name).eval()
    cfg = model.config
    image = torch.zeros(1, cfg.in_chans, cfg.img_size, cfg.img_size)
    with torch.no_grad():
        tokens = model.embed(image)
        logits = model(image)
    _, n_tokens, width = tokens.shape
    texts = encoder_figure(name).texts
    assert f"encoder block × {len(model.blocks)}" in texts
    assert f"{n_tokens} × {width}" in texts
    assert f"{n_tokens - 1} × {width}" in texts
    hidden = model.blocks[0].mlp.fc1.out_features
    assert f"MLP {width} → {hidden} → {width}\nGELU" in texts
    heads = model.blocks[0].attn.num_heads
    assert f"multi-head self-attention\n{heads} heads × {width // heads}" in texts
    assert str(logits.shape[-1]) in texts


def test_encoder_figure_final_norm_sees_every_token() -> None:
    """The final LayerNorm normalises all 1 + N tokens; only then is the [cls] token taken."""
    model: Any = vitlab.create_model("vit_tiny_patch16_224").eval()
    with torch.no_grad():
        features = model.forward_features(torch.zeros(1, 3, 224, 224))  # after the final norm
    source = encoder_figure("vit_tiny_patch16_224").source()
    edge = next(line for line in source.splitlines() if line.strip().startswith('"norm" -> "pick"'))
    assert f"{features.shape[1]} × {features.shape[2]}" in edge
    edge = next(line for line in source.splitlines() if line.strip().startswith('"pick" -> "head"'))
    assert f'" {features.shape[2]} "' in edge


def test_encoder_figure_residuals_start_at_the_block_input() -> None:
    """The first skip leaves from the block's input inside the repeated group, so it reads
    right for every block, not only the first."""
    source = encoder_figure().source()
    assert '"x_in" -> "add1" [style=dashed' in source
    assert '"add1" -> "add2" [style=dashed' in source
    group = source.split("subgraph cluster_1 {", 1)[1].split("}", 1)[0]
    assert '"x_in" [' in group


@needs_dot
@pytest.mark.parametrize("figure", [patches_figure, attention_figure, encoder_figure])
def test_figures_fit_the_column(figure) -> None:
    width, _ = png_size(figure().png())
    assert width <= MAX_PNG_WIDTH
