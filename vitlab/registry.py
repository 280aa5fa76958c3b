"""Model registry: every ``CONFIGS`` preset in ``vitlab.models``, by name.

Names equal timm's where timm has the model (``vit_base_patch16_224``); otherwise the
official repository's (``deepvit_s``, ``cvt_13``).

A pure lookup (name -> paper file, config, model class, weight converter), plus
:func:`set_fused_attention`; it imports only ``vitlab.models``.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import pkgutil
from collections.abc import Mapping
from functools import cache
from types import ModuleType
from typing import Any

from torch import Tensor, nn

import vitlab.models

SOURCES = ("timm", "hf")


@cache
def _model_modules() -> dict[str, ModuleType]:
    """Model name -> the module (paper file) that defines it."""
    names: dict[str, ModuleType] = {}
    for info in pkgutil.iter_modules(vitlab.models.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"vitlab.models.{info.name}")
        for name in getattr(module, "CONFIGS", {}):
            if name in names:
                raise RuntimeError(f"model {name!r} is defined in {names[name].__name__} and {module.__name__}")
            names[name] = module
    return names


def _module_for(name: str) -> ModuleType:
    modules = _model_modules()
    if not isinstance(name, str):
        raise TypeError(f"model name must be a str, got {type(name).__name__}")
    if name not in modules:
        close = difflib.get_close_matches(name, list(modules), n=5, cutoff=0.5)
        hint = f"; close names: {', '.join(close)}" if close else ""
        raise KeyError(f"unknown model {name!r}{hint}. vitlab.list_models() lists all {len(modules)} models")
    return modules[name]


def list_models(pattern: str | None = None) -> list[str]:
    """Sorted names of all registered models, optionally those containing ``pattern``."""
    names = sorted(_model_modules())
    return [n for n in names if pattern is None or pattern in n]


def get_config(name: str, **overrides: Any) -> Any:
    """The preset config of ``name`` with ``overrides`` applied (validated again)."""
    config = _module_for(name).CONFIGS[name]
    fields = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise TypeError(f"{type(config).__name__} has no field(s) {unknown}; valid fields: {sorted(fields)}")
    return dataclasses.replace(config, **overrides)


def module_of(name: str) -> ModuleType:
    """The paper file whose ``CONFIGS`` lists ``name``; its last name part is the family
    (``"deit"`` for ``deit_small_patch16_224``, whose config and model class are ViT's)."""
    return _module_for(name)


def model_class(name: str) -> type[nn.Module]:
    """The model class (the paper file's ``MODEL``) that builds ``name`` from its config."""
    return _module_for(name).MODEL


def convert_state_dict(name: str, state_dict: Mapping[str, Tensor], source: str = "timm") -> dict[str, Tensor]:
    """Map a ``"timm"`` or ``"hf"`` state dict onto the ``vitlab`` model ``name`` (loads with ``strict=True``)."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    module = _module_for(name)
    converter = getattr(module, f"convert_{source}", None)
    if converter is None:
        available = [s for s in SOURCES if hasattr(module, f"convert_{s}")]
        raise ValueError(f"{name!r} has no {source!r} reference; available sources: {available or 'none'}")
    return converter(state_dict, module.CONFIGS[name])


def set_fused_attention(model: nn.Module, flag: bool) -> nn.Module:
    """Switch the fused attention kernel of ``model`` on (``True``) or off, to the formula written out.

    Sets every bool ``fused_attn`` (layers with only the explicit path have none). Returns ``model``.
    """
    if not isinstance(flag, bool):
        raise TypeError(f"flag must be a bool, got {type(flag).__name__}")
    for module in model.modules():
        if isinstance(getattr(module, "fused_attn", None), bool):  # the layers with both paths
            setattr(module, "fused_attn", flag)
    return model
