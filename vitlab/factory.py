"""``create_model``: a preset by name, randomly initialised or with its released weights."""

from __future__ import annotations

from typing import Any

from torch import nn

from vitlab.pretrained import load_released
from vitlab.registry import get_config, model_class


def create_model(name: str, pretrained: bool = False, **overrides: Any) -> nn.Module:
    """Build a registered model, e.g. ``create_model("vit_small_patch16_224", num_classes=10)``.

    Randomly initialised, or with ``pretrained=True`` the released weights through the
    reference's hub (:mod:`vitlab.pretrained`); in training mode either way.

    Raises:
        KeyError: unknown ``name`` (the message lists close names).
        TypeError: ``pretrained`` is not a bool, or an override is not a config field.
    """
    if not isinstance(pretrained, bool):
        raise TypeError(f"pretrained must be a bool, got {type(pretrained).__name__}")
    if pretrained:
        return load_released(name, **overrides)
    return model_class(name)(get_config(name, **overrides))
