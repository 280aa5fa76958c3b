"""DeiT (Touvron et al., 2021): ViT trained data-efficiently, with a distillation token.

The plain DeiT models are ViTs (same layers, same weights layout). The distilled models
(⚗) append a second learned token, ``dist_token``, right after the cls token. It attends
to the patches like the cls token does, and its output feeds a second head, ``head_dist``,
which is trained to match a teacher's predictions (see :mod:`vitlab.distill`).

Reads top to bottom: config -> model -> paper presets -> timm weight conversion.
Attribute names follow timm and the official code (``patch_embed``, ``cls_token``,
``dist_token``, ``pos_embed``, ``blocks``, ``norm``, ``head``, ``head_dist``), so timm's
weights load with no renames.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vitlab.contract import FamilyInfo, FamilyProperties
from vitlab.layers import (
    Attention,
    PatchEmbed,
    check_num_classes,
    check_patch_encoder_config,
    classifier_head,
    collect_attention_maps,
    encoder_blocks,
    learned_position_embedding,
)
from vitlab.models._init import init_vit_weights


@dataclass(frozen=True, kw_only=True)
class DeiTConfig:
    """Hyperparameters of a DeiT. Defaults are DeiT-B/16 at 224 px, without distillation."""

    img_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    distilled: bool = False
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    fused_attn: bool = True

    def __post_init__(self) -> None:
        check_patch_encoder_config(
            img_size=self.img_size,
            patch_size=self.patch_size,
            embed_dim=self.embed_dim,
            num_heads=self.num_heads,
            in_chans=self.in_chans,
            depth=self.depth,
        )
        check_num_classes(self.num_classes)

    @property
    def grid_size(self) -> tuple[int, int]:
        return (self.img_size // self.patch_size, self.img_size // self.patch_size)

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: cls, plus the distillation token for ⚗ models."""
        return 2 if self.distilled else 1


