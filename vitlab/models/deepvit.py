"""DeepViT (Zhou et al., 2021): re-attention against attention collapse in deep ViTs.

In a deep ViT the attention maps of neighbouring blocks become almost the same
("attention collapse"), so the extra blocks add little. Re-attention mixes the softmax
maps of the ``h`` heads of a block with a learnable ``h x h`` matrix θ and normalises the
result with BatchNorm: ``ReAttention(Q, K, V) = Norm(θ^T softmax(Q K^T / sqrt(d))) V``.

Matches the official code (zhoudaquan/dvit_repo, ``models/deep_vision_transformer.py`` and
``models/layers.py`` at commit 1ccb152c), parameter names included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from einops import rearrange
from torch import Tensor, nn

from vitlab.contract import AttentionKind, FamilyInfo, FamilyProperties
from vitlab.layers import (
    Attention,
    Block,
    DropPath,
    Mlp,
    check_heads,
    check_image,
    check_num_classes,
    classifier_head,
    drop_path_rates,
    learned_position_embedding,
    with_attn,
)
from vitlab.models._init import init_vit_weights

STEM_STRIDE = 16  # conv 7x7 stride 2, then conv 8x8 stride 8: one token per 16x16 pixels


@dataclass(frozen=True, kw_only=True)
class DeepViTConfig:
    """Hyperparameters of a DeepViT. Defaults are DeepViT-S (the official ``deepvit_S``).

    The *last* ``num_reattention_blocks`` blocks use re-attention (the official
    ``apply_transform = [False] * (depth - k) + [True] * k``).
    """

    img_size: int = 224
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 396
    stem_dim: int = 64  # channels of the conv stem's first two convolutions
    depth: int = 16
    num_heads: int = 12
    mlp_ratio: float = 3.0
    qkv_bias: bool = True
    num_reattention_blocks: int = 5
    transform_scale: bool = False
    scale_adjustment: float = 1.0
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    fused_attn: bool = True

    def __post_init__(self) -> None:
        if self.img_size <= 0 or self.img_size % STEM_STRIDE:
            raise ValueError(
                f"img_size {self.img_size} is not a positive multiple of the stem's stride {STEM_STRIDE} "
                f"(expected e.g. 224 for a 14x14 token grid)"
            )
        check_heads(self.embed_dim, self.num_heads)
        check_num_classes(self.num_classes)
        if self.in_chans <= 0 or self.depth <= 0 or self.stem_dim <= 0:
            raise ValueError(
                f"in_chans, stem_dim and depth must be positive, got {self.in_chans}, {self.stem_dim} and {self.depth}"
            )
        if not 0 <= self.num_reattention_blocks <= self.depth:
            raise ValueError(
                f"num_reattention_blocks must be between 0 and depth {self.depth}, got {self.num_reattention_blocks}"
            )
        if self.scale_adjustment <= 0:
            raise ValueError(f"scale_adjustment must be positive, got {self.scale_adjustment}")

    @property
    def grid_size(self) -> tuple[int, int]:
        return (self.img_size // STEM_STRIDE, self.img_size // STEM_STRIDE)

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]


class PatchEmbedCNN(nn.Module):
    """DeepViT's convolutional patch stem (official ``PatchEmbed_CNN``, "following T2T").

    conv 7x7 s2 (no bias) + BN + ReLU -> conv 3x3 (no bias) + BN + ReLU -> conv 8x8 s8.
    224 px -> 112x112x64 -> 112x112x64 -> 14x14xD, i.e. 196 tokens.

    Shape: x (B, C, H, W) -> (B, (H/16)(W/16), D).
    """

    def __init__(self, img_size: int = 224, in_chans: int = 3, embed_dim: int = 396, stem_dim: int = 64) -> None:
        super().__init__()
        self.img_size = (img_size, img_size)
        self.in_chans = in_chans
        self.num_patches = (img_size // STEM_STRIDE) ** 2
        self.conv1 = nn.Conv2d(in_chans, stem_dim, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(stem_dim)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(stem_dim, stem_dim, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(stem_dim)
        self.proj = nn.Conv2d(stem_dim, embed_dim, kernel_size=STEM_STRIDE // 2, stride=STEM_STRIDE // 2)

    def forward(self, x: Tensor) -> Tensor:
        # The learned position embedding fixes the grid, so only img_size itself is accepted.
        check_image(x, in_chans=self.in_chans, patch_size=(STEM_STRIDE, STEM_STRIDE), img_size=self.img_size)
        x = self.relu(self.bn1(self.conv1(x)))  # (B, stem_dim, H/2, W/2); stem_dim 64 in the paper
        x = self.relu(self.bn2(self.conv2(x)))  # (B, stem_dim, H/2, W/2)
        x = self.proj(x)  # (B, D, H/16, W/16)
        return rearrange(x, "B D h w -> B (h w) D")


class ReAttention(nn.Module):
    """Re-attention: mix the heads' attention maps with θ (h x h), then BatchNorm over heads.

    ``reatten_matrix`` is a 1x1 ``Conv2d(h, h)``: θ^T on the head axis, plus a bias as in the
    official code. ``var_norm`` (``BatchNorm2d(h)``) normalises each head's map over (B, N, N).
    ``transform_scale`` multiplies by ``head_dim**-0.5`` once more (official DeepViT-S). Only the
    explicit path exists: the mixing needs every head's softmax map, which the fused kernel
    never materialises.

    Shape: x (B, N, C) -> (B, N, C); attn (B, h, N, N), the re-attended map.
    """

    # For vitlab.attention_maps: the softmax maps before the mixing are reatten_matrix's input.
    attn_kind: ClassVar[AttentionKind] = "re-attention"
    unmixed_input: ClassVar[str] = "reatten_matrix"

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int = 8,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        transform_scale: bool = False,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = check_heads(dim, num_heads)
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.reatten_matrix = nn.Conv2d(num_heads, num_heads, kernel_size=1)  # θ^T, plus a bias per head
        self.var_norm = nn.BatchNorm2d(num_heads)
        self.reatten_scale = self.scale if transform_scale else 1.0
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, return_attn: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Shape: x (B, N, C) -> (B, N, C) [, attn (B, h, N, N) when ``return_attn``]."""
        qkv = rearrange(self.qkv(x), "B N (qkv h d) -> qkv B h N d", qkv=3, h=self.num_heads)
        q, k, v = qkv.unbind(0)  # each (B, h, N, d)
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)  # (B, h, N, N)
        attn = self.attn_drop(attn)
        # Re-attention: mix the heads (B, h, N, N) -> (B, h, N, N), then normalise each head.
        attn = self.var_norm(self.reatten_matrix(attn)) * self.reatten_scale
        out = rearrange(attn @ v, "B h N d -> B N (h d)")
        out = self.proj_drop(self.proj(out))
        return with_attn(out, attn, return_attn)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, reatten_scale={self.reatten_scale:.4f}"


