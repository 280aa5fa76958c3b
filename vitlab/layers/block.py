"""The pre-norm transformer encoder block: x + Attn(LN(x)), then x + MLP(LN(x))."""

from __future__ import annotations

from torch import Tensor, nn

from vitlab.layers.attention import Attention, with_attn
from vitlab.layers.drop_path import DropPath
from vitlab.layers.layer_scale import LayerScale
from vitlab.layers.mlp import Mlp


class Block(nn.Module):
    """Pre-norm encoder block (ViT, DeiT, and with ``init_values`` the LayerScale block).

    Args:
        dim: token width ``C``.
        num_heads: attention heads.
        mlp_ratio: MLP hidden width over ``C`` (4 in ViT, 3 in DeepViT and T2T-ViT).
        init_values: if set, a :class:`LayerScale` after each branch (CaiT).
        attn: an attention module to use instead of :class:`Attention` (a paper's own
            attention, e.g. DeepViT's re-attention); it must map (B, N, C) -> (B, N, C)
            and accept ``return_attn``. With ``attn`` the arguments of the default
            attention (``num_heads``, ``qkv_bias``, ``attn_drop``, ``fused_attn``) raise a
            ``TypeError`` instead of being ignored.
        act_layer: MLP activation.
        norm_eps: LayerNorm epsilon (1e-6 in ViT's JAX code and timm).

    Shape: x (B, N, C) -> (B, N, C).
    """

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int | None = None,
        mlp_ratio: float = 4.0,
        qkv_bias: bool | None = None,
        drop: float = 0.0,
        attn_drop: float | None = None,
        drop_path: float = 0.0,
        init_values: float | None = None,
        attn: nn.Module | None = None,
        act_layer: type[nn.Module] = nn.GELU,
        norm_eps: float = 1e-6,
        fused_attn: bool | None = None,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        attn_args = {"num_heads": num_heads, "qkv_bias": qkv_bias, "attn_drop": attn_drop, "fused_attn": fused_attn}
        if attn is not None:
            ignored = sorted(k for k, v in attn_args.items() if v is not None)
            if ignored:
                raise TypeError(
                    f"Block got attn={type(attn).__name__} and {ignored}, which only configure the default "
                    f"Attention and would be ignored; set them on the attention module instead"
                )
            self.attn = attn
        else:
            if num_heads is None:
                raise TypeError("Block needs num_heads (or an attention module as attn=)")
            self.attn = Attention(
                dim,
                num_heads=num_heads,
                qkv_bias=True if qkv_bias is None else qkv_bias,
                attn_drop=0.0 if attn_drop is None else attn_drop,
                proj_drop=drop,
                fused_attn=True if fused_attn is None else fused_attn,
            )
        self.ls1 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=drop)
        self.ls2 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor, return_attn: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Shape: x (B, N, C) -> (B, N, C) [, attn (B, h, N, N) when ``return_attn``]."""
        attn_map = None
        if return_attn:
            y, attn_map = self.attn(self.norm1(x), return_attn=True)
        else:
            y = self.attn(self.norm1(x))
        x = x + self.drop_path1(self.ls1(y))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return with_attn(x, attn_map, return_attn)


def drop_path_rates(drop_path_rate: float, depth: int) -> list[float]:
    """Stochastic depth rising linearly from 0 (first block) to ``drop_path_rate`` (last).

    Plain Python, so a model can be built on the ``meta`` device to count parameters.
    """
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
    """ViT's stack of ``depth`` pre-norm blocks (``blocks.0`` ... as in timm).

    Shape: x (B, N, C) -> (B, N, C).
    """
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
