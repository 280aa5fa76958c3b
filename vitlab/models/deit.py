"""DeiT (Touvron et al., 2021): ViT trained data-efficiently, with a distillation token.

A DeiT *is* a ViT (:mod:`vitlab.models.vit`), so this file holds only DeiT's presets, its
``FAMILY`` and the timm conversion; it is the one model file that imports another (DeiT
changes ViT's training, not its layers). The distilled models (⚗) set ``distilled=True``:
a ``dist_token`` after the cls token feeds a second head, ``head_dist``, trained to match a
teacher (:mod:`vitlab.distill`). Names follow timm, so its weights load with no renames.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from vitlab.contract import FamilyInfo, FamilyProperties
from vitlab.layers import Attention
from vitlab.models.vit import ViT, ViTConfig

CONFIGS: dict[str, ViTConfig] = {
    # DeiT paper, Table 1: Ti 192/3 heads, S 384/6, B 768/12; depth 12, head dim 64. timm counts.
    "deit_tiny_patch16_224": ViTConfig(embed_dim=192, depth=12, num_heads=3),  # 5,717,416 params
    "deit_small_patch16_224": ViTConfig(embed_dim=384, depth=12, num_heads=6),  # 22,050,664 params
    "deit_base_patch16_224": ViTConfig(embed_dim=768, depth=12, num_heads=12),  # 86,567,656 params
    # ⚗ models (section 4): + dist token, + one position, + head_dist. timm counts.
    "deit_tiny_distilled_patch16_224": ViTConfig(embed_dim=192, depth=12, num_heads=3, distilled=True),  # 5,910,800
    "deit_small_distilled_patch16_224": ViTConfig(
        embed_dim=384, depth=12, num_heads=6, distilled=True
    ),  # 22,436,432 params
    "deit_base_distilled_patch16_224": ViTConfig(
        embed_dim=768, depth=12, num_heads=12, distilled=True
    ),  # 87,338,192 params
}

MODEL = ViT

FAMILY = FamilyInfo(
    chapter=4,
    properties=FamilyProperties("DeiT", "learned, 1 + N (2 + N ⚗)", "non-overlapping (k16 s16)", "linear",
                                "no", "touvron2021deit", "deit_small_patch16_224"),
    token_mixers=(Attention,),
    tiny=("deit_tiny_distilled_patch16_224", dict(patch_size=16, embed_dim=32, depth=2, num_heads=2)),
)  # fmt: skip


def convert_timm(state_dict: Mapping[str, Tensor], config: ViTConfig) -> dict[str, Tensor]:
    """timm ``VisionTransformer(Distilled)`` -> ``ViT``: the same names; checks the distillation token."""
    has_dist = "dist_token" in state_dict
    if has_dist != config.distilled:
        raise ValueError(
            f"config has distilled={config.distilled} but the state dict {'has' if has_dist else 'has no'} 'dist_token'"
        )
    return dict(state_dict)
