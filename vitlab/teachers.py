"""Teachers for DeiT's distillation (chapter 4): small convnets that train in seconds."""

from __future__ import annotations

from torch import Tensor, nn


class SmallCNNTeacher(nn.Module):
    """A tiny convnet teacher for small grey images: three 3x3 conv-BN-ReLU layers (a max pool after
    the second), global average pooling, a linear head.

    Shape: x (B, in_chans, H, W) -> (B, num_classes), H, W >= 2.
    """

    def __init__(self, in_chans: int = 1, num_classes: int = 10, width: int = 32) -> None:
        super().__init__()
        if in_chans <= 0 or num_classes <= 0 or width <= 0:
            raise ValueError(
                f"in_chans, num_classes and width must be positive, got {in_chans}, {num_classes}, {width}"
            )
        self.in_chans = in_chans

        def conv(c_in: int, c_out: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())

        self.features = nn.Sequential(
            conv(in_chans, width),  # (B, w, H, W)
            conv(width, width),
            nn.MaxPool2d(2),  # (B, w, H/2, W/2)
            conv(width, 2 * width),  # (B, 2w, H/2, W/2)
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),  # (B, 2w)
        )
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 4 or x.shape[1] != self.in_chans:
            raise ValueError(f"expected images of shape (B, {self.in_chans}, H, W), got {tuple(x.shape)}")
        return self.head(self.features(x))
