"""LeViT (Graham et al., 2021): a ViT in ConvNet's clothing, built for fast inference.

A conv stem (four 3x3 stride-2 convs) turns 224 px into a 14x14 map; three transformer
stages run at 14x14, 7x7 and 4x4, joined by *shrink attention* (queries subsampled with
stride 2). There is no position embedding: every attention layer adds a learned per-head
*attention bias* indexed by the offset (|dy|, |dx|) between query and key. Every linear
layer is followed by BatchNorm (it folds into the weights at inference), every activation
is Hardswish, keys are small (D = 16 or 32) and the MLP ratio is 2. Two heads, ``head``
and ``head_dist`` (DeiT-style distillation), are averaged at inference. Names follow
timm's ``levit.py`` (:func:`convert_timm` renames three).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from vitlab.contract import AttentionKind, FamilyInfo, FamilyProperties
from vitlab.layers import DropPath, check_image, check_num_classes, with_attn

STEM_STRIDE = 16  # four stride-2 convs: 224 -> 112 -> 56 -> 28 -> 14


@dataclass(frozen=True, kw_only=True)
class LeViTConfig:
    """Hyperparameters of a LeViT. Defaults are LeViT-128S."""

    img_size: int = 224
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: tuple[int, ...] = (128, 256, 384)
    key_dim: int = 16
    num_heads: tuple[int, ...] = (4, 6, 8)  # per stage; shrink attention has embed_dim[i] // key_dim
    depth: tuple[int, ...] = (2, 3, 4)
    attn_ratio: float = 2.0  # value dim = attn_ratio * key_dim in the stages
    down_attn_ratio: float = 4.0  # ... and in shrink attention
    mlp_ratio: float = 2.0
    distilled: bool = True
    drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    # The written-out product by default, as timm's LeViT: its keys are narrower than its values,
    # so on the CPU F.scaled_dot_product_attention falls back to its math kernel, slower than the
    # product written out (chapter 14). set_fused_attention(model, True) switches it on (GPUs).
    fused_attn: bool = False

    def __post_init__(self) -> None:
        E, D = self.embed_dim, self.key_dim
        if not len(E) == len(self.depth) == len(self.num_heads):
            raise ValueError(
                f"embed_dim, depth and num_heads need one entry per stage, got lengths "
                f"{len(E)}, {len(self.depth)}, {len(self.num_heads)}"
            )
        if self.img_size <= 0 or self.img_size % STEM_STRIDE:
            raise ValueError(f"img_size must be a positive multiple of {STEM_STRIDE} (the stem), got {self.img_size}")
        if min(E + self.depth + self.num_heads + (D, self.in_chans)) <= 0 or E[0] % 8:
            raise ValueError(
                f"embed_dim, depth, num_heads, key_dim must be positive and embed_dim[0] a multiple of 8 (stem "
                f"widths C/8, C/4, C/2), got embed_dim={E}, depth={self.depth}, num_heads={self.num_heads}, key_dim={D}"
            )
        for i, dim in enumerate(E[:-1]):  # shrink attention after stage i has C/D heads
            if dim % D:
                raise ValueError(f"shrink attention needs embed_dim[{i}] divisible by key_dim, got {dim} and {D}")
        for name in ("attn_ratio", "down_attn_ratio"):
            value_dim = getattr(self, name) * D
            if value_dim <= 0 or value_dim != int(value_dim):
                raise ValueError(f"{name} * key_dim must be a positive integer, got {getattr(self, name)} * {D}")
        check_num_classes(self.num_classes)

    @property
    def resolutions(self) -> list[int]:
        """Side of the feature map in each stage: 14, 7, 4 at 224 px."""
        sides = [self.img_size // STEM_STRIDE]
        for _ in self.depth[1:]:
            sides.append((sides[-1] - 1) // 2 + 1)  # stride-2 subsampling keeps rows 0, 2, 4, ...
        return sides


def attention_bias_index(resolution: int, stride: int = 1) -> Tensor:
    """Index into the per-head bias table for every (query, key) pair.

    Keys sit on the ``r x r`` grid, queries on every ``stride``-th point; offset ``(|dy|, |dx|)``
    becomes ``|dy| * r + |dx|`` (the official numbering).

    Shape: -> (N_q, N_k), N_k = r * r, N_q = ceil(r / stride) ** 2.
    """
    r = resolution
    keys = torch.stack(torch.meshgrid(torch.arange(r), torch.arange(r), indexing="ij")).flatten(1)  # (2, N_k)
    q_axis = torch.arange(0, r, stride)
    queries = torch.stack(torch.meshgrid(q_axis, q_axis, indexing="ij")).flatten(1)  # (2, N_q)
    offsets = (queries[:, :, None] - keys[:, None, :]).abs()  # (2, N_q, N_k): |dy|, |dx|
    return offsets[0] * r + offsets[1]


def conv_norm(in_chans: int, out_chans: int) -> nn.Sequential:
    """3x3 stride-2 conv without bias, then BatchNorm. Shape: (B, C_in, H, W) -> (B, C_out, H/2, W/2)."""
    conv = nn.Conv2d(in_chans, out_chans, kernel_size=3, stride=2, padding=1, bias=False)
    return nn.Sequential(OrderedDict(conv=conv, bn=nn.BatchNorm2d(out_chans)))


class LinearNorm(nn.Module):
    """Linear without bias, then BatchNorm over the features of all ``B * N`` tokens (it folds
    into the weights at inference); ``bn_weight_init=0`` starts a residual branch at the identity.

    Shape: x (B, N, C_in) -> (B, N, C_out).
    """

    def __init__(self, in_features: int, out_features: int, *, bn_weight_init: float = 1.0) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=False)
        self.bn = nn.BatchNorm1d(out_features)
        nn.init.constant_(self.bn.weight, bn_weight_init)

    def forward(self, x: Tensor) -> Tensor:
        x = self.linear(x)
        return self.bn(x.flatten(0, 1)).reshape_as(x)  # BatchNorm1d wants (B*N, C)


class LeViTAttention(nn.Module):
    """LeViT attention: ``softmax(q k^T * D**-0.5 + B) v``, Hardswish, BN'd projection.

    ``B = attention_biases[:, attention_bias_idxs]``, zero-initialised and added *after*
    scaling, not rescaled (pitfall 14); the fused path passes it as a float ``attn_mask``. With
    ``stride=2`` this is shrink attention: queries at every second position.

    Shape: x (B, r*r, dim) -> (B, ceil(r/stride)**2, out_dim).
    """

    attn_kind: ClassVar[AttentionKind] = "self"  # its map's label (vitlab.attention_maps)

    def __init__(
        self, dim: int, out_dim: int, *, key_dim: int, num_heads: int, attn_ratio: float, resolution: int,
        stride: int = 1, fused_attn: bool = False,
    ) -> None:  # fmt: skip
        super().__init__()
        self.num_heads, self.key_dim, self.val_dim = num_heads, key_dim, int(attn_ratio * key_dim)
        self.scale = key_dim**-0.5
        self.resolution, self.stride = resolution, stride
        self.fused_attn = fused_attn
        h, D, Dv = num_heads, key_dim, self.val_dim
        if stride == 1:
            self.qkv = LinearNorm(dim, h * (2 * D + Dv))  # per head [q | k | v], as timm and the official code
        else:
            self.kv = LinearNorm(dim, h * (D + Dv))  # per head [k | v]
            self.q = LinearNorm(dim, h * D)
        self.act = nn.Hardswish()
        # A residual branch starts at zero (BN weight 0); shrink attention has no residual
        # around it (the shape changes), so its output must not start at zero.
        self.proj = LinearNorm(h * Dv, out_dim, bn_weight_init=0.0 if stride == 1 else 1.0)
        self.attention_biases = nn.Parameter(torch.zeros(h, resolution * resolution))
        self.attention_bias_idxs: Tensor
        self.register_buffer("attention_bias_idxs", attention_bias_index(resolution, stride), persistent=False)

    def attention_bias(self) -> Tensor:
        """The bias ``B``: ``attention_biases[:, attention_bias_idxs]``. Shape: -> (h, N_q, N_k)."""
        idxs = self.attention_bias_idxs
        return self.attention_biases.index_select(1, idxs.flatten()).view(-1, *idxs.shape)  # [:, idxs], one gather

    def forward(self, x: Tensor, return_attn: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Shape: x (B, r*r, dim) -> (B, N_q, out_dim) [, attn (B, h, N_q, r*r) when ``return_attn``]."""
        h, D = self.num_heads, self.key_dim
        if self.stride == 1:
            qkv = rearrange(self.qkv(x), "B N (h d) -> B h N d", h=h)
            q, k, v = qkv.split([D, D, self.val_dim], dim=-1)  # (B, h, N, D), (B, h, N, D), (B, h, N, Dv)
        else:
            k, v = rearrange(self.kv(x), "B N (h d) -> B h N d", h=h).split([D, self.val_dim], dim=-1)
            grid = rearrange(x, "B (H W) C -> B H W C", H=self.resolution)
            x_q = rearrange(grid[:, :: self.stride, :: self.stride], "B H W C -> B (H W) C")  # (B, N_q, C)
            q = rearrange(self.q(x_q), "B N (h d) -> B h N d", h=h)  # (B, h, N_q, D)
        bias = self.attention_bias()  # (h, N_q, N_k), gathered on every call
        attn = None
        if self.fused_attn and not return_attn:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=self.scale)  # (B, h, N_q, Dv)
        else:
            # Scaling q (N x D numbers) rather than the logits (N x N) is cheaper, same function.
            logits = (q * self.scale) @ k.transpose(-2, -1) + bias  # (B, h, N_q, N_k); bias after scaling (pitfall 14)
            attn = logits.softmax(dim=-1)
            out = attn @ v  # (B, h, N_q, Dv)
        out = self.proj(self.act(rearrange(out, "B h N d -> B N (h d)")))
        return with_attn(out, attn, return_attn)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, key_dim={self.key_dim}, stride={self.stride}, fused_attn={self.fused_attn}"


