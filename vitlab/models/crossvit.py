"""CrossViT (Chen et al., 2021): two patch sizes, two token sequences, fused by cross-attention.

An image is cut twice: into small 12x12 patches (S branch, 240 px -> 20x20 = 400 tokens)
and into large 16x16 patches (L branch, resized to 224 px -> 14x14 = 196 tokens). Each
branch is a ViT of its own width. K multi-scale encoders each run N blocks on S and M
blocks on L, then let the branches talk through their cls tokens: one branch's cls
token, projected to the other branch's width (f), is the only query of an attention over
the other branch's patch tokens, and the result is projected back (g). One query makes
the fusion linear in the number of tokens instead of quadratic.

In the paper's order (Sec. 3.3, Eqs. 5-8). Names follow timm's ``crossvit.py``, except
``q/k/v`` for its ``wq/wk/wv`` and the per-branch ``pos_embed`` and ``cls_token`` as
ParameterLists, as in the official code (:func:`convert_timm` renames).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from vitlab.contract import AttentionKind, FamilyInfo, FamilyProperties
from vitlab.layers import (
    Attention,
    Block,
    DropPath,
    PatchEmbed,
    check_heads,
    check_image,
    check_num_classes,
    classifier_head,
    drop_path_rates,
    learned_position_embedding,
    with_attn,
)
from vitlab.models._init import init_vit_weights

BRANCHES = ("S", "L")
# CrossViT-dagger stem, (stride, padding) of its 2nd and 3rd 3x3 convs; the 1st is 7x7 s4 p3.
_CONV_STEM = {12: ((3, 0), (1, 1)), 16: ((2, 1), (2, 1))}


def resize_image(x: Tensor, size: int) -> Tensor:
    """Bicubic resize (``align_corners=False``, no antialiasing), as timm's ``scale_image``.

    Shape: x (B, C, H, W) -> (B, C, size, size).
    """
    if x.shape[-2:] == (size, size):
        return x
    return F.interpolate(x, size=(size, size), mode="bicubic", align_corners=False)


class ConvStem(nn.Module):
    """CrossViT-dagger patch embedding: three convs with ReLU instead of one P x P conv.

    Widths D/4 -> D/2 -> D, overall stride P (the grid of :class:`~vitlab.layers.PatchEmbed`).

    Shape: x (B, C, H, W) -> (B, (H/P)(W/P), D).
    """

    def __init__(self, img_size: int, patch_size: int, in_chans: int, embed_dim: int) -> None:
        super().__init__()
        self.img_size, self.patch_size, self.in_chans = (img_size, img_size), (patch_size, patch_size), in_chans
        (s2, p2), (s3, p3) = _CONV_STEM[patch_size]
        self.proj = nn.Sequential(  # indices 0, 2, 4 are the convs, as in timm
            nn.Conv2d(in_chans, embed_dim // 4, kernel_size=7, stride=4, padding=3),
            nn.ReLU(),
            nn.Conv2d(embed_dim // 4, embed_dim // 2, kernel_size=3, stride=s2, padding=p2),
            nn.ReLU(),
            nn.Conv2d(embed_dim // 2, embed_dim, kernel_size=3, stride=s3, padding=p3),
        )

    def forward(self, x: Tensor) -> Tensor:
        check_image(x, in_chans=self.in_chans, patch_size=self.patch_size, img_size=self.img_size)
        return rearrange(self.proj(x), "B D h w -> B (h w) D")


class CrossAttention(nn.Module):
    """Cross-attention (paper Eq. 7): the first token is the only query, over all the tokens.

    For the L branch ``x' = [f(cls_L), S patches]``: ``q = x'_cls W_q``, ``k = x' W_k``,
    ``v = x' W_v``, ``CA(x') = softmax(q k^T / sqrt(C/h)) v``, then the output projection.

    Shape: x (B, 1 + N, C), query token first -> (B, 1, C); attn (B, h, 1, 1 + N).
    """

    attn_kind: ClassVar[AttentionKind] = "cross"  # its map's label (vitlab.attention_maps)

    def __init__(
        self, dim: int, *, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.0, proj_drop: float = 0.0,
        fused_attn: bool = True,
    ) -> None:  # fmt: skip
        super().__init__()
        self.num_heads = num_heads
        self.scale = check_heads(dim, num_heads) ** -0.5
        self.fused_attn = fused_attn
        self.q = nn.Linear(dim, dim, bias=qkv_bias)  # timm: wq, wk, wv
        self.k = nn.Linear(dim, dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, return_attn: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Shape: x (B, 1 + N, C) -> (B, 1, C) [, attn (B, h, 1, 1 + N) when ``return_attn``]."""
        heads = "B n (h d) -> B h n d"
        q = rearrange(self.q(x[:, :1]), heads, h=self.num_heads)  # (B, h, 1, d): the one query
        k = rearrange(self.k(x), heads, h=self.num_heads)  # (B, h, 1 + N, d)
        v = rearrange(self.v(x), heads, h=self.num_heads)  # (B, h, 1 + N, d)
        attn = None
        if self.fused_attn and not return_attn:
            p = self.attn_drop.p if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, scale=self.scale)  # (B, h, 1, d)
        else:
            attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # (B, h, 1, 1 + N)
            out = self.attn_drop(attn) @ v  # (B, h, 1, d)
        out = self.proj_drop(self.proj(rearrange(out, "B h n d -> B n (h d)")))  # (B, 1, C)
        return with_attn(out, attn, return_attn)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, fused_attn={self.fused_attn}"


