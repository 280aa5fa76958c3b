"""CvT (Wu et al., 2021): convolutions inside the vision transformer.

Three stages. Each starts with a *convolutional token embedding* (an overlapping conv +
LayerNorm) that shrinks the token map, 224 px -> 56x56 -> 28x28 -> 14x14 tokens, and
widens it, 64 -> 192 -> 384 channels for CvT-13. The blocks make queries, keys and values
with a *convolutional projection*: a depthwise 3x3 conv + BatchNorm on the 2-D token map,
then a linear layer. Keys and values use stride 2, so N queries attend to N/4 keys. There
is no position embedding; the cls token joins only in the last stage. Attribute names
follow the official microsoft/CvT code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal, cast

import torch
from einops import rearrange
from torch import Tensor, nn

from vitlab.contract import AttentionKind, FamilyInfo, FamilyProperties
from vitlab.layers import (
    DropPath,
    Mlp,
    check_heads,
    check_image,
    check_num_classes,
    classifier_head,
    conv_output_size,
    drop_path_rates,
    explicit_attention,
    fused_attention,
    with_attn,
)
from vitlab.models._init import init_vit_weights

conv_out_size = conv_output_size  # the shared formula, under the name chapter 11 uses


@dataclass(frozen=True, kw_only=True)
class CvTConfig:
    """Hyperparameters of a CvT (one entry per stage in the plural fields). Defaults are CvT-13
    at 224 px; with no position embedding it runs at any size from ``min_img_size`` up.
    """

    img_size: int = 224
    in_chans: int = 3
    num_classes: int = 1000
    # Per stage; the names of HF's CvtConfig (which says patch_sizes). The paper's Table 2
    # writes them C_i (embed_dim), H_i (num_heads), N_i (depth) and the conv embedding's k, s.
    embed_dim: tuple[int, ...] = (64, 192, 384)
    depth: tuple[int, ...] = (1, 2, 10)
    num_heads: tuple[int, ...] = (1, 3, 6)
    patch_size: tuple[int, ...] = (7, 3, 3)
    patch_stride: tuple[int, ...] = (4, 2, 2)
    patch_padding: tuple[int, ...] = (2, 1, 1)
    kernel_qkv: int = 3
    stride_kv: int = 2
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    class_token: bool = True
    qk_scale: Literal["embed_dim", "head_dim"] = "embed_dim"
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    fused_attn: bool = True

    def __post_init__(self) -> None:
        per_stage = ("embed_dim", "depth", "num_heads", "patch_size", "patch_stride", "patch_padding")
        lengths = {name: len(getattr(self, name)) for name in per_stage}
        if len(set(lengths.values())) != 1 or lengths["depth"] == 0:
            raise ValueError(f"per-stage fields need one entry per stage each, got lengths {lengths}")
        for dim, heads in zip(self.embed_dim, self.num_heads):
            check_heads(dim, heads)
        for name in ("depth", "patch_size", "patch_stride"):
            if min(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if min(self.patch_padding) < 0:
            raise ValueError(f"patch_padding must be >= 0, got {self.patch_padding}")
        if self.kernel_qkv <= 0 or self.kernel_qkv % 2 == 0:
            raise ValueError(f"kernel_qkv must be odd (the q map keeps its size), got {self.kernel_qkv}")
        if self.stride_kv <= 0 or self.in_chans <= 0:
            raise ValueError(f"stride_kv and in_chans must be positive, got {self.stride_kv} and {self.in_chans}")
        if self.qk_scale not in ("embed_dim", "head_dim"):
            raise ValueError(f"qk_scale must be 'embed_dim' or 'head_dim', got {self.qk_scale!r}")
        check_num_classes(self.num_classes)
        if not self.fits(self.img_size):
            raise ValueError(
                f"img_size {self.img_size} is too small for these stages "
                f"(token maps {self.stage_sizes(self.img_size)}); "
                f"the smallest size is {self.min_img_size}"
            )

    @property
    def num_stages(self) -> int:
        return len(self.depth)

    def stage_sizes(self, size: int) -> list[int]:
        """Side of the token map after each stage's conv embedding, for an input side ``size``."""
        sizes = []
        for k, s, p in zip(self.patch_size, self.patch_stride, self.patch_padding):
            size = conv_out_size(size, k, s, p)
            sizes.append(size)
        return sizes

    def fits(self, size: int) -> bool:
        """Every stage map is at least 1x1, and every strided stage really shrinks its input."""
        outputs = self.stage_sizes(size)
        inputs = [size] + outputs[:-1]
        return all(o >= 1 and (o < i or s == 1) for i, o, s in zip(inputs, outputs, self.patch_stride))

    @property
    def min_img_size(self) -> int:
        """The smallest image side that :meth:`fits` (11 px for CvT-13/21/W24)."""
        n = 1
        while not self.fits(n):  # terminates: a large enough map always shrinks
            n += 1
        return n


