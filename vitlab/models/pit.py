"""PiT (Heo et al., 2021): a ViT that pools, like a CNN, between three stages.

Spatial tokens shrink 27x27 -> 14x14 -> 7x7 while channels double at each stage. The
pooling layer is PiT's own: one depthwise (grouped) 3x3 stride-2 conv that doubles the
channels, and a linear layer for the cls token, which has no spatial position.
Attribute names follow timm's ``pit.py`` so its weights load unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor, nn

from vitlab.layers import Block, check_heads, check_image, conv_output_size


@dataclass(frozen=True, kw_only=True)
class PiTConfig:
    """Hyperparameters of a PiT. Defaults are PiT-S."""

    img_size: int = 224
    patch_size: int = 16
    stride: int = 8
    in_chans: int = 3
    num_classes: int = 1000
    base_dims: tuple[int, ...] = (48, 48, 48)
    depth: tuple[int, ...] = (2, 6, 4)
    heads: tuple[int, ...] = (3, 6, 12)
    mlp_ratio: float = 4.0
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    fused_attn: bool = True

    def __post_init__(self) -> None:
        if not len(self.base_dims) == len(self.depth) == len(self.heads):
            raise ValueError(
                f"base_dims, depth and heads need one entry per stage, got lengths "
                f"{len(self.base_dims)}, {len(self.depth)}, {len(self.heads)}"
            )
        if self.img_size < self.patch_size:
            raise ValueError(f"img_size {self.img_size} is smaller than the stem's kernel {self.patch_size}")
        if self.stride <= 0 or min(self.base_dims, default=1) <= 0 or min(self.depth, default=1) <= 0:
            raise ValueError(
                f"stride, base_dims and depth must be positive, got stride={self.stride}, "
                f"base_dims={self.base_dims}, depth={self.depth}"
            )
        # Channels are base_dim * heads, so the split is exact by construction: this only
        # rejects heads <= 0.
        for base, heads in zip(self.base_dims, self.heads):
            check_heads(base * heads, heads)

    @property
    def stage_sizes(self) -> list[int]:
        """Side of the token grid in each stage: 27, 14, 7 for PiT-S at 224 px."""
        side = conv_output_size(self.img_size, self.patch_size, self.stride, 0)
        sizes = [side]
        for _ in self.depth[1:]:
            side = conv_output_size(side, 3, 2, 1)  # the pooling conv: kernel 3, stride 2, padding 1
            sizes.append(side)
        return sizes


class Pooling(nn.Module):
    """PiT's pooling layer between stages.

    A grouped conv with ``groups=in_ch`` and ``out_ch = 2 * in_ch``: every input channel
    makes two output channels from its own 3x3 neighbourhood, with no 1x1 conv after it
    (ERRATA 10). The cls token gets a linear layer to the new width.

    Shape: x (B, C, H, W), cls (B, 1, C) -> (B, 2C, ceil(H/2), ceil(W/2)), (B, 1, 2C).
    """

    def __init__(self, in_features: int, out_features: int, stride: int = 2) -> None:
        super().__init__()
        self.conv = nn.Conv2d(
            in_features, out_features, kernel_size=stride + 1, stride=stride, padding=stride // 2, groups=in_features
        )
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x: Tensor, cls_token: Tensor) -> tuple[Tensor, Tensor]:
        return self.conv(x), self.fc(cls_token)


class Stage(nn.Module):
    """Optional pooling, then transformer blocks over ``[cls, spatial tokens]``.

    Shape: x (B, C_in, H, W), cls (B, 1, C_in) -> (B, C, H', W'), (B, 1, C).
    """

    def __init__(
        self,
        dim: int,
        *,
        depth: int,
        heads: int,
        mlp_ratio: float,
        pool: Pooling | None,
        drop: float,
        attn_drop: float,
        drop_path: list[float],
        fused_attn: bool,
    ) -> None:
        super().__init__()
        self.pool = pool
        self.blocks = nn.Sequential(*[
            Block(
                dim,
                num_heads=heads,
                mlp_ratio=mlp_ratio,
                drop=drop,
                attn_drop=attn_drop,
                drop_path=drop_path[i],
                fused_attn=fused_attn,
            )
            for i in range(depth)
        ])

    def forward(self, x: Tensor, cls_token: Tensor) -> tuple[Tensor, Tensor]:
        if self.pool is not None:
            x, cls_token = self.pool(x, cls_token)
        B, C, H, W = x.shape
        tokens = torch.cat([cls_token, rearrange(x, "B C H W -> B (H W) C")], dim=1)  # (B, 1 + HW, C)
        tokens = self.blocks(tokens)
        cls_token, x = tokens[:, :1], tokens[:, 1:]
        return rearrange(x, "B (H W) C -> B C H W", H=H, W=W), cls_token


class PiT(nn.Module):
    """Pooling-based Vision Transformer.

    Shape: images (B, C, H, W) -> logits (B, num_classes).
    """

    def __init__(self, config: PiTConfig) -> None:
        super().__init__()
        self.config = config
        dims = [b * h for b, h in zip(config.base_dims, config.heads)]
        side = config.stage_sizes[0]
        # The stem overlaps its windows: kernel 16, stride 8 (a "patch" embedding with overlap).
        self.patch_embed = nn.Conv2d(config.in_chans, dims[0], kernel_size=config.patch_size, stride=config.stride)
        self.pos_embed = nn.Parameter(torch.zeros(1, dims[0], side, side))  # spatial, (1, C, H, W)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dims[0]))
        self.pos_drop = nn.Dropout(config.drop_rate)
        # Explicitly on the CPU, so that the model can also be built on the "meta" device.
        rates = torch.linspace(0, config.drop_path_rate, sum(config.depth), device="cpu").split(list(config.depth))
        self.transformers = nn.ModuleList([
            Stage(
                dims[i],
                depth=config.depth[i],
                heads=config.heads[i],
                mlp_ratio=config.mlp_ratio,
                pool=Pooling(dims[i - 1], dims[i]) if i > 0 else None,
                drop=config.drop_rate,
                attn_drop=config.attn_drop_rate,
                drop_path=rates[i].tolist(),
                fused_attn=config.fused_attn,
            )
            for i in range(len(dims))
        ])
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head_drop = nn.Dropout(config.drop_rate)
        self.head = nn.Linear(dims[-1], config.num_classes) if config.num_classes > 0 else nn.Identity()
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)

    def forward_features(self, x: Tensor) -> Tensor:
        """Shape: x (B, C, H, W) -> the normalised cls token (B, 1, C_last)."""
        size, side = self.config.img_size, self.config.stage_sizes[0]
        check_image(x, in_chans=self.config.in_chans, patch_size=(1, 1))
        if x.shape[-2:] != (size, size):
            raise ValueError(
                f"expected image size {size}x{size} (the spatial position embedding is {side}x{side}), "
                f"got {x.shape[-2]}x{x.shape[-1]}"
            )
        x = self.pos_drop(self.patch_embed(x) + self.pos_embed)  # (B, C0, 27, 27)
        cls_token = self.cls_token.expand(x.shape[0], -1, -1)
        for stage in self.transformers:
            x, cls_token = stage(x, cls_token)
        return self.norm(cls_token)

    def forward(self, x: Tensor) -> Tensor:
        """Shape: x (B, C, H, W) -> (B, num_classes)."""
        return self.head(self.head_drop(self.forward_features(x)[:, 0]))


CONFIGS: dict[str, PiTConfig] = {
    # PiT paper, Table 2 (channels = base_dim * heads per stage); counts from timm.
    "pit_ti_224": PiTConfig(base_dims=(32, 32, 32), heads=(2, 4, 8)),  # 4,847,272 params
    "pit_xs_224": PiTConfig(base_dims=(48, 48, 48), heads=(2, 4, 8)),  # 10,618,888 params
    "pit_s_224": PiTConfig(base_dims=(48, 48, 48), heads=(3, 6, 12)),  # 23,461,912 params
    "pit_b_224": PiTConfig(
        patch_size=14, stride=7, base_dims=(64, 64, 64), depth=(3, 6, 4), heads=(4, 8, 16)
    ),  # 73,764,840 params
}

MODEL = PiT


def convert_timm(state_dict: Mapping[str, Tensor], config: PiTConfig) -> dict[str, Tensor]:
    """timm ``PoolingVisionTransformer`` -> ``PiT``: the stem loses one level of nesting."""
    return {k.replace("patch_embed.conv.", "patch_embed."): v for k, v in state_dict.items()}