class CrossAttentionBlock(nn.Module):
    """Paper Eq. 6: ``y_cls = x'_cls + CA(LN(x'))``; no MLP (``has_mlp=False`` in the official code).

    Shape: x (B, 1 + N, C) -> (B, 1, C).
    """

    def __init__(
        self, dim: int, *, num_heads: int, qkv_bias: bool = True, drop: float = 0.0, attn_drop: float = 0.0,
        drop_path: float = 0.0, fused_attn: bool = True,
    ) -> None:  # fmt: skip
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = CrossAttention(
            dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop, fused_attn=fused_attn
        )
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """Shape: x (B, 1 + N, C) -> (B, 1, C)."""
        return x[:, :1] + self.drop_path(self.attn(self.norm1(x)))


def projection(dim_in: int, dim_out: int) -> nn.Sequential:
    """f and g, which move a cls token between the branch widths.

    NOTE(paper): the paper says only "projections"; the official code (and timm) make each
    LayerNorm -> GELU -> Linear, even for equal widths.

    Shape: x (B, 1, dim_in) -> (B, 1, dim_out).
    """
    return nn.Sequential(nn.LayerNorm(dim_in, eps=1e-6), nn.GELU(), nn.Linear(dim_in, dim_out))


class MultiScaleBlock(nn.Module):
    """One multi-scale encoder: N blocks on S and M on L, then fusion in both directions.

    Branch i's cls token goes to j's width, ``x' = [f(cls_i), patches_j]`` (``projs[i]``, Eq. 5),
    ``y_cls = f(cls_i) + CA(LN(x'))`` (``fusion[i]``, Eqs. 6-7), and ``g(y_cls)`` replaces cls_i
    (``revert_projs[i]``, Eq. 8). Patch tokens pass unchanged.

    Shape: [S (B, 1 + N_S, C_S), L (B, 1 + N_L, C_L)] -> the same shapes.
    """

    def __init__(self, config: CrossViTConfig, drop_path: list[float]) -> None:
        super().__init__()
        c, dims = config, config.embed_dim
        common: dict[str, Any] = dict(
            qkv_bias=c.qkv_bias, drop=c.drop_rate, attn_drop=c.attn_drop_rate, fused_attn=c.fused_attn
        )
        self.blocks = nn.ModuleList(
            [
                nn.Sequential(
                    *[
                        Block(
                            dims[i],
                            num_heads=c.num_heads[i],
                            mlp_ratio=c.mlp_ratio[i],
                            drop_path=drop_path[b],
                            **common,
                        )
                        for b in range(c.depth[i])
                    ]
                )
                for i in range(2)
            ]
        )
        self.projs = nn.ModuleList([projection(dims[i], dims[1 - i]) for i in range(2)])
        self.fusion = nn.ModuleList(
            [
                CrossAttentionBlock(dims[1 - i], num_heads=c.num_heads[1 - i], drop_path=drop_path[-1], **common)
                for i in range(2)
            ]
        )
        self.revert_projs = nn.ModuleList([projection(dims[1 - i], dims[i]) for i in range(2)])

    def forward(self, xs: list[Tensor]) -> list[Tensor]:
        xs = [blocks(x) for blocks, x in zip(self.blocks, xs)]  # each branch on its own
        outs = []
        for i, j in ((0, 1), (1, 0)):
            x_prime = torch.cat([self.projs[i](xs[i][:, :1]), xs[j][:, 1:]], dim=1)  # Eq. 5, f: (B, 1 + N_j, C_j)
            y_cls = self.fusion[i](x_prime)  # Eqs. 6-7: (B, 1, C_j)
            outs.append(torch.cat([self.revert_projs[i](y_cls), xs[i][:, 1:]], dim=1))  # Eq. 8, g: (B, 1 + N_i, C_i)
        return outs


