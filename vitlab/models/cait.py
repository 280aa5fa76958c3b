"""CaiT (Touvron et al., 2021): going deeper with LayerScale and class-attention.

Read beside the paper, in its order:

* §2 **LayerScale**: each residual branch is multiplied by a learnable diagonal matrix,
  ``x + diag(γ1)·SA(η(x))``, then ``x + diag(γ2)·FFN(η(x))`` (:class:`LayerScaleBlock`),
  γ starting at one small ε chosen from the total depth (pitfall 10: not the layer index).
  SA is talking-heads attention (Shazeer et al., 2020): ``proj_l`` mixes the heads'
  logits before the softmax, ``proj_w`` their weights after it.
* §3 **Class-attention**: the patches go through those blocks without a cls token; it
  joins in the last two blocks (:class:`LayerScaleBlockClassAttn`), where it alone is
  updated, attending to ``[cls, patches]``.

Names as in timm's ``cait.py`` and the official code, except that LayerScale is a module
(``ls1.gamma`` for timm's ``gamma_1``; :func:`convert_timm` renames).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from vitlab.contract import AttentionKind, FamilyInfo, FamilyProperties
from vitlab.layers import (
    DropPath,
    Mlp,
    PatchEmbed,
    check_heads,
    check_num_classes,
    check_patch_encoder_config,
    classifier_head,
    explicit_attention,
    fused_attention,
    learned_position_embedding,
    with_attn,
)
from vitlab.models._init import init_vit_weights

# ---------------------------------------------------------------- §2: LayerScale, talking heads


class LayerScale(nn.Module):
    """``diag(γ) x``: each channel times a learnable scalar, written as the broadcast ``x * γ``.

    γ starts at ``init_values`` (ε, small), so every residual branch starts close to zero.
    Shape: x (B, N, C) -> (B, N, C).
    """

    def __init__(self, dim: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init_values)))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


def layer_scale_init_for_depth(depth: int) -> float:
    """The paper's LayerScale init ε for ``depth`` self-attention blocks (class-attention not counted).

    CaiT §2: ε = 0.1 up to depth 18, 1e-5 at depth 24, 1e-6 deeper, in *every* block (pitfall 10).
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth <= 0:
        raise ValueError(f"depth must be a positive int, got {depth!r}")
    if depth <= 18:
        return 0.1
    if depth <= 24:
        return 1e-5
    return 1e-6


class HeadMixing(nn.Linear):
    """An ``nn.Linear(H, H')`` applied across the head axis of attention maps, at every (i, j):
    heads moved last, the linear layer, heads moved back (as timm and the official code).

    Shape: maps (B, H, N_q, N_k) -> (B, H', N_q, N_k).
    """

    def forward(self, maps: Tensor) -> Tensor:
        mixed = F.linear(rearrange(maps, "B h i j -> B i j h"), self.weight, self.bias)  # (B, N_q, N_k, H')
        return rearrange(mixed, "B i j h -> B h i j")


