"""PiT (Heo et al., 2021): a ViT that pools, like a CNN, between three stages.

Spatial tokens shrink 27x27 -> 14x14 -> 7x7 while channels double: one depthwise (grouped)
3x3 stride-2 conv, and a linear layer for the cls token. Names follow timm's ``pit.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import torch
from einops import rearrange
from torch import Tensor, nn

from vitlab.contract import FamilyInfo, FamilyProperties
from vitlab.layers import (
    Attention,
    Block,
    check_heads,
    check_image,
    check_num_classes,
    classifier_head,
    conv_output_size,
    drop_path_rates,
)


@dataclass(frozen=True, kw_only=True)
class PiTConfig:
    """Hyperparameters of a PiT. Defaults are PiT-S."""

    img_size: int = 224
    patch_size: int = 16
    patch_stride: int = 8  # the stem's stride: its 16 x 16 windows overlap
    in_chans: int = 3
    num_classes: int = 1000
    # Per stage. The paper's "channels"; timm and the official code store the width per
    # head instead, base_dims = embed_dim // num_heads (48 for PiT-S), and call num_heads "heads".
    embed_dim: tuple[int, ...] = (144, 288, 576)
    depth: tuple[int, ...] = (2, 6, 4)
    num_heads: tuple[int, ...] = (3, 6, 12)
    mlp_ratio: float = 4.0
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    fused_attn: bool = True

    def __post_init__(self) -> None:
        if not len(self.embed_dim) == len(self.depth) == len(self.num_heads):
            raise ValueError(
                f"embed_dim, depth and num_heads need one entry per stage, got lengths "
                f"{len(self.embed_dim)}, {len(self.depth)}, {len(self.num_heads)}"
            )
        check_num_classes(self.num_classes)
        if self.img_size < self.patch_size:
            raise ValueError(f"img_size {self.img_size} is smaller than the stem's kernel {self.patch_size}")
        if self.patch_stride <= 0 or min(self.embed_dim, default=1) <= 0 or min(self.depth, default=1) <= 0:
            raise ValueError(
                f"patch_stride, embed_dim and depth must be positive, got patch_stride={self.patch_stride}, "
                f"embed_dim={self.embed_dim}, depth={self.depth}"
            )
        for dim, heads in zip(self.embed_dim, self.num_heads):
            check_heads(dim, heads)

    @property
    def stage_sizes(self) -> list[int]:
        """Side of the token grid in each stage: 27, 14, 7 for PiT-S at 224 px."""
        side = conv_output_size(self.img_size, self.patch_size, self.patch_stride, 0)
        sizes = [side]
        for _ in self.depth[1:]:
            side = conv_output_size(side, 3, 2, 1)  # the pooling conv: kernel 3, stride 2, padding 1
            sizes.append(side)
        return sizes


class Pooling(nn.Module):
    """PiT's pooling layer: a grouped conv, ``groups=in_ch``, ``out_ch = 2 * in_ch``, with no 1x1 conv
    after it (pitfall 12); the cls token gets a linear layer to the new width.

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
    """Optional pooling, then blocks over ``[cls, spatial tokens]``. Shape: -> (B, C, H', W'), (B, 1, C)."""

    def __init__(
        self,
        dim: int,
        *,
        depth: int,
        num_heads: int,
        mlp_ratio: float,
        pool: Pooling | None,
        drop: float,
        attn_drop: float,
        drop_path: list[float],
        fused_attn: bool,
    ) -> None:
        super().__init__()
        self.pool = pool
        self.blocks = nn.Sequential(
            *[
                Block(
                    dim,
                    num_heads=num_heads,
                    mlp_ratio=mlp_ratio,
                    drop=drop,
                    attn_drop=attn_drop,
                    drop_path=drop_path[i],
                    fused_attn=fused_attn,
                )
                for i in range(depth)
            ]
        )

    def tokens(self, x: Tensor, cls_token: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Pool, then ``[cls, spatial tokens]``. Shape: -> (B, 1 + H'W', C), grid (H', W')."""
        if self.pool is not None:
            x, cls_token = self.pool(x, cls_token)
        H, W = x.shape[-2:]
        return torch.cat([cls_token, rearrange(x, "B C H W -> B (H W) C")], dim=1), (H, W)  # (B, 1 + HW, C)

    def forward(self, x: Tensor, cls_token: Tensor) -> tuple[Tensor, Tensor]:
        tokens, (H, W) = self.tokens(x, cls_token)
        tokens = self.blocks(tokens)
        cls_token, x = tokens[:, :1], tokens[:, 1:]
        return rearrange(x, "B (H W) C -> B C H W", H=H, W=W), cls_token


class PiT(nn.Module):
    """Pooling-based Vision Transformer.

    Attention maps: one per block over the stage's ``[cls, spatial map]``:
    depth_i x (B, h_i, 1 + N_i, 1 + N_i), N_i = 729, 196, 49 for PiT-S.

    Shape: images (B, C, H, W) -> logits (B, num_classes).
    """

    def __init__(self, config: PiTConfig) -> None:
        super().__init__()
        self.config = config
        dims = config.embed_dim  # channels per stage
        side = config.stage_sizes[0]
        # The stem overlaps its windows: kernel 16, stride 8 (a "patch" embedding with overlap).
        self.patch_embed = nn.Conv2d(
            config.in_chans, dims[0], kernel_size=config.patch_size, stride=config.patch_stride
        )
        self.pos_embed = nn.Parameter(torch.zeros(1, dims[0], side, side))  # spatial, (1, C, H, W)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dims[0]))
        self.pos_drop = nn.Dropout(config.drop_rate)
        rates = drop_path_rates(config.drop_path_rate, sum(config.depth))
        starts = [sum(config.depth[:i]) for i in range(len(dims))]
        self.transformers = nn.ModuleList(
            [
                Stage(
                    dims[i],
                    depth=config.depth[i],
                    num_heads=config.num_heads[i],
                    mlp_ratio=config.mlp_ratio,
                    pool=Pooling(dims[i - 1], dims[i]) if i > 0 else None,
                    drop=config.drop_rate,
                    attn_drop=config.attn_drop_rate,
                    drop_path=rates[starts[i] : starts[i] + config.depth[i]],
                    fused_attn=config.fused_attn,
                )
                for i in range(len(dims))
            ]
        )
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head_drop = nn.Dropout(config.drop_rate)
        self.head = classifier_head(dims[-1], config.num_classes)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)

    def embed(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The stem's map plus position embedding, and the cls token. Shape: -> (B, C0, 27, 27), (B, 1, C0)."""
        size = self.config.img_size
        # The spatial position embedding is built for one map size, so only img_size is accepted.
        check_image(
            x, in_chans=self.config.in_chans, patch_size=(1, 1), img_size=(size, size),
            fixed_by="the spatial position embeddings",
        )  # fmt: skip
        x = self.pos_drop(self.patch_embed(x) + self.pos_embed)  # (B, C0, 27, 27)
        return x, self.cls_token.expand(x.shape[0], -1, -1)

    def forward_features(self, x: Tensor) -> Tensor:
        """The last stage's ``[cls, 7x7 map]`` after the final norm. Shape: -> (B, 1 + 49, 576) for PiT-S."""
        x, cls_token = self.embed(x)
        for stage in self.transformers[:-1]:
            x, cls_token = stage(x, cls_token)
        last = cast(Stage, self.transformers[-1])
        tokens, _ = last.tokens(x, cls_token)
        return self.norm(last.blocks(tokens))

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Classify from the cls token. Shape: x (B, 1 + N, C) -> (B, num_classes) ((B, C) with ``pre_logits``)."""
        x = self.head_drop(x[:, 0])
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        """Shape: x (B, C, H, W) -> (B, num_classes)."""
        return self.forward_head(self.forward_features(x))


CONFIGS: dict[str, PiTConfig] = {
    # PiT paper, Table 2 (channels and heads per stage); counts from timm.
    "pit_ti_224": PiTConfig(embed_dim=(64, 128, 256), num_heads=(2, 4, 8)),  # 4,847,272 params
    "pit_xs_224": PiTConfig(embed_dim=(96, 192, 384), num_heads=(2, 4, 8)),  # 10,618,888 params
    "pit_s_224": PiTConfig(embed_dim=(144, 288, 576), num_heads=(3, 6, 12)),  # 23,461,912 params
    "pit_b_224": PiTConfig(
        patch_size=14, patch_stride=7, embed_dim=(256, 512, 1024), depth=(3, 6, 4), num_heads=(4, 8, 16)
    ),  # 73,764,840 params
}

MODEL = PiT

FAMILY = FamilyInfo(
    chapter=9,
    properties=FamilyProperties("PiT", "learned spatial map (C, H, W)", "overlapping conv (k16 s8)", "linear",
                                "yes (depthwise-conv pooling)", "heo2021pit", "pit_s_224"),
    token_mixers=(Attention,),
    tiny=("pit_ti_224", dict(embed_dim=(8, 16, 32), depth=(1, 2, 2), num_heads=(1, 2, 4))),
)  # fmt: skip


def convert_timm(state_dict: Mapping[str, Tensor], config: PiTConfig) -> dict[str, Tensor]:
    """timm ``PoolingVisionTransformer`` -> ``PiT``: the stem loses one level of nesting."""
    return {k.replace("patch_embed.conv.", "patch_embed."): v for k, v in state_dict.items()}
