"""Small helpers for the notebooks and tests."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn


@contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """Every module of ``model`` in eval mode inside the block; afterwards each gets back its
    own ``training`` flag (a model may mix modes, e.g. a frozen BatchNorm in a training model)."""
    modes = {m: m.training for m in model.modules()}
    try:
        for m in modes:
            m.training = False
        yield model
    finally:
        for m, mode in modes.items():
            m.training = mode


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters (buffers such as BatchNorm statistics are not counted)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def seed_everything(seed: int = 0) -> None:
    """Seed Python, NumPy, and PyTorch on every device."""
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(seed)


def pick_device() -> torch.device:
    """``cpu`` without CUDA; under torchrun (which sets ``LOCAL_RANK``) this process's own GPU,
    ``cuda:LOCAL_RANK``, made the current device; else ``cuda``."""
    if not torch.cuda.is_available() or "LOCAL_RANK" not in os.environ:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rank, count = int(os.environ["LOCAL_RANK"]), torch.cuda.device_count()
    if rank >= count:
        raise RuntimeError(f"LOCAL_RANK is {rank} but this machine has {count} GPU(s): run at most {count} processes")
    torch.cuda.set_device(rank)  # NCCL and torch.cuda calls without an index use it
    return torch.device("cuda", rank)
