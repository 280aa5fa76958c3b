"""ViT (Dosovitskiy et al., 2021): an image is a sequence of 16x16 patch tokens.

Attribute names follow timm, so timm's weights load with no renames. DeiT (chapter 4) is
this model with ``distilled=True`` (timm's ``VisionTransformerDistilled`` names); every line
that exists only for it says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from vitlab.contract import FamilyInfo, FamilyProperties
from vitlab.layers import (
    Attention,
    PatchEmbed,
    check_num_classes,
    check_patch_encoder_config,
    classifier_head,
    encoder_blocks,
    learned_position_embedding,
    sincos_2d_position_embedding,
)
from vitlab.models._init import init_vit_weights


@dataclass(frozen=True, kw_only=True)
class ViTConfig:
    """Hyperparameters of a ViT. Defaults are ViT-B/16 at 224 px."""

    img_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    class_token: bool = True
    global_pool: Literal["token", "avg"] = "token"  # "avg": mean of the patch tokens, then fc_norm (timm)
    pos_embed: Literal["learned", "sincos"] = "learned"
    distilled: bool = False  # DeiT: + distillation token, + head_dist
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    fused_attn: bool = True

    def __post_init__(self) -> None:
        check_patch_encoder_config(img_size=self.img_size, patch_size=self.patch_size, embed_dim=self.embed_dim,
                                   num_heads=self.num_heads, in_chans=self.in_chans, depth=self.depth)  # fmt: skip
        check_num_classes(self.num_classes)
        if self.global_pool not in ("token", "avg"):
            raise ValueError(f"global_pool must be 'token' or 'avg', got {self.global_pool!r}")
        if self.global_pool == "token" and not self.class_token:
            raise ValueError("global_pool='token' needs class_token=True")
        if self.pos_embed not in ("learned", "sincos"):
            raise ValueError(f"pos_embed must be 'learned' or 'sincos', got {self.pos_embed!r}")
        if self.distilled and (not self.class_token or self.global_pool != "token"):
            raise ValueError(
                "distilled=True needs class_token=True and global_pool='token' (the two heads read the two "
                f"tokens), got class_token={self.class_token}, global_pool={self.global_pool!r}"
            )

    @property
    def grid_size(self) -> tuple[int, int]:
        return (self.img_size // self.patch_size, self.img_size // self.patch_size)

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: cls (if any), plus DeiT's distillation token."""
        return int(self.class_token) + int(self.distilled)


