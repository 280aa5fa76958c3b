"""vit-pytorch (lucidrains/vit-pytorch) counterparts of vitlab presets, for throughput.py.

vit-pytorch writes each paper as a short, readable re-implementation, not as a port of the
official code, so its models are not weight-compatible with vitlab's (or timm's): the
comparison is of two models with the same widths, depths, heads and token grids, and the
parameter and MAC counts printed beside the speeds say how far apart the two models are.
The differences that matter, per family (NOTE(paper): vit-pytorch's, not the paper's):

* ViT / DeiT: vit-pytorch's patch embedding is LayerNorm -> Linear -> LayerNorm on the
  flattened patch (a 16x16 conv in the paper); its attention is explicit.
* DeepViT: a linear patch embedding instead of the paper's conv stem, and re-attention in
  every block (DeepViT-S has it in the last 5 of 16).
* CaiT: no talking heads.
* T2T-ViT: each soft split is followed by a transformer as wide as the unfolded patch
  (147 and 1323 channels), where the paper first projects to 64: far more parameters.
* CrossViT: one image size for both branches (240 px: a 15x15 large-patch grid instead of
  the paper's 14x14 at 224 px).
* PiT: one MLP width for all stages (the paper's is 4x each stage's width; the middle
  stage's is used).
* LeViT: q, k and v as three 1x1 convolutions, no activations in the stem, and GELU
  instead of Hardswish.
* CvT: the CvT-13 defaults of vit-pytorch's ``CvT``; no class token in the last stage.
"""

from __future__ import annotations

from typing import Any

from torch import nn

# vitlab preset -> (vit_pytorch module, class name, keyword arguments), 1000 classes.
VIT_PYTORCH_MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "vit_base_patch16_224": ("vit_pytorch.vit", "ViT", dict(
        image_size=224, patch_size=16, dim=768, depth=12, heads=12, dim_head=64, mlp_dim=3072)),
    "deit_small_patch16_224": ("vit_pytorch.vit", "ViT", dict(
        image_size=224, patch_size=16, dim=384, depth=12, heads=6, dim_head=64, mlp_dim=1536)),
    "deepvit_s": ("vit_pytorch.deepvit", "DeepViT", dict(
        image_size=224, patch_size=16, dim=396, depth=16, heads=12, dim_head=33, mlp_dim=1188)),
    "cait_xxs24_224": ("vit_pytorch.cait", "CaiT", dict(
        image_size=224, patch_size=16, dim=192, depth=24, cls_depth=2, heads=4, dim_head=48, mlp_dim=768)),
    "t2t_vit_14": ("vit_pytorch.t2t", "T2TViT", dict(
        image_size=224, dim=384, depth=14, heads=6, dim_head=64, mlp_dim=1152,
        t2t_layers=((7, 4), (3, 2), (3, 2)))),
    "crossvit_small_240": ("vit_pytorch.cross_vit", "CrossViT", dict(
        image_size=240, sm_dim=192, lg_dim=384, sm_patch_size=12, sm_enc_depth=1, sm_enc_heads=6,
        sm_enc_dim_head=32, sm_enc_mlp_dim=768, lg_patch_size=16, lg_enc_depth=4, lg_enc_heads=6,
        lg_enc_dim_head=64, lg_enc_mlp_dim=1536, cross_attn_depth=1, cross_attn_heads=6,
        cross_attn_dim_head=64, depth=3)),
    "pit_s_224": ("vit_pytorch.pit", "PiT", dict(
        image_size=224, patch_size=16, dim=144, depth=(2, 6, 4), heads=(3, 6, 12), dim_head=48, mlp_dim=1152)),
    "levit_128s": ("vit_pytorch.levit", "LeViT", dict(
        image_size=224, dim=(128, 256, 384), depth=(2, 3, 4), heads=(4, 6, 8), mlp_mult=2, stages=3,
        dim_key=16, dim_value=32)),
    "cvt_13": ("vit_pytorch.cvt", "CvT", dict()),
}  # fmt: skip


def build_vit_pytorch(name: str, num_classes: int = 1000) -> nn.Module:
    """The vit-pytorch model with ``name``'s widths, depths and heads, eval mode."""
    import importlib

    if name not in VIT_PYTORCH_MODELS:
        raise ValueError(
            f"vit-pytorch has no counterpart configured for {name!r}; expected one of {list(VIT_PYTORCH_MODELS)}"
        )
    module, cls, kwargs = VIT_PYTORCH_MODELS[name]
    return getattr(importlib.import_module(module), cls)(num_classes=num_classes, **kwargs).eval()