class LeViTMlp(nn.Module):
    """BN'd linear (C -> hidden), Hardswish, BN'd linear (hidden -> C). Shape: (B, N, C) -> (B, N, C)."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.ln1 = LinearNorm(dim, hidden_dim)
        self.act = nn.Hardswish()
        self.ln2 = LinearNorm(hidden_dim, dim, bn_weight_init=0.0)

    def forward(self, x: Tensor) -> Tensor:
        return self.ln2(self.act(self.ln1(x)))


class LeViTBlock(nn.Module):
    """Residual attention, then residual MLP; no LayerNorm (BN'd linears). Shape: (B, N, C) -> (B, N, C)."""

    def __init__(self, dim: int, *, config: LeViTConfig, num_heads: int, resolution: int) -> None:
        super().__init__()
        self.attn = LeViTAttention(
            dim, dim, key_dim=config.key_dim, num_heads=num_heads, attn_ratio=config.attn_ratio,
            resolution=resolution, fused_attn=config.fused_attn,
        )  # fmt: skip
        self.drop_path1 = DropPath(config.drop_path_rate)
        self.mlp = LeViTMlp(dim, int(dim * config.mlp_ratio))
        self.drop_path2 = DropPath(config.drop_path_rate)

    def forward(self, x: Tensor) -> Tensor:
        """Shape: x (B, N, C) -> (B, N, C)."""
        x = x + self.drop_path1(self.attn(x))
        return x + self.drop_path2(self.mlp(x))


class LeViTDownsample(nn.Module):
    """Shrink attention (C/D heads, value 4D, stride 2, no residual), then a residual MLP.

    Shape: x (B, r*r, C_in) -> (B, ceil(r/2)**2, C_out)."""

    def __init__(self, in_dim: int, out_dim: int, *, config: LeViTConfig, resolution: int) -> None:
        super().__init__()
        self.attn_downsample = LeViTAttention(
            in_dim, out_dim, key_dim=config.key_dim, num_heads=in_dim // config.key_dim,
            attn_ratio=config.down_attn_ratio, resolution=resolution, stride=2, fused_attn=config.fused_attn,
        )  # fmt: skip
        self.mlp = LeViTMlp(out_dim, int(out_dim * config.mlp_ratio))
        self.drop_path = DropPath(config.drop_path_rate)

    def forward(self, x: Tensor) -> Tensor:
        """Shape: x (B, r*r, C_in) -> (B, N_q, C_out)."""
        x = self.attn_downsample(x)
        return x + self.drop_path(self.mlp(x))


class LeViTStage(nn.Module):
    """Optional shrink attention, then ``depth`` blocks. Shape: x (B, N_in, C_in) -> (B, N, C)."""

    def __init__(self, i: int, config: LeViTConfig) -> None:
        super().__init__()
        dims, res = config.embed_dim, config.resolutions
        self.downsample = (
            LeViTDownsample(dims[i - 1], dims[i], config=config, resolution=res[i - 1]) if i > 0 else nn.Identity()
        )
        self.blocks = nn.Sequential(
            *[
                LeViTBlock(dims[i], config=config, num_heads=config.num_heads[i], resolution=res[i])
                for _ in range(config.depth[i])
            ]
        )

    def forward(self, x: Tensor) -> Tensor:
        """Shape: x (B, N_in, C_in) -> (B, N, C)."""
        return self.blocks(self.downsample(x))


class LeViT(nn.Module):
    """LeViT: conv stem, three attention stages, mean pooling, two BN + Linear heads.

    Returns ``(head logits, head_dist logits)`` in training mode (as the official code) and
    their mean in eval mode.
    NOTE(paper): timm returns the mean in training too unless ``set_distilled_training``.

    Attention maps (bias included): per stage, the shrink attention (stages 2 and 3; rows every
    second position of the previous map), then one per block; no cls token. LeViT-128S at 224 px:
    2 x (B, 4, 196, 196), (B, 8, 49, 196), 3 x (B, 6, 49, 49), (B, 16, 16, 49), 4 x (B, 8, 16, 16).

    Shape: images (B, C, H, W) -> logits (B, num_classes), or a pair in distilled training.
    """

    def __init__(self, config: LeViTConfig) -> None:
        super().__init__()
        self.config = config
        C = config.embed_dim[0]
        self.stem = nn.Sequential(OrderedDict([
            ("conv1", conv_norm(config.in_chans, C // 8)), ("act1", nn.Hardswish()),
            ("conv2", conv_norm(C // 8, C // 4)), ("act2", nn.Hardswish()),
            ("conv3", conv_norm(C // 4, C // 2)), ("act3", nn.Hardswish()),
            ("conv4", conv_norm(C // 2, C)),
        ]))  # fmt: skip
        # NOTE(paper): drop path has one rate in every block (official code and timm), no ramp.
        self.stages = nn.Sequential(*[LeViTStage(i, config) for i in range(len(config.embed_dim))])
        self.head = self._make_head()
        self.head_dist = self._make_head() if config.distilled else None

    def _make_head(self) -> nn.Module:
        """BatchNorm, dropout, Linear (LeViT's head is BN'd too). Shape: (B, C) -> (B, num_classes)."""
        C, num_classes = self.config.embed_dim[-1], self.config.num_classes
        check_num_classes(num_classes)
        if num_classes == 0:
            return nn.Identity()
        linear = nn.Linear(C, num_classes)
        nn.init.trunc_normal_(linear.weight, std=0.02)
        nn.init.zeros_(linear.bias)
        return nn.Sequential(OrderedDict(bn=nn.BatchNorm1d(C), drop=nn.Dropout(self.config.drop_rate), linear=linear))

    def forward_features(self, x: Tensor) -> Tensor:
        """Shape: x (B, C, H, W) -> (B, r*r, C_last), r = 4 at 224 px."""
        return self.stages(self.embed(x))

    def embed(self, x: Tensor) -> Tensor:
        """The conv stem's map as tokens. Shape: x (B, C, H, W) -> (B, 14*14, C0) at 224 px."""
        size = self.config.img_size
        # The attention bias tables are built for one set of map sizes, so only img_size is accepted.
        check_image(
            x, in_chans=self.config.in_chans, patch_size=(1, 1), img_size=(size, size),
            fixed_by="the attention bias tables",
        )  # fmt: skip
        x = self.stem(x)  # (B, C, 14, 14)
        return rearrange(x, "B C H W -> B (H W) C")

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Mean-pool the tokens and classify with both heads.

        Shape: x (B, N, C) -> (B, num_classes) [a pair in distilled training], or (B, C) with ``pre_logits``.
        """
        x = x.mean(dim=1)  # (B, C)
        if pre_logits:
            return x
        logits = self.head(x)
        if self.head_dist is None:
            return logits
        dist_logits = self.head_dist(x)
        if self.training:
            return logits, dist_logits
        return (logits + dist_logits) / 2  # inference: average the two heads

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        """Shape: x (B, C, H, W) -> (B, num_classes) [or a pair, see the class docstring]."""
        return self.forward_head(self.forward_features(x))


CONFIGS: dict[str, LeViTConfig] = {
    # Official `specification` (facebookresearch/LeViT levit.py; book/reference_numbers.md):
    # C per stage, D = key_dim, N = heads, X = depth. Counts include head_dist (timm's).
    "levit_128s": LeViTConfig(embed_dim=(128, 256, 384), key_dim=16, num_heads=(4, 6, 8), depth=(2, 3, 4)),  # 7,777,058
    "levit_128": LeViTConfig(embed_dim=(128, 256, 384), key_dim=16, num_heads=(4, 8, 12), depth=(4, 4, 4)),  # 9,213,936
    "levit_192": LeViTConfig(embed_dim=(192, 288, 384), key_dim=32, num_heads=(3, 5, 6), depth=(4, 4, 4)),  # 10,947,069
    "levit_256": LeViTConfig(embed_dim=(256, 384, 512), key_dim=32, num_heads=(4, 6, 8), depth=(4, 4, 4)),  # 18,893,876
    "levit_384": LeViTConfig(
        embed_dim=(384, 512, 768), key_dim=32, num_heads=(6, 9, 12), depth=(4, 4, 4)
    ),  # 39,128,836
}

MODEL = LeViT

FAMILY = FamilyInfo(
    chapter=10,
    properties=FamilyProperties("LeViT", "none (attention bias)", "overlapping conv stem (4x k3 s2)",
                                "linear + BatchNorm", "yes (shrink attention)", "graham2021levit", "levit_128s"),
    token_mixers=(LeViTAttention,),
    tiny=("levit_128s", dict(embed_dim=(16, 24, 32), key_dim=8, num_heads=(2, 2, 3), depth=(1, 1, 1))),
)  # fmt: skip


def convert_timm(state_dict: Mapping[str, Tensor], config: LeViTConfig) -> dict[str, Tensor]:
    """timm ``LevitDistilled`` -> ``LeViT``: the stem's ``linear`` is ``conv``, and ``proj`` and the
    shrink query ``q`` lose timm's ``Sequential`` (``.ln.``); ``attention_bias_idxs`` is recomputed.
    """
    out = {}
    for key, value in state_dict.items():
        if key.endswith("attention_bias_idxs"):
            continue
        if key.startswith("stem."):
            key = key.replace(".linear.", ".conv.")
        out[key.replace(".proj.ln.", ".proj.").replace(".q.ln.", ".q.")] = value
    has_dist = any(k.startswith("head_dist.") for k in out)
    if config.num_classes and has_dist != config.distilled:
        raise ValueError(
            f"config has distilled={config.distilled} but the state dict {'has' if has_dist else 'has no'} head_dist"
        )
    return out