class ViT(nn.Module):
    """Vision Transformer: patch embedding, [cls] token, position embedding, pre-norm
    encoder blocks, final LayerNorm, linear head on the cls token.

    With ``global_pool="avg"`` the head reads the mean of the patch tokens and the final
    LayerNorm moves after the pooling (timm's ``fc_norm``; ``norm`` is then the identity).
    A distilled model (DeiT⚗) returns ``(cls_logits, dist_logits)`` in training mode and their
    mean in eval mode, as the official ``DistilledVisionTransformer``.

    Attention maps: one per block, ``(B, h, prefix + N, prefix + N)`` over ``[cls, (dist,) patches]``.

    Shape: images (B, C, H, W) -> logits (B, num_classes) [a pair in distilled training].
    """

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        D = config.embed_dim
        self.patch_embed = PatchEmbed(config.img_size, config.patch_size, config.in_chans, D)
        self.num_prefix_tokens = config.num_prefix_tokens
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if config.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, D)) if config.distilled else None  # DeiT
        # One position per token, prefix tokens included: (1, N + 1, D), or (1, N + 2, D) for DeiT⚗.
        num_tokens = config.num_patches + self.num_prefix_tokens
        if config.pos_embed == "learned":
            self.pos_embed = learned_position_embedding(num_tokens, D)
        else:  # fixed: zeros for the prefix tokens, 2-D sin-cos for the patches
            table = sincos_2d_position_embedding(config.grid_size, D)
            table = torch.cat([torch.zeros(self.num_prefix_tokens, D), table])
            self.register_buffer("pos_embed", table[None], persistent=False)
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
        # The final LayerNorm: on every token before the pooling ("token"), or on the pooled
        # vector after it ("avg"), as timm (``norm`` / ``fc_norm``, the other one the identity).
        avg = config.global_pool == "avg"
        self.norm = nn.Identity() if avg else nn.LayerNorm(D, eps=1e-6)
        self.fc_norm = nn.LayerNorm(D, eps=1e-6) if avg else nn.Identity()
        self.head_drop = nn.Dropout(config.drop_rate)
        self.head = classifier_head(D, config.num_classes)
        self.head_dist = classifier_head(D, config.num_classes) if config.distilled else None  # DeiT
        init_vit_weights(self)

    def embed(self, x: Tensor) -> Tensor:
        """Patch tokens, cls (and dist) token prepended, position embedding added.

        Shape: x (B, C, H, W) -> (B, 1 + N, D), or (B, 2 + N, D) when distilled.
        """
        x = self.patch_embed(x)  # (B, N, D); raises on a wrong channel count or size
        B = x.shape[0]
        prefix = [token.expand(B, -1, -1) for token in (self.cls_token, self.dist_token) if token is not None]
        x = torch.cat([*prefix, x], dim=1)  # (B, prefix + N, D): dist right after cls, as in DeiT's code
        return self.pos_drop(x + self.pos_embed)

    def forward_features(self, x: Tensor) -> Tensor:
        """The tokens after the last block and ``norm`` (the identity with ``global_pool="avg"``).

        Shape: x (B, C, H, W) -> (B, prefix + N, D)."""
        return self.norm(self.blocks(self.embed(x)))

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Pool (the cls token, or the patch tokens' mean then ``fc_norm``) and classify; a distilled
        model also classifies the dist token (``pre_logits``: the mean of the two tokens, as timm).

        Shape: x (B, prefix + N, D) -> (B, num_classes) [a pair in distilled training], or (B, D).
        """
        if self.config.global_pool == "avg":
            x_cls = self.fc_norm(x[:, self.num_prefix_tokens :].mean(dim=1))  # (B, D): pool, then norm
        else:
            x_cls = x[:, 0]
        x_cls = self.head_drop(x_cls)
        if self.head_dist is None:
            return x_cls if pre_logits else self.head(x_cls)
        # DeiT⚗ from here on: the dist token has its own head.
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


CONFIGS: dict[str, ViTConfig] = {
    # Tiny and Small were defined by DeiT (Touvron et al., 2021, Table 1); timm counts.
    "vit_tiny_patch16_224": ViTConfig(embed_dim=192, depth=12, num_heads=3),  # 5,717,416 params
    "vit_small_patch16_224": ViTConfig(embed_dim=384, depth=12, num_heads=6),  # 22,050,664 params
    # ViT paper, Table 1: ViT-Base, 12 layers, D=768, MLP 3072, 12 heads.
    "vit_base_patch16_224": ViTConfig(embed_dim=768, depth=12, num_heads=12),  # 86,567,656 params
    "vit_base_patch32_224": ViTConfig(patch_size=32, embed_dim=768, depth=12, num_heads=12),  # 88,224,232 params
}

MODEL = ViT

FAMILY = FamilyInfo(
    chapter=3,
    properties=FamilyProperties("ViT", "learned, 1 + N", "non-overlapping (k16 s16)", "linear",
                                "no", "dosovitskiy2021vit", "vit_small_patch16_224"),
    token_mixers=(Attention,),
    tiny=("vit_tiny_patch16_224", dict(patch_size=16, embed_dim=32, depth=2, num_heads=2)),
)  # fmt: skip


def convert_timm(state_dict: Mapping[str, Tensor], config: ViTConfig) -> dict[str, Tensor]:
    """timm ``VisionTransformer`` weights -> ``ViT``. The names are the same."""
    return {k: v for k, v in state_dict.items()}