class ConvEmbed(nn.Module):
    """Convolutional token embedding: an overlapping conv (kernel > stride), then LayerNorm.

    Shape: x (B, C_in, H, W) -> tokens (B, H'*W', D), grid (H', W').
    """

    def __init__(self, in_chans: int, embed_dim: int, *, patch_size: int, stride: int, padding: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=stride, padding=padding)
        self.norm = nn.LayerNorm(embed_dim)  # eps 1e-5, as official and HF

    def forward(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        x = self.proj(x)  # (B, D, H', W')
        H, W = x.shape[-2:]
        return self.norm(rearrange(x, "B D H W -> B (H W) D")), (H, W)


class ConvProjection(nn.Module):
    """Depthwise conv (``groups=C``) + BatchNorm on the token map; the linear q/k/v layer that
    follows mixes the channels (pitfall 17: ``groups=heads`` would mix within a head's group only).

    Shape: x (B, C, H, W) -> (B, H'*W', C), H' = ceil(H / stride).
    """

    def __init__(self, dim: int, *, kernel_size: int = 3, stride: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(dim, dim, kernel_size, stride=stride, padding=kernel_size // 2, groups=dim, bias=False)
        self.bn = nn.BatchNorm2d(dim)

    def forward(self, x: Tensor) -> Tensor:
        return rearrange(self.bn(self.conv(x)), "B C H W -> B (H W) C")


class ConvAttention(nn.Module):
    """Multi-head attention with convolutional projections; k and v squeezed by ``stride_kv``.
    The cls token (last stage) skips the convolution and rejoins before the linear projections.

    Shape: x (B, T + H*W, C) -> (B, T + H*W, C), T = 1 with a cls token else 0;
    attn (B, h, T + H*W, T + H'*W').
    """

    attn_kind: ClassVar[AttentionKind] = "self"  # its map's label (vitlab.attention_maps)

    def __init__(
        self,
        dim: int,
        *,
        num_heads: int,
        kernel_size: int = 3,
        stride_kv: int = 2,
        qkv_bias: bool = True,
        with_cls_token: bool = False,
        qk_scale: Literal["embed_dim", "head_dim"] = "embed_dim",
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        fused_attn: bool = True,
    ) -> None:
        super().__init__()
        if qk_scale not in ("embed_dim", "head_dim"):
            raise ValueError(f"qk_scale must be 'embed_dim' or 'head_dim', got {qk_scale!r}")
        self.num_heads = num_heads
        self.head_dim = check_heads(dim, num_heads)
        # NOTE(paper): official CvT and HF scale the logits by embed_dim**-0.5, not the textbook
        # head_dim**-0.5 (pitfall 19): logits sqrt(heads) smaller. The released weights depend on it.
        self.scale = (dim if qk_scale == "embed_dim" else self.head_dim) ** -0.5
        self.with_cls_token = with_cls_token
        self.fused_attn = fused_attn
        self.conv_proj_q = ConvProjection(dim, kernel_size=kernel_size, stride=1)  # q keeps every token
        self.conv_proj_k = ConvProjection(dim, kernel_size=kernel_size, stride=stride_kv)
        self.conv_proj_v = ConvProjection(dim, kernel_size=kernel_size, stride=stride_kv)
        self.proj_q = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj_k = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj_v = nn.Linear(dim, dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(
        self, x: Tensor, grid_size: tuple[int, int], return_attn: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Shape: x (B, T + H*W, C), grid_size (H, W) -> (B, T + H*W, C) [, attn]."""
        H, W = grid_size
        cls_token = None
        if self.with_cls_token:
            cls_token, x = x[:, :1], x[:, 1:]  # (B, 1, C), (B, H*W, C)
        x = rearrange(x, "B (H W) C -> B C H W", H=H, W=W)
        q = self.conv_proj_q(x)  # (B, H*W, C)
        k = self.conv_proj_k(x)  # (B, H'*W', C)
        v = self.conv_proj_v(x)  # (B, H'*W', C)
        if cls_token is not None:
            q, k, v = (torch.cat([cls_token, t], dim=1) for t in (q, k, v))
        q, k, v = (
            rearrange(linear(t), "B N (h d) -> B h N d", h=self.num_heads)
            for linear, t in ((self.proj_q, q), (self.proj_k, k), (self.proj_v, v))
        )
        attn = None
        if self.fused_attn and not return_attn:
            p = self.attn_drop.p if self.training else 0.0
            out = fused_attention(q, k, v, scale=self.scale, dropout_p=p)
        else:
            out, attn = explicit_attention(q, k, v, scale=self.scale, attn_drop=self.attn_drop)
        out = self.proj_drop(self.proj(rearrange(out, "B h N d -> B N (h d)")))
        return with_attn(out, attn, return_attn)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, scale={self.scale:.4f}, fused_attn={self.fused_attn}"


class CvTBlock(nn.Module):
    """Pre-norm block: x + Attn(LN(x)), then x + MLP(LN(x)), for stage ``stage`` of ``config``.

    Shape: x (B, N, C), grid_size (H, W) -> (B, N, C).
    """

    def __init__(self, config: CvTConfig, *, stage: int, drop_path: float = 0.0) -> None:
        super().__init__()
        dim = config.embed_dim[stage]
        self.norm1 = nn.LayerNorm(dim)
        self.attn = ConvAttention(
            dim,
            num_heads=config.num_heads[stage],
            kernel_size=config.kernel_qkv,
            stride_kv=config.stride_kv,
            qkv_bias=config.qkv_bias,
            with_cls_token=config.class_token and stage == config.num_stages - 1,
            qk_scale=config.qk_scale,
            attn_drop=config.attn_drop_rate,
            proj_drop=config.drop_rate,
            fused_attn=config.fused_attn,
        )
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        # NOTE(paper): the official code uses QuickGELU, x * sigmoid(1.702 x); HF uses exact GELU.
        # We match HF (its weights and logits); the two differ by < 0.02 per activation.
        self.mlp = Mlp(dim, int(dim * config.mlp_ratio), drop=config.drop_rate)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor, grid_size: tuple[int, int]) -> Tensor:
        """Shape: x (B, N, C), grid_size (H, W) -> (B, N, C)."""
        x = x + self.drop_path1(self.attn(self.norm1(x), grid_size))
        return x + self.drop_path2(self.mlp(self.norm2(x)))


class CvTStage(nn.Module):
    """Conv token embedding, [cls token], blocks; the tokens leave as a 2-D map again.

    Shape: x (B, C_in, H, W) -> map (B, D, H', W'), cls (B, 1, D) or None.
    """

    def __init__(self, config: CvTConfig, stage: int) -> None:
        super().__init__()
        dim = config.embed_dim[stage]
        self.patch_embed = ConvEmbed(
            config.in_chans if stage == 0 else config.embed_dim[stage - 1],
            dim,
            patch_size=config.patch_size[stage],
            stride=config.patch_stride[stage],
            padding=config.patch_padding[stage],
        )
        last = stage == config.num_stages - 1
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if config.class_token and last else None
        self.pos_drop = nn.Dropout(config.drop_rate)
        # Stochastic depth 0 -> rate over the last stage only, as every official config does.
        # NOTE(paper): HF gives every layer one constant rate; it matters only for training.
        top = config.drop_path_rate if last else 0.0
        rates = drop_path_rates(top, config.depth[stage])
        self.blocks = nn.ModuleList([CvTBlock(config, stage=stage, drop_path=r) for r in rates])

    def forward_tokens(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """The stage's tokens ``[cls,] map`` after its blocks. Shape: -> (B, T + H'*W', D), grid (H', W')."""
        x, (H, W) = self.patch_embed(x)  # (B, H*W, D); no position embedding is added
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1 + H*W, D)
        x = self.pos_drop(x)
        for block in self.blocks:
            x = block(x, (H, W))
        return x, (H, W)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        x, (H, W) = self.forward_tokens(x)
        cls_token = None
        if self.cls_token is not None:
            cls_token, x = x[:, :1], x[:, 1:]
        return rearrange(x, "B (H W) D -> B D H W", H=H, W=W), cls_token


class CvT(nn.Module):
    """Convolutional vision Transformer: stages of conv embedding + conv-projection blocks,
    then LayerNorm and a linear head on the cls token (or on the mean token without one).

    Attention maps: one per block; rows the stage's ``[cls,] map``, columns ``[cls,]`` the map
    squeezed by ``stride_kv``. CvT-13 at 224 px: (B, 1, 3136, 784), 2 x (B, 3, 784, 196),
    10 x (B, 6, 197, 50).

    Shape: images (B, C, H, W) -> logits (B, num_classes), any H, W >= ``config.min_img_size``.
    """

    def __init__(self, config: CvTConfig) -> None:
        super().__init__()
        self.config = config
        self.stages = nn.ModuleList([CvTStage(config, i) for i in range(config.num_stages)])
        D = config.embed_dim[-1]
        self.norm = nn.LayerNorm(D)
        self.head = classifier_head(D, config.num_classes)
        init_vit_weights(self)
        last = cast(CvTStage, self.stages[-1])
        if last.cls_token is not None:
            nn.init.trunc_normal_(last.cls_token, std=0.02)  # official CvT init

    def check_input(self, x: Tensor) -> None:
        """Raise if ``x`` is not (B, in_chans, H, W) or too small for every stage to shrink it."""
        check_image(x, in_chans=self.config.in_chans, patch_size=(1, 1))  # any size divides 1x1
        H, W = x.shape[-2:]
        if not (self.config.fits(H) and self.config.fits(W)):
            maps = " -> ".join(f"{h}x{w}" for h, w in zip(self.config.stage_sizes(H), self.config.stage_sizes(W)))
            n = self.config.min_img_size
            raise ValueError(
                f"image size {H}x{W} is too small for this CvT: the stage token maps would be {maps}, but "
                f"each stage must shrink the map (strides {self.config.patch_stride}); the smallest size is {n}x{n}"
            )

    def forward_features(self, x: Tensor) -> Tensor:
        """The last stage's tokens after the final norm. Shape: -> (B, T + H'*W', D), (B, 197, 384) for CvT-13."""
        self.check_input(x)
        for stage in self.stages[:-1]:
            x, _ = stage(x)
        tokens, _ = cast(CvTStage, self.stages[-1]).forward_tokens(x)
        return self.norm(tokens)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Classify the cls token (or the mean token). Shape: (B, T + N, D) -> (B, num_classes) or (B, D)."""
        x = x[:, 0] if self.config.class_token else x.mean(dim=1)
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        """Shape: x (B, C, H, W) -> (B, num_classes)."""
        return self.forward_head(self.forward_features(x))


CONFIGS: dict[str, CvTConfig] = {
    # CvT paper, Table 2 (architectures) and Table 4 (results); counts of HF CvtForImageClassification.
    "cvt_13": CvTConfig(embed_dim=(64, 192, 384), depth=(1, 2, 10), num_heads=(1, 3, 6)),  # 19,997,480 params
    "cvt_21": CvTConfig(embed_dim=(64, 192, 384), depth=(1, 4, 16), num_heads=(1, 3, 6)),  # 31,622,696 params
    # CvT-W24 exists only at 384 px (ImageNet-22k pre-trained): microsoft/cvt-w24-384-22k.
    "cvt_w24_384": CvTConfig(  # 277,196,392 params
        img_size=384, embed_dim=(192, 768, 1024), depth=(2, 2, 20), num_heads=(3, 12, 16)
    ),
}

MODEL = CvT

FAMILY = FamilyInfo(
    chapter=11,
    properties=FamilyProperties("CvT", "none", "overlapping conv (k7 s4, k3 s2)", "depthwise conv + BN, then linear",
                                "yes (conv token embedding)", "wu2021cvt", "cvt_13"),
    token_mixers=(ConvAttention,),
    tiny=("cvt_13", dict(embed_dim=(16, 24, 30), depth=(1, 1, 1), num_heads=(1, 2, 2))),
)  # fmt: skip

# HuggingFace CvtForImageClassification name -> ours, applied in order to every key.
_HF_RULES: tuple[tuple[str, str], ...] = (
    (r"^cvt\.encoder\.stages\.(\d+)\.", r"stages.\1."),
    (r"\.embedding\.convolution_embeddings\.projection\.", ".patch_embed.proj."),
    (r"\.embedding\.convolution_embeddings\.normalization\.", ".patch_embed.norm."),
    (r"\.layers\.(\d+)\.", r".blocks.\1."),
    # convolution_projection_{query,key,value}: keep the first letter, q/k/v
    (
        r"\.attention\.attention\.convolution_projection_(q|k|v)\w*\.convolution_projection\.convolution\.",
        r".attn.conv_proj_\1.conv.",
    ),
    (
        r"\.attention\.attention\.convolution_projection_(q|k|v)\w*\.convolution_projection\.normalization\.",
        r".attn.conv_proj_\1.bn.",
    ),
    (r"\.attention\.attention\.projection_(q|k|v)\w*\.", r".attn.proj_\1."),
    (r"\.attention\.output\.dense\.", ".attn.proj."),
    (r"\.layernorm_before\.", ".norm1."),
    (r"\.layernorm_after\.", ".norm2."),
    (r"\.intermediate\.dense\.", ".mlp.fc1."),
    (r"\.output\.dense\.", ".mlp.fc2."),  # after attention.output.dense
    (r"^layernorm\.", "norm."),
    (r"^classifier\.", "head."),
)


def convert_hf(state_dict: Mapping[str, Tensor], config: CvTConfig) -> dict[str, Tensor]:
    """HF ``CvtForImageClassification`` weights -> ``CvT`` (BatchNorm statistics included) by ``_HF_RULES``."""
    converted = {}
    for key, value in state_dict.items():
        new = key
        for pattern, replacement in _HF_RULES:
            new = re.sub(pattern, replacement, new)
        if new == key:
            raise KeyError(f"unexpected key {key!r} in a HuggingFace CvT state dict")
        converted[new] = value
    return converted