class DeiT(nn.Module):
    """DeiT: a ViT with an optional distillation token and a second head.

    A distilled model returns ``(cls_logits, dist_logits)`` in training mode, so a
    distillation loss can supervise each head, and their mean in eval mode, as the
    official ``DistilledVisionTransformer`` does.

    Shape: images (B, C, H, W) -> logits (B, num_classes), or a pair of them when
    ``config.distilled`` and ``self.training``.
    """

    def __init__(self, config: DeiTConfig) -> None:
        super().__init__()
        self.config = config
        D = config.embed_dim
        self.num_prefix_tokens = config.num_prefix_tokens
        self.patch_embed = PatchEmbed(config.img_size, config.patch_size, config.in_chans, D)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        self.dist_token = nn.Parameter(torch.zeros(1, 1, D)) if config.distilled else None
        # One position per token, cls and dist included: (1, N + 1, D) or (1, N + 2, D).
        self.pos_embed = learned_position_embedding(config.num_patches + self.num_prefix_tokens, D)
        self.pos_drop = nn.Dropout(config.drop_rate)
        self.blocks = encoder_blocks(
            D,
            config.depth,
            num_heads=config.num_heads,
            mlp_ratio=config.mlp_ratio,
            qkv_bias=config.qkv_bias,
            drop=config.drop_rate,
            attn_drop=config.attn_drop_rate,
            drop_path_rate=config.drop_path_rate,
            fused_attn=config.fused_attn,
        )
        self.norm = nn.LayerNorm(D, eps=1e-6)
        self.head_drop = nn.Dropout(config.drop_rate)
        self.head = classifier_head(D, config.num_classes)
        self.head_dist = classifier_head(D, config.num_classes) if config.distilled else None
        init_vit_weights(self)

    def embed(self, x: Tensor) -> Tensor:
        """Patch tokens with the cls (and dist) token prepended, position embedding added.

        Shape: x (B, C, H, W) -> (B, 1 + N, D), or (B, 2 + N, D) when distilled.
        """
        x = self.patch_embed(x)  # (B, N, D); raises on a wrong channel count or size
        B = x.shape[0]
        prefix = [self.cls_token.expand(B, -1, -1)]  # (B, 1, D)
        if self.dist_token is not None:
            prefix.append(self.dist_token.expand(B, -1, -1))  # right after cls, as in the official code
        x = torch.cat([*prefix, x], dim=1)  # (B, prefix + N, D)
        return self.pos_drop(x + self.pos_embed)

    def forward_features(self, x: Tensor) -> Tensor:
        """Shape: x (B, C, H, W) -> (B, prefix + N, D), after the final norm."""
        return self.norm(self.blocks(self.embed(x)))

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Classify the cls token (and the dist token with ``head_dist``).

        With ``pre_logits`` the token the head reads, (B, D): the cls token, or the mean of
        the cls and dist tokens of a distilled model (as timm).

        Shape: x (B, prefix + N, D) -> (B, num_classes), or a pair in distilled training.
        """
        x_cls = self.head_drop(x[:, 0])
        if self.head_dist is None:
            return x_cls if pre_logits else self.head(x_cls)
        x_dist = self.head_drop(x[:, 1])
        if pre_logits:
            return (x_cls + x_dist) / 2
        cls_logits, dist_logits = self.head(x_cls), self.head_dist(x_dist)
        if self.training:
            # NOTE(paper): as the official code; timm returns the pair only after
            # ``set_distilled_training(True)`` and the mean otherwise.
            return cls_logits, dist_logits
        return (cls_logits + dist_logits) / 2  # inference: average the two heads

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        """Shape: x (B, C, H, W) -> (B, num_classes) [or a pair, see the class docstring]."""
        return self.forward_head(self.forward_features(x))

    @torch.no_grad()
    def get_attention_maps(self, x: Tensor) -> list[Tensor]:
        """Attention maps of every block (explicit path). Rows (queries) and columns (keys)
        index the same tokens, ``[cls, (dist,) patches]``, patches in row-major grid order.

        Shape: x (B, C, H, W) -> depth x (B, h, prefix + N, prefix + N).
        """
        return collect_attention_maps(self.embed(x), self.blocks)


CONFIGS: dict[str, DeiTConfig] = {
    # DeiT paper, Table 1: Ti 192/3 heads, S 384/6, B 768/12; depth 12, head dim 64. timm counts.
    "deit_tiny_patch16_224": DeiTConfig(embed_dim=192, depth=12, num_heads=3),  # 5,717,416 params
    "deit_small_patch16_224": DeiTConfig(embed_dim=384, depth=12, num_heads=6),  # 22,050,664 params
    "deit_base_patch16_224": DeiTConfig(embed_dim=768, depth=12, num_heads=12),  # 86,567,656 params
    # ⚗ models (section 4): + dist token, + one position, + head_dist. timm counts.
    "deit_tiny_distilled_patch16_224": DeiTConfig(embed_dim=192, depth=12, num_heads=3, distilled=True),  # 5,910,800
    "deit_small_distilled_patch16_224": DeiTConfig(
        embed_dim=384, depth=12, num_heads=6, distilled=True
    ),  # 22,436,432 params
    "deit_base_distilled_patch16_224": DeiTConfig(
        embed_dim=768, depth=12, num_heads=12, distilled=True
    ),  # 87,338,192 params
}

MODEL = DeiT

FAMILY = FamilyInfo(
    chapter=4,
    properties=FamilyProperties("DeiT", "learned, 1 + N (2 + N ⚗)", "non-overlapping (k16 s16)", "linear",
                                "no", "touvron2021deit", "deit_small_patch16_224"),
    token_mixers=(Attention,),
    tiny=("deit_tiny_distilled_patch16_224", dict(patch_size=16, embed_dim=32, depth=2, num_heads=2)),
    benchmark_preset="deit_small_patch16_224",
)  # fmt: skip


def convert_timm(state_dict: Mapping[str, Tensor], config: DeiTConfig) -> dict[str, Tensor]:
    """timm ``VisionTransformer`` / ``VisionTransformerDistilled`` weights -> ``DeiT``.

    The names are the same; this checks that the checkpoint has a distillation token
    exactly when the config asks for one.
    """
    has_dist = "dist_token" in state_dict
    if has_dist != config.distilled:
        raise ValueError(
            f"config has distilled={config.distilled} but the state dict {'has' if has_dist else 'has no'} 'dist_token'"
        )
    return dict(state_dict)
