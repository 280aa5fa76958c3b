"""The classifier head every family ends with, and the check its config makes."""

from __future__ import annotations

from torch import nn


def check_num_classes(num_classes: int) -> None:
    """Raise a ``ValueError`` unless ``num_classes >= 0`` (0 means no head: features out)."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 0:
        raise ValueError(f"num_classes must be an int >= 0 (0 = no head), got {num_classes!r}")


def classifier_head(dim: int, num_classes: int) -> nn.Module:
    """``nn.Linear(dim, num_classes)``, or ``nn.Identity()`` when ``num_classes == 0``.

    Shape: x (B, dim) -> (B, num_classes), or (B, dim) without a head.
    """
    check_num_classes(num_classes)
    return nn.Linear(dim, num_classes) if num_classes > 0 else nn.Identity()
