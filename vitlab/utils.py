"""Small helpers for the notebooks and tests."""

from __future__ import annotations

import random

import torch
from torch import nn


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters (buffers such as BatchNorm statistics are not counted)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def seed_everything(seed: int = 0) -> None:
    """Seed Python, and PyTorch on every device."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # numpy is optional for vitlab itself
        pass


def pick_device() -> torch.device:
    """``cuda`` when present, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
