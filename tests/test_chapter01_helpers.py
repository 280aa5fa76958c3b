"""Chapter 1 (patches) claims not covered by test_layers.py: pixel orders, learned table, embed."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

import vitlab
from vitlab.layers import learned_position_embedding, patchify, sincos_2d_position_embedding, unpatchify


def test_patchify_and_unfold_hold_the_same_pixels_in_a_different_order() -> None:
    # einops orders a patch (p1 p2 C), F.unfold (C p1 p2); the patch order (h w) is the same.
    x = torch.randn(2, 3, 12, 20)
    unfolded = F.unfold(x, kernel_size=4, stride=4).transpose(1, 2)  # (B, N, C*P*P)
    assert unfolded.shape == patchify(x, 4).shape == (2, 15, 48)
    assert torch.equal(rearrange(unfolded, "B N (C p1 p2) -> B N (p1 p2 C)", C=3, p1=4), patchify(x, 4))
    assert not torch.equal(unfolded, patchify(x, 4))  # (view/permute agreeing: tests/test_layers.py)


def test_unpatchify_round_trip_on_a_non_square_grid() -> None:
    x = torch.randn(1, 3, 12, 20)
    assert torch.equal(unpatchify(patchify(x, 4), 4, (3, 5)), x)


def test_learned_position_embedding_is_a_small_trainable_table() -> None:
    # Pitfall 1: (1, N+1, D), one row per token including the cls token.
    torch.manual_seed(0)
    table = learned_position_embedding(197, 192)
    assert isinstance(table, nn.Parameter) and table.requires_grad
    assert table.shape == (1, 197, 192)
    assert abs(table.std().item() - 0.02) < 0.002
    assert abs(table.mean().item()) < 0.002


def test_sincos_2d_matches_the_formula_and_rows_share_half_the_vector() -> None:
    grid, dim = (5, 7), 16
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    omega = 10000.0 ** (-torch.arange(dim // 4, dtype=torch.float64) / (dim // 4))
    a_i = rows.flatten()[:, None].double() * omega
    a_j = cols.flatten()[:, None].double() * omega
    expected = torch.cat([a_i.sin(), a_i.cos(), a_j.sin(), a_j.cos()], dim=1).float()
    table = sincos_2d_position_embedding(grid, dim)
    torch.testing.assert_close(table, expected)
    torch.testing.assert_close(table.norm(dim=1), torch.full((35,), math.sqrt(dim / 2)))
    # sin a sin b + cos a cos b = cos(a - b): the similarity is half a row term, half a column term,
    # so two patches in the same row get 0.5 from the row half alone (the cross in the chapter's figure).
    sim = F.cosine_similarity(table[:, None].double(), table[None].double(), dim=-1)
    d_i = (rows.flatten()[:, None] - rows.flatten()[None]).double()[..., None] * omega
    d_j = (cols.flatten()[:, None] - cols.flatten()[None]).double()[..., None] * omega
    torch.testing.assert_close(sim, 0.5 * d_i.cos().mean(-1) + 0.5 * d_j.cos().mean(-1), atol=1e-6, rtol=0)


def test_vit_embed_is_patch_embed_then_cls_then_pos_embed() -> None:
    torch.manual_seed(0)
    model = vitlab.create_model("vit_tiny_patch16_224", depth=1).eval()
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        tokens = model.patch_embed(x)
        manual = torch.cat([model.cls_token.expand(2, -1, -1), tokens], dim=1) + model.pos_embed
        torch.testing.assert_close(model.embed(x), manual)
    assert manual.shape == (2, 197, 192)
