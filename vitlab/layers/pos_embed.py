"""Position embeddings: learned (ViT) and fixed 2-D sine-cosine (MAE, T2T-ViT's 1-D variant)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sincos_1d_position_embedding(num_positions: int, dim: int, temperature: float = 10000.0) -> Tensor:
    """The Transformer's sinusoid table (Vaswani et al., 2017), sin and cos interleaved.

    Shape: -> (num_positions, dim).
    """
    if dim % 2:
        raise ValueError(f"sin-cos position embedding needs an even dim, got {dim}")
    position = torch.arange(num_positions, dtype=torch.float64)[:, None]
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(temperature) / dim))
    table = torch.zeros(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * div)
    table[:, 1::2] = torch.cos(position * div)
    return table.float()


def sincos_2d_position_embedding(grid_size: tuple[int, int], dim: int, temperature: float = 10000.0) -> Tensor:
    """Fixed 2-D sine-cosine embedding: half the channels the row, half the column. Shape: -> (H*W, dim)."""
    if dim % 4:
        raise ValueError(f"2-D sin-cos position embedding needs dim divisible by 4, got {dim}")
    gh, gw = grid_size
    ys, xs = torch.meshgrid(
        torch.arange(gh, dtype=torch.float64),
        torch.arange(gw, dtype=torch.float64),
        indexing="ij",  # Pitfall 13
    )
    omega = 1.0 / temperature ** (torch.arange(dim // 4, dtype=torch.float64) / (dim // 4))
    out_y = ys.flatten()[:, None] * omega[None, :]  # (H*W, dim/4)
    out_x = xs.flatten()[:, None] * omega[None, :]
    return torch.cat([out_y.sin(), out_y.cos(), out_x.sin(), out_x.cos()], dim=1).float()


def learned_position_embedding(num_tokens: int, dim: int, std: float = 0.02) -> nn.Parameter:
    """A learned, truncated-normal table covering the cls token too, added after the projection (pitfall 1).

    Shape: -> (1, num_tokens, dim).
    """
    table = nn.Parameter(torch.zeros(1, num_tokens, dim))
    nn.init.trunc_normal_(table, std=std)
    return table
