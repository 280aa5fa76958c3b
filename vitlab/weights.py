"""Saving and loading local weights without running code from the file.

A ``.pt`` file is a pickle, and unpickling can call any function; ``torch.load(...,
weights_only=True)`` only rebuilds tensors and containers, and ``.safetensors`` hold no
code. Every loader here uses one of the two. This module imports no other ``vitlab`` module.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

# Training checkpoints often wrap the state dict: DeiT's releases are {"model": ...}.
_WRAPPER_KEYS = ("state_dict", "model")


def _import_safetensors():
    try:
        import safetensors.torch
    except ImportError as error:
        raise ImportError(
            "reading or writing .safetensors files needs the safetensors package: pip install safetensors"
        ) from error
    return safetensors.torch


def _checked(obj: Any, path: Path) -> dict[str, Tensor]:
    """``obj`` as a state dict (unwrapped from ``{"model": ...}``), or a TypeError."""
    if not isinstance(obj, dict):
        raise TypeError(f"{path} holds a {type(obj).__name__}, expected a state dict (a dict of str -> Tensor)")
    for key in _WRAPPER_KEYS:
        if isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    for key, value in obj.items():
        if not isinstance(key, str):
            raise TypeError(f"{path} is not a state dict: key {key!r} is a {type(key).__name__}, expected a str")
        if not isinstance(value, Tensor):
            raise TypeError(f"{path} is not a state dict: {key!r} is a {type(value).__name__}, expected a Tensor")
    return dict(obj)


def load_state_dict(path: str | os.PathLike) -> dict[str, Tensor]:
    """Read a state dict from ``path`` onto the CPU, never running code stored in the file.

    Raises:
        pickle.UnpicklingError: the pickle refers to anything but tensors and containers.
        TypeError: the file holds something other than a dict of tensors.
        ImportError: a ``.safetensors`` file and no ``safetensors`` package.
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        return _checked(_import_safetensors().load_file(path, device="cpu"), path)
    return _checked(torch.load(path, map_location="cpu", weights_only=True), path)


def save_state_dict(state_dict: Mapping[str, Tensor] | nn.Module, path: str | os.PathLike) -> None:
    """Write ``state_dict`` (or a module's) to ``path``: safetensors for a ``.safetensors``
    suffix, ``torch.save`` otherwise. Both read back with :func:`load_state_dict`."""
    if isinstance(state_dict, nn.Module):
        state_dict = state_dict.state_dict()
    path = Path(path)
    if path.suffix != ".safetensors":
        torch.save(dict(state_dict), path)
        return
    # safetensors stores each tensor on its own: copy views that share memory with another.
    tensors, seen = {}, set()
    for key, value in state_dict.items():
        value = value.detach().contiguous()
        pointer = value.untyped_storage().data_ptr()
        tensors[key] = value.clone() if pointer in seen else value
        seen.add(pointer)
    _import_safetensors().save_file(tensors, path)


def load_checkpoint(model: nn.Module, path: str | os.PathLike) -> nn.Module:
    """Load the state dict at ``path`` into ``model`` (strict) and return ``model``."""
    model.load_state_dict(load_state_dict(path), strict=True)
    return model