class TalkingHeadAttn(nn.Module):
    """Multi-head self-attention with talking heads (CaiT's self-attention blocks).

    ``proj_l`` mixes the heads' logits before the softmax, ``proj_w`` the weights after it. Only
    the explicit path exists (the fused kernel exposes neither), and the map it returns need
    not have rows that sum to 1 (``attn_kind = "mixed"``).

    Shape: x (B, N, C) -> (B, N, C); attn (B, h, N, N).
    """

    # For vitlab.attention_maps: the softmax maps before the mixing are proj_w's input.
    attn_kind: ClassVar[AttentionKind] = "mixed"
    unmixed_input: ClassVar[str] = "proj_w"

    def __init__(
        self, dim: int, *, num_heads: int = 8, qkv_bias: bool = True, attn_drop: float = 0.0, proj_drop: float = 0.0
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = check_heads(dim, num_heads)
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        # NOTE(paper): talking heads (Shazeer et al., 2020) mix heads with plain H x H
        # matrices; the official CaiT code (and timm) use nn.Linear, which adds an H-vector
        # bias to each map: 2(H^2 + H) parameters per block. Kept for weight compatibility.
        self.proj_l = HeadMixing(num_heads, num_heads)
        self.proj_w = HeadMixing(num_heads, num_heads)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, return_attn: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Shape: x (B, N, C) -> (B, N, C) [, attn (B, h, N, N) when ``return_attn``]."""
        q, k, v = rearrange(self.qkv(x), "B N (qkv h d) -> qkv B h N d", qkv=3, h=self.num_heads)
        logits = (q * self.scale) @ k.transpose(-2, -1)  # (B, h, N, N)
        logits = self.proj_l(logits)  # talking heads: mix the heads' logits at every (i, j) ...
        attn = self.proj_w(logits.softmax(dim=-1))  # ... and their weights after the softmax
        attn = self.attn_drop(attn)
        out = rearrange(attn @ v, "B h N d -> B N (h d)")
        out = self.proj_drop(self.proj(out))
        return with_attn(out, attn, return_attn)


class LayerScaleBlock(nn.Module):
    """CaiT's self-attention block: ``x + diag(γ1)·SA(η(x))``, then ``x + diag(γ2)·FFN(η(x))``.

    η is LayerNorm, SA talking-heads attention, ``ls1``/``ls2`` the two LayerScales.
    Shape: x (B, N, C) -> (B, N, C).
    """

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        init_values: float = 1e-5,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = TalkingHeadAttn(dim, num_heads=num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop)
        self.ls1 = LayerScale(dim, init_values)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)
        self.ls2 = LayerScale(dim, init_values)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop_path(self.ls1(self.attn(self.norm1(x))))  # x + diag(γ1)·SA(η(x))
        return x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))  # x + diag(γ2)·FFN(η(x))


# ---------------------------------------------------------------- §3: class-attention


class ClassAttn(nn.Module):
    """Class-attention: the cls token is the only query over ``[cls, patches]`` (linear in N).

    Shape: x (B, 1 + N, C), cls token first -> (B, 1, C); attn (B, h, 1, 1 + N).
    """

    attn_kind: ClassVar[AttentionKind] = "class"  # its map's label (vitlab.attention_maps)

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int = 8,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        fused_attn: bool = True,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = check_heads(dim, num_heads)
        self.scale = self.head_dim**-0.5
        self.fused_attn = fused_attn
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.k = nn.Linear(dim, dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, return_attn: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Shape: x (B, 1 + N, C) -> (B, 1, C) [, attn (B, h, 1, 1 + N) when ``return_attn``]."""
        heads = "B n (h d) -> B h n d"
        q = rearrange(self.q(x[:, :1]), heads, h=self.num_heads)  # (B, h, 1, d): one query
        k = rearrange(self.k(x), heads, h=self.num_heads)  # (B, h, 1 + N, d)
        v = rearrange(self.v(x), heads, h=self.num_heads)  # (B, h, 1 + N, d)
        attn = None
        if self.fused_attn and not return_attn:
            p = self.attn_drop.p if self.training else 0.0
            out = fused_attention(q, k, v, scale=self.scale, dropout_p=p)
        else:
            out, attn = explicit_attention(q, k, v, scale=self.scale, attn_drop=self.attn_drop)
        out = self.proj_drop(self.proj(rearrange(out, "B h n d -> B n (h d)")))  # (B, 1, C)
        return with_attn(out, attn, return_attn)


class LayerScaleBlockClassAttn(nn.Module):
    """Class-attention block: only the cls token is updated, the patches are read, not changed.

    ``x_cls + diag(γ1)·CA(η([x_cls, x]))``, then ``x_cls + diag(γ2)·FFN(η(x_cls))``.
    Shape: x (B, N, C) patches, x_cls (B, 1, C) -> (B, 1, C).
    """

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        init_values: float = 1e-5,
        fused_attn: bool = True,
    ) -> None:
        super().__init__()
        # No dropout and no drop path here: the official code builds these blocks with 0.
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = ClassAttn(dim, num_heads=num_heads, qkv_bias=qkv_bias, fused_attn=fused_attn)
        self.ls1 = LayerScale(dim, init_values)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.ls2 = LayerScale(dim, init_values)

    def forward(self, x: Tensor, x_cls: Tensor) -> Tensor:
        u = torch.cat([x_cls, x], dim=1)  # (B, 1 + N, C)
        x_cls = x_cls + self.ls1(self.attn(self.norm1(u)))  # x_cls + diag(γ1)·CA(η([x_cls, x]))
        return x_cls + self.ls2(self.mlp(self.norm2(x_cls)))  # x_cls + diag(γ2)·FFN(η(x_cls))


# ---------------------------------------------------------------- the model


@dataclass(frozen=True, kw_only=True)
class CaiTConfig:
    """Hyperparameters of a CaiT. Defaults are CaiT-XXS-24 at 224 px.

    ``init_values`` is LayerScale's ε; ``None`` picks the paper's value for ``depth``.
    """

    img_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 192
    depth: int = 24
    num_heads: int = 4
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    depth_token_only: int = 2
    mlp_ratio_token_only: float = 4.0
    init_values: float | None = None
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    fused_attn: bool = True

    def __post_init__(self) -> None:
        check_patch_encoder_config(img_size=self.img_size, patch_size=self.patch_size, embed_dim=self.embed_dim,
                                   num_heads=self.num_heads, in_chans=self.in_chans, depth=self.depth)  # fmt: skip
        if self.depth_token_only <= 0:
            raise ValueError(
                f"depth_token_only must be >= 1 (the cls token enters only in the class-attention "
                f"blocks), got {self.depth_token_only}"
            )
        if self.init_values is not None and not 0.0 < self.init_values <= 1.0:
            raise ValueError(
                f"init_values (LayerScale ε) must be in (0, 1], got {self.init_values}; "
                f"the paper's value for depth {self.depth} is {layer_scale_init_for_depth(self.depth)}"
            )
        check_num_classes(self.num_classes)

    @property
    def layer_scale_init(self) -> float:
        """The ε every LayerScale starts at: ``init_values``, or the paper's rule for ``depth``."""
        return self.init_values if self.init_values is not None else layer_scale_init_for_depth(self.depth)

    @property
    def num_patches(self) -> int:
        return (self.img_size // self.patch_size) ** 2


class CaiT(nn.Module):
    """CaiT: patch and position embedding (patches only), ``depth`` LayerScale blocks with
    talking heads, ``depth_token_only`` class-attention blocks with the cls token, LayerNorm, head.

    Attention maps: ``depth`` talking-heads maps ``(B, h, N, N)`` over the patches (kind
    ``"mixed"``, the softmax maps in ``unmixed``), then ``depth_token_only`` class-attention
    maps ``(B, h, 1, 1 + N)`` (kind ``"class"``, key 0 the cls token).

    Shape: images (B, C, H, W) -> logits (B, num_classes).
    """

    def __init__(self, config: CaiTConfig) -> None:
        super().__init__()
        self.config = config
        D, eps = config.embed_dim, config.layer_scale_init
        self.patch_embed = PatchEmbed(config.img_size, config.patch_size, config.in_chans, D)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        self.pos_embed = learned_position_embedding(config.num_patches, D)  # (1, N, D): no cls slot
        self.pos_drop = nn.Dropout(config.drop_rate)
        # The same drop-path rate in every block, as in the official code and timm
        # (ViT/DeiT ramp it linearly with depth).
        c = config
        self.blocks = nn.Sequential(
            *[
                LayerScaleBlock(
                    D,
                    num_heads=c.num_heads,
                    mlp_ratio=c.mlp_ratio,
                    qkv_bias=c.qkv_bias,
                    drop=c.drop_rate,
                    attn_drop=c.attn_drop_rate,
                    drop_path=c.drop_path_rate,
                    init_values=eps,
                )  # fmt: skip
                for _ in range(c.depth)
            ]
        )
        self.blocks_token_only = nn.ModuleList(
            [
                LayerScaleBlockClassAttn(
                    D,
                    num_heads=c.num_heads,
                    mlp_ratio=c.mlp_ratio_token_only,
                    qkv_bias=c.qkv_bias,
                    init_values=eps,
                    fused_attn=c.fused_attn,
                )  # fmt: skip
                for _ in range(c.depth_token_only)
            ]
        )
        self.norm = nn.LayerNorm(D, eps=1e-6)
        self.head_drop = nn.Dropout(config.drop_rate)
        self.head = classifier_head(D, config.num_classes)
        init_vit_weights(self)
        nn.init.trunc_normal_(self.cls_token, std=0.02)  # official init (ViT's is ~0)

    def forward_patches(self, x: Tensor) -> Tensor:
        """The self-attention stage: patches only, no cls token. Shape: (B, C, H, W) -> (B, N, D)."""
        x = self.patch_embed(x)  # (B, N, D); raises on a wrong channel count or size
        return self.blocks(self.pos_drop(x + self.pos_embed))

    def forward_features(self, x: Tensor) -> Tensor:
        """Shape: x (B, C, H, W) -> (B, 1 + N, D): [cls, patches], after the final norm."""
        x = self.forward_patches(x)
        x_cls = self.cls_token.expand(x.shape[0], -1, -1)  # (B, 1, D)
        for block in self.blocks_token_only:
            x_cls = block(x, x_cls)
        return self.norm(torch.cat([x_cls, x], dim=1))

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Classify from the cls token. Shape: x (B, 1 + N, D) -> (B, num_classes) ((B, D) with ``pre_logits``)."""
        x = self.head_drop(x[:, 0])
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        """Shape: x (B, C, H, W) -> (B, num_classes)."""
        return self.forward_head(self.forward_features(x))


CONFIGS: dict[str, CaiTConfig] = {
    # CaiT paper, Table 1 (24 SA blocks + 2 CA blocks, ε = 1e-5 per §2); timm counts.
    "cait_xxs24_224": CaiTConfig(embed_dim=192, depth=24, num_heads=4, init_values=1e-5),  # 11,956,264 params
    "cait_xs24_224": CaiTConfig(embed_dim=288, depth=24, num_heads=6, init_values=1e-5),  # 26,560,648 params
    "cait_s24_224": CaiTConfig(embed_dim=384, depth=24, num_heads=8, init_values=1e-5),  # 46,916,200 params
}

MODEL = CaiT

FAMILY = FamilyInfo(
    chapter=6,
    properties=FamilyProperties("CaiT", "learned, N (patches only)", "non-overlapping (k16 s16)",
                                "linear; talking heads", "no (cls joins late)", "touvron2021cait", "cait_xxs24_224"),
    token_mixers=(TalkingHeadAttn, ClassAttn),
    tiny=("cait_xxs24_224", dict(patch_size=16, embed_dim=24, depth=2, num_heads=2, init_values=None)),
)  # fmt: skip


def convert_timm(state_dict: Mapping[str, Tensor], config: CaiTConfig) -> dict[str, Tensor]:
    """timm ``Cait`` (or official) weights -> ``CaiT``: ``gamma_1``/``gamma_2`` -> ``ls1.gamma``/``ls2.gamma``."""
    out = {}
    for key, value in state_dict.items():
        key = key.removeprefix("module.")  # the official checkpoints were saved from DDP
        key = key.replace(".gamma_1", ".ls1.gamma").replace(".gamma_2", ".ls2.gamma")
        out[key] = value
    return out
