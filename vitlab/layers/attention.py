"""Multi-head self-attention with an explicit (teaching) path and a fused path.

The explicit path writes ``softmax(q k^T * scale) v`` out and can return the map; the fused
path calls :func:`torch.nn.functional.scaled_dot_product_attention`. Tests check both agree.
"""

from __future__ import annotations

from typing import ClassVar

import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from vitlab.contract import AttentionKind


def check_heads(dim: int, num_heads: int) -> int:
    """Return ``head_dim = dim // num_heads``; raise if the split is not exact."""
    if num_heads <= 0:
        raise ValueError(f"num_heads must be positive, got {num_heads}")
    if dim % num_heads != 0:
        raise ValueError(
            f"embed dim {dim} is not divisible by num_heads {num_heads} "
            f"(expected a multiple of {num_heads}, e.g. {num_heads * max(1, dim // num_heads)})"
        )
    return dim // num_heads


def with_attn(out: Tensor, attn: Tensor | None, return_attn: bool) -> Tensor | tuple[Tensor, Tensor]:
    """``(out, attn)`` when ``return_attn`` (the layer then took the explicit path and has
    the map), else ``out``: the one return statement of every ``return_attn`` layer."""
    if not return_attn:
        return out
    if attn is None:
        raise RuntimeError("return_attn=True but no attention map was computed")
    return out, attn


def explicit_attention(
    q: Tensor, k: Tensor, v: Tensor, *, scale: float, mask: Tensor | None = None, attn_drop: nn.Module | None = None
) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention, written out.

    ``mask`` (bool, broadcastable, ``True`` = attend): a row with every key masked returns
    zeros, not the NaNs of a softmax over ``-inf``.

    Shape: q (B, h, N_q, d), k (B, h, N_k, d), v (B, h, N_k, d_v)
    -> out (B, h, N_q, d_v), attn (B, h, N_q, N_k).
    """
    # Scale the logits *before* the softmax, by head_dim**-0.5 (pitfall 3).
    logits = (q * scale) @ k.transpose(-2, -1)  # (B, h, N_q, N_k)
    if mask is not None:
        # Out of place: the result must be assigned (pitfall 4).
        logits = logits.masked_fill(~mask, float("-inf"))
    attn = logits.softmax(dim=-1)
    if mask is not None:
        attn = attn.nan_to_num(0.0)  # rows with every key masked
    if attn_drop is not None:
        attn = attn_drop(attn)
    return attn @ v, attn


def fused_attention(
    q: Tensor, k: Tensor, v: Tensor, *, scale: float, mask: Tensor | None = None, dropout_p: float = 0.0
) -> Tensor:
    """The same function as :func:`explicit_attention` through PyTorch's fused kernel.

    Shape: q (B, h, N_q, d), k (B, h, N_k, d), v (B, h, N_k, d_v) -> (B, h, N_q, d_v).
    """
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    if mask is not None:
        # Rows with every key masked: zeros, as on the explicit path.
        out = out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return out


class Attention(nn.Module):
    """Multi-head self-attention (Vaswani et al., 2017) as ViT uses it.

    One ``qkv`` linear layer, its output features ordered ``(qkv h d)`` as in timm and the
    original JAX code (pitfall 5: ``(h d qkv)`` loads pretrained weights silently wrong).
    ``scale`` is ``head_dim**-0.5`` unless a paper says otherwise; ``fused_attn`` picks
    ``F.scaled_dot_product_attention`` (``return_attn=True`` always takes the explicit path).

    Shape: x (B, N, C) -> (B, N, C); attn (B, h, N, N).
    """

    attn_kind: ClassVar[AttentionKind] = "self"  # its map's label (vitlab.attention_maps)

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int = 8,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        scale: float | None = None,
        fused_attn: bool = True,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = check_heads(dim, num_heads)
        self.scale = scale if scale is not None else self.head_dim**-0.5
        self.fused_attn = fused_attn
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, return_attn: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Shape: x (B, N, C), mask bool broadcastable to (B, h, N, N) -> (B, N, C)
        [, attn (B, h, N, N) when ``return_attn``]."""
        qkv = rearrange(self.qkv(x), "B N (qkv h d) -> qkv B h N d", qkv=3, h=self.num_heads)
        q, k, v = qkv.unbind(0)  # each (B, h, N, d)
        attn = None
        if self.fused_attn and not return_attn:
            p = self.attn_drop.p if self.training else 0.0
            out = fused_attention(q, k, v, scale=self.scale, mask=mask, dropout_p=p)
        else:
            out, attn = explicit_attention(q, k, v, scale=self.scale, mask=mask, attn_drop=self.attn_drop)
        out = rearrange(out, "B h N d -> B N (h d)")
        out = self.proj_drop(self.proj(out))
        return with_attn(out, attn, return_attn)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, fused_attn={self.fused_attn}"
