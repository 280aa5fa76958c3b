"""Weight initialisation shared by the models (timm's ViT scheme)."""

from __future__ import annotations

from torch import nn


def init_vit_weights(model: nn.Module, std: float = 0.02) -> None:
    """Truncated-normal linear weights, zero biases, unit LayerNorms; a near-zero cls token.

    Parameters named ``pos_embed`` are left as their layer initialised them.
    """
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.trunc_normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
    for name, param in model.named_parameters():
        if name.endswith("cls_token") or name.endswith("dist_token"):
            nn.init.normal_(param, std=1e-6)
