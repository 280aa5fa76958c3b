"""The transformer's position-wise feed-forward network."""

from __future__ import annotations

from torch import Tensor, nn


class Mlp(nn.Module):
    """Linear -> GELU -> dropout -> Linear -> dropout: one hidden layer (pitfall 8).

    Shape: x (B, N, C) -> (B, N, C).
    """

    def __init__(self, in_features: int, hidden_features: int, *, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        x = self.drop1(self.act(self.fc1(x)))
        return self.drop2(self.fc2(x))
