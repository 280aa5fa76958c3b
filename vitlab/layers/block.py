"""The pre-norm transformer encoder block: x + Attn(LN(x)), then x + MLP(LN(x))."""

from __future__ import annotations

from torch import Tensor, nn

from vitlab.layers.attention import Attention, with_attn
from vitlab.layers.drop_path import DropPath
from vitlab.layers.mlp import Mlp


class Block(nn.Module):
    """Pre-norm encoder block, as ViT and DeiT use it: ``x + Attn(LN(x))``, then ``x + MLP(LN(x))``.

    A paper that changes the block (CaiT's LayerScale, DeepViT's re-attention) writes its own
    in its model file. ``drop`` is the dropout after the attention projection and in the MLP,
    ``drop_path`` the stochastic depth of both branches, ``norm_eps`` 1e-6 as ViT's JAX code.

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
        scale: float | None = None,
        norm_eps: float = 1e-6,
        fused_attn: bool = True,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(
            dim,
            num_heads=num_heads,
            qkv_bias=qkv_bias,
            attn_drop=attn_drop,
            proj_drop=drop,
            scale=scale,
            fused_attn=fused_attn,
        )
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor, return_attn: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Shape: x (B, N, C) -> (B, N, C) [, attn (B, h, N, N) when ``return_attn``]."""
        attn_map = None
        if return_attn:
            y, attn_map = self.attn(self.norm1(x), return_attn=True)
        else:
            y = self.attn(self.norm1(x))
        x = x + self.drop_path1(y)
        x = x + self.drop_path2(self.mlp(self.norm2(x)))
        return with_attn(x, attn_map, return_attn)


def drop_path_rates(drop_path_rate: float, depth: int) -> list[float]:
    """Stochastic depth rising linearly from 0 (first block) to ``drop_path_rate`` (last), in plain Python."""
    return [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]


def encoder_blocks(
    dim: int,
    depth: int,
    *,
    num_heads: int,
    mlp_ratio: float = 4.0,
    qkv_bias: bool = True,
    drop: float = 0.0,
    attn_drop: float = 0.0,
    drop_path_rate: float = 0.0,
    fused_attn: bool = True,
) -> nn.Sequential:
    """ViT's stack of ``depth`` pre-norm blocks (``blocks.0`` ... as in timm). Shape: x (B, N, C) -> (B, N, C)."""
    return nn.Sequential(
        *[
            Block(
                dim,
                num_heads=num_heads,
                mlp_ratio=mlp_ratio,
                qkv_bias=qkv_bias,
                drop=drop,
                attn_drop=attn_drop,
                drop_path=rate,
                fused_attn=fused_attn,
            )
            for rate in drop_path_rates(drop_path_rate, depth)
        ]
    )