class ReAttentionBlock(nn.Module):
    """The pre-norm block with re-attention (official ``Block`` with ``apply_transform=True``).

    Shape: x (B, N, C) -> (B, N, C).
    """

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        mlp_ratio: float = 3.0,
        qkv_bias: bool = True,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        transform_scale: bool = False,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = ReAttention(
            dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop,
            transform_scale=transform_scale,
        )  # fmt: skip
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x)))
        return x + self.drop_path2(self.mlp(self.norm2(x)))


class DeepViT(nn.Module):
    """DeepViT: CNN patch stem, cls token, learned position embedding, pre-norm blocks (the
    last ``num_reattention_blocks`` with re-attention), final LayerNorm, head on the cls token.

    Attention maps: one per block, ``(B, h, 1 + N, 1 + N)`` over ``[cls, patches]`` (row-major);
    in a re-attention block the re-attended map (rows need not sum to 1), its softmax maps
    in ``unmixed``.

    Shape: images (B, C, H, W) -> logits (B, num_classes).
    """

    def __init__(self, config: DeepViTConfig) -> None:
        super().__init__()
        self.config = config
        D = config.embed_dim
        self.patch_embed = PatchEmbedCNN(config.img_size, config.in_chans, D, stem_dim=config.stem_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        self.pos_embed = learned_position_embedding(config.num_patches + 1, D)
        self.pos_drop = nn.Dropout(config.drop_rate)
        c, first_reattention = config, config.depth - config.num_reattention_blocks
        rates = drop_path_rates(c.drop_path_rate, c.depth)
        self.blocks = nn.Sequential(
            *[
                Block(D, num_heads=c.num_heads, mlp_ratio=c.mlp_ratio, qkv_bias=c.qkv_bias, drop=c.drop_rate,
                      attn_drop=c.attn_drop_rate, drop_path=rate, fused_attn=c.fused_attn)
                for rate in rates[:first_reattention]
            ],
            *[
                ReAttentionBlock(D, num_heads=c.num_heads, mlp_ratio=c.mlp_ratio, qkv_bias=c.qkv_bias,
                                 drop=c.drop_rate, attn_drop=c.attn_drop_rate, drop_path=rate,
                                 transform_scale=c.transform_scale)
                for rate in rates[first_reattention:]
            ],
        )  # fmt: skip
        self.norm = nn.LayerNorm(D, eps=1e-6)
        self.head_drop = nn.Dropout(config.drop_rate)
        self.head = classifier_head(D, config.num_classes)
        init_vit_weights(self)
        nn.init.trunc_normal_(self.cls_token, std=0.02)  # official init (timm's ViT: std 1e-6)

    def embed(self, x: Tensor) -> Tensor:
        """Shape: x (B, C, H, W) -> (B, 1 + N, D)."""
        x = self.patch_embed(x)  # (B, N, D); raises on a wrong channel count or size
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1 + N, D)
        return self.pos_drop(x + self.pos_embed)

    def forward_features(self, x: Tensor) -> Tensor:
        """Shape: x (B, C, H, W) -> (B, 1 + N, D), after the final norm."""
        # NOTE(paper): ``scale_adjustment`` a (0.5 in DeepViT-S/L) is not in the paper. Every
        # official block (re-attention or not) computes x + f(LN(a x)) / a for both branches.
        # With y = a x that is y + f(LN(y)): a standard block on a rescaled stream. So we scale
        # once on the way in and once on the way out; for a = 0.5 (a power of two) this is
        # bit-identical to the official code (tests/test_deepvit.py checks the equivalence).
        a = self.config.scale_adjustment
        x = self.blocks(self.embed(x) * a)
        return self.norm(x / a)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Shape: x (B, 1 + N, D) -> (B, num_classes), from the cls token ((B, D) with ``pre_logits``)."""
        x = self.head_drop(x[:, 0])
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        """Shape: x (B, C, H, W) -> (B, num_classes)."""
        return self.forward_head(self.forward_features(x))


CONFIGS: dict[str, DeepViTConfig] = {
    # Official builders deepvit_S / deepvit_L (dvit_repo, models/deep_vision_transformer.py).
    # Counts from instantiating the official code; the paper lists 27M and 55M.
    "deepvit_s": DeepViTConfig(
        embed_dim=396, depth=16, num_heads=12, num_reattention_blocks=5, transform_scale=True, scale_adjustment=0.5
    ),  # 27,312,632 params
    "deepvit_l": DeepViTConfig(
        embed_dim=420, depth=32, num_heads=12, num_reattention_blocks=12, transform_scale=False, scale_adjustment=0.5
    ),  # 58,883,708 params
}

MODEL = DeepViT

FAMILY = FamilyInfo(
    chapter=5,
    properties=FamilyProperties("DeepViT", "learned, 1 + N", "overlapping conv stem (k7 s2 … k8 s8)",
                                "linear; re-attention mixes heads", "no", "zhou2021deepvit", "deepvit_s"),
    token_mixers=(Attention, ReAttention),
    tiny=("deepvit_s", dict(embed_dim=32, stem_dim=6, depth=2, num_heads=2, num_reattention_blocks=1)),
)  # fmt: skip