@dataclass(frozen=True, kw_only=True)
class CrossViTConfig:
    """Hyperparameters of a CrossViT. Pairs are (S branch, L branch). Defaults are CrossViT-S."""

    img_size: int = 240  # the input; the S branch sees it as is
    branch_img_size: tuple[int, int] = (240, 224)  # each branch resizes the input to this
    patch_size: tuple[int, int] = (12, 16)
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: tuple[int, int] = (192, 384)
    num_encoders: int = 3  # K multi-scale encoders
    depth: tuple[int, int] = (1, 4)  # N (S) and M (L) blocks per encoder
    num_heads: tuple[int, int] = (6, 6)
    mlp_ratio: tuple[float, float] = (4.0, 4.0)
    multi_conv: bool = False  # the dagger variant's 3-conv stem
    qkv_bias: bool = True
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    fused_attn: bool = True

    def __post_init__(self) -> None:
        pairs = ("branch_img_size", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio")
        lengths = {name: len(getattr(self, name)) for name in pairs}
        if set(lengths.values()) != {2}:
            raise ValueError(f"every per-branch field needs 2 entries (S, L), got lengths {lengths}")
        check_num_classes(self.num_classes)
        if min(self.img_size, self.in_chans, self.num_encoders, *self.depth, *self.patch_size) <= 0:
            raise ValueError(
                f"img_size, in_chans, num_encoders, depth and patch_size must be positive, got {self.img_size}, "
                f"{self.in_chans}, {self.num_encoders}, {self.depth}, {self.patch_size}"
            )
        for name, size, patch, dim, heads in zip(
            BRANCHES, self.branch_img_size, self.patch_size, self.embed_dim, self.num_heads
        ):
            if size % patch:
                raise ValueError(
                    f"branch {name}: image size {size} is not divisible by its patch size {patch} "
                    f"(expected a multiple of {patch})"
                )
            check_heads(dim, heads)
            if self.multi_conv and (patch not in _CONV_STEM or dim % 4):
                raise ValueError(
                    f"branch {name}: the 3-conv stem needs patch size 12 or 16 and a width divisible by 4, "
                    f"got patch size {patch} and width {dim}"
                )

    @property
    def grid_size(self) -> tuple[int, int]:
        """Tokens per side in each branch: (20, 14) for 240/12 and 224/16."""
        (s0, s1), (p0, p1) = self.branch_img_size, self.patch_size
        return (s0 // p0, s1 // p1)

    @property
    def num_patches(self) -> tuple[int, int]:
        """Patch tokens per branch: (400, 196)."""
        g0, g1 = self.grid_size
        return (g0 * g0, g1 * g1)


class CrossViT(nn.Module):
    """Cross-attention multi-scale Vision Transformer: two ViT branches that swap information
    through their cls tokens; the prediction is the mean of the two heads' logits.

    Attention maps, per encoder: N x (B, h_S, 1 + N_S, 1 + N_S) over ``[cls_S, S patches]``,
    M x (B, h_L, 1 + N_L, 1 + N_L), then the two cross maps (kind ``"cross"``, one row):
    S's cls over ``[it, L patches]`` (B, h_L, 1, 1 + N_L), L's over S (B, h_S, 1, 1 + N_S).

    Shape: images (B, C, img_size, img_size) -> logits (B, num_classes).
    """

    def __init__(self, config: CrossViTConfig) -> None:
        super().__init__()
        self.config = config
        c, dims = config, config.embed_dim
        stem = ConvStem if c.multi_conv else PatchEmbed
        self.patch_embed = nn.ModuleList(
            [stem(size, patch, c.in_chans, dim) for size, patch, dim in zip(c.branch_img_size, c.patch_size, dims)]
        )
        self.pos_embed = nn.ParameterList([learned_position_embedding(1 + n, d) for n, d in zip(c.num_patches, dims)])
        self.cls_token = nn.ParameterList([nn.Parameter(torch.zeros(1, 1, d)) for d in dims])
        self.pos_drop = nn.Dropout(c.drop_rate)
        # timm's drop-path schedule: K * M rates rising linearly from 0, M per encoder.
        per_encoder = max(c.depth)
        rates = drop_path_rates(c.drop_path_rate, c.num_encoders * per_encoder)
        self.blocks = nn.ModuleList(
            [MultiScaleBlock(c, rates[k * per_encoder : (k + 1) * per_encoder]) for k in range(c.num_encoders)]
        )
        self.norm = nn.ModuleList([nn.LayerNorm(d, eps=1e-6) for d in dims])
        self.head_drop = nn.Dropout(c.drop_rate)
        self.head = nn.ModuleList([classifier_head(d, c.num_classes) for d in dims])
        init_vit_weights(self)
        for token in self.cls_token:
            nn.init.trunc_normal_(token, std=0.02)  # as timm and the official code

    def embed(self, x: Tensor) -> list[Tensor]:
        """Both token sequences, cls token prepended, position embedding added.

        Shape: x (B, C, 240, 240) -> [S (B, 1 + 400, C_S), L (B, 1 + 196, C_L)].
        """
        size = self.config.img_size
        # NOTE(paper): timm and the official code resize any input to each branch's size;
        # we refuse other sizes instead, so that a wrong preprocessing shows.
        check_image(x, in_chans=self.config.in_chans, patch_size=(1, 1), img_size=(size, size))
        xs = []
        for embed, size, cls_token, pos_embed in zip(
            self.patch_embed, self.config.branch_img_size, self.cls_token, self.pos_embed
        ):
            tokens = embed(resize_image(x, size))  # (B, N_i, C_i); L: 240 -> 224 px first
            tokens = torch.cat([cls_token.expand(x.shape[0], -1, -1), tokens], dim=1)  # (B, 1 + N_i, C_i)
            xs.append(self.pos_drop(tokens + pos_embed))
        return xs

    def forward_features(self, x: Tensor) -> list[Tensor]:
        """Shape: x (B, C, H, W) -> [S (B, 1 + N_S, C_S), L (B, 1 + N_L, C_L)], after the final norms."""
        xs = self.embed(x)
        for block in self.blocks:
            xs = block(xs)
        return [norm(x) for norm, x in zip(self.norm, xs)]

    def forward_head(self, xs: list[Tensor], pre_logits: bool = False) -> Tensor:
        """Each branch's head on its cls token, then the mean of the two logits; with ``pre_logits``
        or ``num_classes=0`` the two cls tokens concatenated, (B, C_S + C_L), as timm.

        Shape: [(B, 1 + N_S, C_S), (B, 1 + N_L, C_L)] -> (B, num_classes).
        """
        tokens = [self.head_drop(x[:, 0]) for x in xs]
        if pre_logits or self.config.num_classes == 0:
            return torch.cat(tokens, dim=1)
        logits = [head(x) for head, x in zip(self.head, tokens)]
        return torch.stack(logits).mean(dim=0)

    def forward(self, x: Tensor) -> Tensor:
        """Shape: x (B, C, H, W) -> (B, num_classes)."""
        return self.forward_head(self.forward_features(x))


CONFIGS: dict[str, CrossViTConfig] = {
    # CrossViT paper, Table 1 (K=3, N=1, L=1; heads equal in both branches); counts from timm,
    # each slightly above the paper's rounded figure (book/reference_numbers.md).
    "crossvit_tiny_240": CrossViTConfig(embed_dim=(96, 192), num_heads=(3, 3)),  # 7,014,800 params
    "crossvit_small_240": CrossViTConfig(embed_dim=(192, 384), num_heads=(6, 6)),  # 26,856,272 params
    "crossvit_base_240": CrossViTConfig(embed_dim=(384, 768), num_heads=(12, 12)),  # 105,025,232 params
    "crossvit_9_240": CrossViTConfig(
        embed_dim=(128, 256), depth=(1, 3), num_heads=(4, 4), mlp_ratio=(3.0, 3.0)
    ),  # 8,553,296 params
    "crossvit_15_240": CrossViTConfig(
        embed_dim=(192, 384), depth=(1, 5), num_heads=(6, 6), mlp_ratio=(3.0, 3.0)
    ),  # 27,528,464 params
    "crossvit_18_240": CrossViTConfig(
        embed_dim=(224, 448), depth=(1, 6), num_heads=(7, 7), mlp_ratio=(3.0, 3.0)
    ),  # 43,271,408 params
    "crossvit_9_dagger_240": CrossViTConfig(
        embed_dim=(128, 256), depth=(1, 3), num_heads=(4, 4), mlp_ratio=(3.0, 3.0), multi_conv=True
    ),  # 8,776,592 params
}

MODEL = CrossViT

FAMILY = FamilyInfo(
    chapter=8,
    properties=FamilyProperties("CrossViT", "learned, per branch", "non-overlapping, 2 patch sizes",
                                "linear; cls cross-attention", "no (2 branches)", "chen2021crossvit",
                                "crossvit_small_240", branches=2),
    token_mixers=(Attention, CrossAttention),
    tiny=("crossvit_tiny_240", dict(branch_img_size=(32, 32), patch_size=(8, 16), embed_dim=(16, 26),
                                    num_encoders=1, depth=(1, 2), num_heads=(2, 2))),
)  # fmt: skip


def convert_timm(state_dict: Mapping[str, Tensor], config: CrossViTConfig) -> dict[str, Tensor]:
    """timm ``CrossVit`` -> ``CrossViT``: ``pos_embed_0`` -> ``pos_embed.0`` (``cls_token_i`` too), ``wq`` -> ``q``."""
    renamed = {}
    for key, value in state_dict.items():
        key = re.sub(r"^(pos_embed|cls_token)_(\d)$", r"\1.\2", key)
        key = re.sub(r"\.attn\.w([qkv])\.", r".attn.\1.", key)
        renamed[key] = value
    return renamed
