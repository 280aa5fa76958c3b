"""LayerScale (Touvron et al., CaiT 2021): a learnable per-channel diagonal matrix."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class LayerScale(nn.Module):
    """Multiply each channel by a learnable scalar, ``diag(gamma) @ x``.

    ``gamma`` starts at ``init_values`` (small, e.g. 1e-5), so every residual branch
    starts close to the identity. CaiT picks ``init_values`` from the network's total
    depth, not from the layer index (pitfall 10).

    Shape: x (B, N, C) -> (B, N, C).
    """

    def __init__(self, dim: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init_values)))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma
