"""T2T-ViT (Yuan et al., 2021): Tokens-to-Token, a soft split of overlapping patches.

ViT cuts the image into non-overlapping 16x16 patches in one step. T2T-ViT gets to the
same 14x14 grid in three *overlapping* steps (the "soft split", ``nn.Unfold``), and between
two steps a small attention layer mixes the tokens and their re-structurized image:

    image (B, 3, 224, 224) --unfold k7 s4 p2--> (B, 3136, 147)   56 x 56 tokens
        -> token layer (147 -> 64) -> image (B, 64, 56, 56)
        --unfold k3 s2 p1--> (B, 784, 576)                        28 x 28
        -> token layer (576 -> 64) -> image (B, 64, 28, 28)
        --unfold k3 s2 p1--> (B, 196, 576)                        14 x 14
        -> Linear 576 -> D, [cls], fixed sinusoid position embedding, ViT blocks.

The token layer is a one-head transformer (``t2t_vit_t_*``) or a Performer (``t2t_vit_*``).
Matches the official code (yitu-opensource/T2T-ViT, ``models/t2t_vit.py``,
``token_transformer.py``, ``token_performer.py``, ``transformer_block.py`` at commit
0f63dc95), parameter names included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from einops import rearrange
from torch import Tensor, nn

from vitlab.contract import AttentionKind, FamilyInfo, FamilyProperties
from vitlab.layers import (
    Attention,
    Block,
    Mlp,
    check_heads,
    check_image,
    check_num_classes,
    classifier_head,
    conv_output_size,
    drop_path_rates,
    explicit_attention,
    fused_attention,
    sincos_1d_position_embedding,
    with_attn,
)
from vitlab.models._init import init_vit_weights

# (kernel, stride, padding) of the three soft splits; their strides multiply to 16.
SOFT_SPLITS: tuple[tuple[int, int, int], ...] = ((7, 4, 2), (3, 2, 1), (3, 2, 1))
TOTAL_STRIDE = 16


# Tokens per side after a soft split: an unfold is a convolution's sliding window.
unfold_output_size = conv_output_size


@dataclass(frozen=True, kw_only=True)
class T2TViTConfig:
    """Hyperparameters of a T2T-ViT. Defaults are T2T-ViT-14 (Performer token layers).

    ``qk_scale``: ``"head_dim"`` (the official builders without pretrained weights) or
    ``"embed_dim"`` (with them: the released weights were trained with it).
    """

    img_size: int = 224
    in_chans: int = 3
    num_classes: int = 1000
    tokens_type: Literal["performer", "transformer"] = "performer"
    token_dim: int = 64
    kernel_ratio: float = 0.5  # Performer: token_dim * 0.5 = 32 random features
    performer_drop_rate: float = 0.1  # hard-coded (dp1 = dp2 = 0.1) in the official Performer
    embed_dim: int = 384
    depth: int = 14
    num_heads: int = 6
    mlp_ratio: float = 3.0
    qkv_bias: bool = False
    qk_scale: Literal["head_dim", "embed_dim"] = "head_dim"
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    fused_attn: bool = True

    def __post_init__(self) -> None:
        if self.img_size <= 0 or self.img_size % TOTAL_STRIDE:
            raise ValueError(
                f"img_size {self.img_size} is not a positive multiple of the soft splits' total stride "
                f"{TOTAL_STRIDE} (expected e.g. 224 for a 14x14 token grid)"
            )
        check_heads(self.embed_dim, self.num_heads)
        check_num_classes(self.num_classes)
        if self.tokens_type not in ("performer", "transformer"):
            raise ValueError(f"tokens_type must be 'performer' or 'transformer', got {self.tokens_type!r}")
        if self.qk_scale not in ("head_dim", "embed_dim"):
            raise ValueError(f"qk_scale must be 'head_dim' or 'embed_dim', got {self.qk_scale!r}")
        if self.in_chans <= 0 or self.depth <= 0 or self.token_dim <= 0:
            raise ValueError(
                f"in_chans, depth and token_dim must be positive, got {self.in_chans}, {self.depth}, {self.token_dim}"
            )
        if int(self.token_dim * self.kernel_ratio) < 1:
            raise ValueError(
                f"kernel_ratio {self.kernel_ratio} leaves no random features for token_dim {self.token_dim} "
                f"(expected int(token_dim * kernel_ratio) >= 1)"
            )

    @property
    def grid_sizes(self) -> list[int]:
        """Tokens per side after each soft split: 56, 28, 14 at 224 px."""
        sizes, side = [], self.img_size
        for kernel, stride, padding in SOFT_SPLITS:
            side = unfold_output_size(side, kernel, stride, padding)
            sizes.append(side)
        return sizes

    @property
    def num_patches(self) -> int:
        return self.grid_sizes[-1] ** 2


class TokenAttention(nn.Module):
    """One-head attention that changes the width, ``dim -> in_dim``, with ``v`` as the skip
    (``x + attn(x)`` is impossible across widths; the official code adds ``v``).

    Shape: x (B, N, dim) -> (B, N, in_dim).
    """

    attn_kind: ClassVar[AttentionKind] = "self"  # its map's label (vitlab.attention_maps)

    def __init__(self, dim: int, in_dim: int, *, qkv_bias: bool = False, fused_attn: bool = True) -> None:
        super().__init__()
        self.in_dim = in_dim
        # NOTE(paper): the official scale is dim**-0.5 with dim the *input* width (147, 576),
        # not the width of q and k (64). Kept, because the released weights depend on it.
        self.scale = dim**-0.5
        self.fused_attn = fused_attn
        self.qkv = nn.Linear(dim, in_dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(in_dim, in_dim)

    def forward(self, x: Tensor, return_attn: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Shape: x (B, N, dim) -> (B, N, in_dim) [, attn (B, 1, N, N) when ``return_attn``]."""
        qkv = rearrange(self.qkv(x), "B N (qkv h d) -> qkv B h N d", qkv=3, h=1)
        q, k, v = qkv.unbind(0)  # each (B, 1, N, in_dim)
        attn = None
        if self.fused_attn and not return_attn:
            out = fused_attention(q, k, v, scale=self.scale)
        else:
            out, attn = explicit_attention(q, k, v, scale=self.scale)
        out = self.proj(rearrange(out, "B h N d -> B N (h d)"))
        out = rearrange(v, "B h N d -> B N (h d)") + out  # skip connection through v
        return with_attn(out, attn, return_attn)


class TokenTransformer(nn.Module):
    """The T2T module's transformer layer (official ``Token_transformer``, mlp ratio 1).

    Shape: x (B, N, dim) -> (B, N, in_dim).
    """

    def __init__(self, dim: int, in_dim: int, *, mlp_ratio: float = 1.0, fused_attn: bool = True) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)  # eps 1e-5, as the official nn.LayerNorm default
        self.attn = TokenAttention(dim, in_dim, fused_attn=fused_attn)
        self.norm2 = nn.LayerNorm(in_dim)
        self.mlp = Mlp(in_dim, int(in_dim * mlp_ratio))

    def forward(self, x: Tensor) -> Tensor:
        """Shape: x (B, N, dim) -> (B, N, in_dim)."""
        x = self.attn(self.norm1(x))  # no "x +": the width changes, the skip is inside
        return x + self.mlp(self.norm2(x))


class TokenPerformer(nn.Module):
    """The T2T module's Performer layer (official ``Token_performer``): linear attention.

    softmax(q k^T) is approximated by phi(q) phi(k)^T with positive random features
    ``phi(x) = exp(w x - |x|^2 / 2) / sqrt(m)``: O(N m d) instead of O(N^2 d), no softmax, so no
    fused path. ``w`` (m x in_dim) is a frozen parameter, as in the official code.

    Shape: x (B, N, dim) -> (B, N, in_dim).
    """

    # Its map (phi(q) phi(k)^T / D: non-negative, rows sum to 1) approximates a softmax self-attention map.
    attn_kind: ClassVar[AttentionKind] = "self"

    def __init__(self, dim: int, in_dim: int, *, kernel_ratio: float = 0.5, drop: float = 0.1) -> None:
        super().__init__()
        self.emb = in_dim
        self.kqv = nn.Linear(dim, 3 * in_dim)  # official order k, q, v (and with bias)
        self.dp = nn.Dropout(drop)
        self.proj = nn.Linear(in_dim, in_dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(in_dim)
        self.epsilon = 1e-8
        # Official names mlp.0 / mlp.2, and dropout after the second Linear only.
        self.mlp = nn.Sequential(nn.Linear(in_dim, in_dim), nn.GELU(), nn.Linear(in_dim, in_dim), nn.Dropout(drop))
        self.m = int(in_dim * kernel_ratio)
        w = nn.init.orthogonal_(torch.empty(self.m, in_dim)) * math.sqrt(self.m)  # orthogonal rows of norm sqrt(m)
        self.w = nn.Parameter(w, requires_grad=False)

    def prm_exp(self, x: Tensor) -> Tensor:
        """Positive random features. Shape: x (B, N, d) -> (B, N, m)."""
        xd = (x * x).sum(dim=-1, keepdim=True) / 2  # (B, N, 1)
        wtx = torch.einsum("bti,mi->btm", x.float(), self.w)  # float: exp overflows in half precision
        return torch.exp(wtx - xd) / math.sqrt(self.m)

    def single_attn(self, x: Tensor, return_attn: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Shape: x (B, N, dim) -> (B, N, in_dim) [, attn (B, 1, N, N), written out only on request]."""
        k, q, v = torch.split(self.kqv(x), self.emb, dim=-1)  # each (B, N, d)
        kp, qp = self.prm_exp(k), self.prm_exp(q)  # (B, N, m)
        D = torch.einsum("bti,bi->bt", qp, kp.sum(dim=1)).unsqueeze(dim=2)  # normaliser (B, N, 1)
        kptv = torch.einsum("bin,bim->bnm", v.float(), kp)  # phi(k)^T v: (B, d, m)
        y = torch.einsum("bti,bni->btn", qp, kptv) / (D + self.epsilon)  # (B, N, d)
        out = v + self.dp(self.proj(y))  # skip connection through v, as in TokenAttention
        if return_attn:
            attn = (qp @ kp.transpose(1, 2)) / (D + self.epsilon)  # (B, N, N), rows sum to ~1
            return out, attn[:, None]  # (B, 1, N, N): one "head"
        return out

    def forward(self, x: Tensor, return_attn: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Shape: x (B, N, dim) -> (B, N, in_dim) [, attn (B, 1, N, N) when ``return_attn``]."""
        out = self.single_attn(self.norm1(x), return_attn)
        x, attn = out if isinstance(out, tuple) else (out, None)
        x = x + self.mlp(self.norm2(x))
        return with_attn(x, attn, return_attn)


class T2TModule(nn.Module):
    """Three soft splits with a token layer and a re-structurization between them, then a Linear.

    Shape: x (B, C, H, W) -> (B, (H/16)(W/16), D).
    """

    def __init__(self, config: T2TViTConfig) -> None:
        super().__init__()
        (k0, s0, p0), (k1, s1, p1), (k2, s2, p2) = SOFT_SPLITS
        self.soft_split0 = nn.Unfold(kernel_size=k0, stride=s0, padding=p0)
        self.soft_split1 = nn.Unfold(kernel_size=k1, stride=s1, padding=p1)
        self.soft_split2 = nn.Unfold(kernel_size=k2, stride=s2, padding=p2)
        dims = (config.in_chans * k0 * k0, config.token_dim * k1 * k1)  # 147, 576
        if config.tokens_type == "transformer":
            self.attention1 = TokenTransformer(dims[0], config.token_dim, fused_attn=config.fused_attn)
            self.attention2 = TokenTransformer(dims[1], config.token_dim, fused_attn=config.fused_attn)
        else:
            r, p = config.kernel_ratio, config.performer_drop_rate
            self.attention1 = TokenPerformer(dims[0], config.token_dim, kernel_ratio=r, drop=p)
            self.attention2 = TokenPerformer(dims[1], config.token_dim, kernel_ratio=r, drop=p)
        self.project = nn.Linear(config.token_dim * k2 * k2, config.embed_dim)

    @staticmethod
    def restructurize(x: Tensor) -> Tensor:
        """Tokens back to an image, one channel per feature. Shape: x (B, H*W, C) -> (B, C, H, W)."""
        side = math.isqrt(x.shape[1])
        return rearrange(x, "B (H W) C -> B C H W", H=side, W=side)

    def forward(self, x: Tensor) -> Tensor:
        """Shape: x (B, C, H, W) -> (B, N, D)."""
        x = self.soft_split0(x).transpose(1, 2)  # (B, 3136, 147): 56 x 56 windows of 7 x 7 x 3
        for attention, soft_split in ((self.attention1, self.soft_split1), (self.attention2, self.soft_split2)):
            x = attention(x)
            x = soft_split(self.restructurize(x)).transpose(1, 2)  # (B, 784, 576), then (B, 196, 576)
        return self.project(x)  # (B, 196, D)


class T2TViT(nn.Module):
    """T2T-ViT: the T2T module, then a ViT backbone (cls token, fixed sinusoid position
    embedding, pre-norm blocks with mlp ratio 3 and no qkv bias, LayerNorm, head).

    Attention maps: the two token layers' (one head, over one soft split's windows: a
    softmax map, or the Performer's implicit ``phi(q) phi(k)^T / D``), then one per backbone
    block over ``[cls, patches]``: (B, 1, 3136, 3136), (B, 1, 784, 784), depth x (B, h, 1 + N, 1 + N).

    Shape: images (B, C, H, W) -> logits (B, num_classes).
    """

    def __init__(self, config: T2TViTConfig) -> None:
        super().__init__()
        self.config = config
        D = config.embed_dim
        self.tokens_to_token = T2TModule(config)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        # Fixed (not learned) but a parameter, as in the official code: saved in the state
        # dict and counted in "all" parameters, not in the trainable ones.
        table = sincos_1d_position_embedding(config.num_patches + 1, D)  # (1 + N, D), cls at position 0
        self.pos_embed = nn.Parameter(table[None], requires_grad=False)
        self.pos_drop = nn.Dropout(config.drop_rate)
        head_dim = D // config.num_heads
        scale = (D if config.qk_scale == "embed_dim" else head_dim) ** -0.5
        self.blocks = nn.Sequential(
            *[
                Block(
                    D,
                    mlp_ratio=config.mlp_ratio,
                    drop=config.drop_rate,
                    drop_path=rate,
                    num_heads=config.num_heads,
                    qkv_bias=config.qkv_bias,
                    attn_drop=config.attn_drop_rate,
                    scale=scale,
                    fused_attn=config.fused_attn,
                    norm_eps=1e-5,  # the official code uses nn.LayerNorm's default
                )
                for rate in drop_path_rates(config.drop_path_rate, config.depth)
            ]
        )
        self.norm = nn.LayerNorm(D)
        self.head = classifier_head(D, config.num_classes)
        init_vit_weights(self)  # leaves pos_embed and the Performers' w alone
        nn.init.trunc_normal_(self.cls_token, std=0.02)  # official init (ViT's is ~0)

    def embed(self, x: Tensor) -> Tensor:
        """Tokens-to-token, cls token, position embedding. Shape: x (B, C, H, W) -> (B, 1 + N, D)."""
        size = self.config.img_size
        # The position embedding is built for one token grid, so only img_size is accepted.
        check_image(x, in_chans=self.config.in_chans, patch_size=(1, 1), img_size=(size, size))
        x = self.tokens_to_token(x)  # (B, N, D)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1 + N, D)
        return self.pos_drop(x + self.pos_embed)

    def forward_features(self, x: Tensor) -> Tensor:
        """Shape: x (B, C, H, W) -> (B, 1 + N, D), after the final norm."""
        return self.norm(self.blocks(self.embed(x)))

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Classify from the cls token. Shape: x (B, 1 + N, D) -> (B, num_classes) ((B, D) with ``pre_logits``)."""
        x = x[:, 0]
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        """Shape: x (B, C, H, W) -> (B, num_classes), from the cls token."""
        return self.forward_head(self.forward_features(x))


CONFIGS: dict[str, T2TViTConfig] = {
    # T2T-ViT paper, Table 1 (and the official builders). Counts: all (with the frozen
    # position embedding and Performer w) / trainable, from the official code at 0f63dc95.
    "t2t_vit_14": T2TViTConfig(embed_dim=384, depth=14, num_heads=6),  # 21,545,550 / 21,465,806
    "t2t_vit_19": T2TViTConfig(embed_dim=448, depth=19, num_heads=7),  # 39,177,422 / 39,085,070
    "t2t_vit_24": T2TViTConfig(embed_dim=512, depth=24, num_heads=8),  # 64,105,934 / 64,000,974
    # T2T-ViT_t: transformer layers in the T2T module (paper Table 1, "T2T-ViT_t-14").
    "t2t_vit_t_14": T2TViTConfig(
        tokens_type="transformer", embed_dim=384, depth=14, num_heads=6
    ),  # 21,541,070 / 21,465,422
    "t2t_vit_t_19": T2TViTConfig(
        tokens_type="transformer", embed_dim=448, depth=19, num_heads=7
    ),  # 39,172,942 / 39,084,686
    "t2t_vit_t_24": T2TViTConfig(
        tokens_type="transformer", embed_dim=512, depth=24, num_heads=8
    ),  # 64,101,454 / 64,000,590
}

MODEL = T2TViT

FAMILY = FamilyInfo(
    chapter=7,
    properties=FamilyProperties("T2T-ViT", "fixed sin-cos, 1 + N", "overlapping soft split (unfold k7 s4 …)",
                                "linear", "partial (tokenization)", "yuan2021t2t", "t2t_vit_14"),
    token_mixers=(TokenTransformer, TokenPerformer, Attention),
    tiny=("t2t_vit_14", dict(token_dim=14, embed_dim=32, depth=2, num_heads=2)),
)  # fmt: skip
