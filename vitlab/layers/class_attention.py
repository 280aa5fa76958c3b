"""Attention with a single query: the first token (a cls token) reads all the tokens.

CaiT's class-attention and CrossViT's cross-attention are this layer: one query row
makes the map ``(1, 1 + N)`` per head instead of ``(1 + N, 1 + N)``, so its cost is
linear in N. Separate ``q``, ``k``, ``v`` layers, as in CaiT's official code and timm.
"""

from __future__ import annotations

from einops import rearrange
from torch import Tensor, nn

from vitlab.contract import AttentionKind
from vitlab.layers.attention import check_heads, explicit_attention, fused_attention, with_attn


class ClassAttention(nn.Module):
    """The first token queries ``[cls, patches]``; only the first token is returned.

    The softmax is the standard one, so both paths exist (``fused_attn``). ``kind`` labels
    its map (:func:`vitlab.attention_maps`): ``"class"`` when the query is
    the model's own class token (CaiT), ``"cross"`` when it is another branch's class token
    over this branch's patches (CrossViT).

    Shape: x (B, 1 + N, C), query token first -> (B, 1, C); attn (B, h, 1, 1 + N).
    """

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int = 8,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        fused_attn: bool = True,
        kind: AttentionKind = "class",
    ) -> None:
        super().__init__()
        if kind not in ("class", "cross"):
            raise ValueError(f"kind must be 'class' or 'cross', got {kind!r}")
        self.attn_kind: AttentionKind = kind
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

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, fused_attn={self.fused_attn}"
