"""Attention maps collected during one forward pass, labelled with their layer and kind.

Every attention layer declares ``attn_kind`` and accepts ``return_attn=True`` (explicit
path, returns ``(out, attn)``). :func:`attention_maps` runs ``model(x)`` once with two
forward hooks per such layer: one adds ``return_attn=True`` to the call, the other keeps the
map and passes ``out`` on, so the model runs exactly as in ``forward``.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor, nn

from vitlab.contract import MIXED_KINDS, AttentionKind, AttentionMap
from vitlab.utils import evaluating


def attention_layers(model: nn.Module) -> dict[nn.Module, str]:
    """Every layer of ``model`` that declares an ``attn_kind``, with its name, in module order."""
    return {m: name for name, m in model.named_modules() if isinstance(getattr(m, "attn_kind", None), str)}


@torch.no_grad()
def attention_maps(model: nn.Module, x: Any) -> list[AttentionMap]:
    """Run ``model(x)`` once, keeping every attention layer's map, in forward order.

    The pass runs in eval mode without gradients; every module's ``training`` flag is restored
    (set directly) and no parameter or buffer changes. For the mixing kinds, the input of the
    layer's ``unmixed_input`` submodule is kept too (:attr:`AttentionMap.unmixed`).

    Shape: x as ``model`` takes it -> one (B, h, N_q, N_k) map per attention layer call.
    """
    layers = attention_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no attention layer (no module with an attn_kind)")
    records: list[AttentionMap] = []
    unmixed: dict[nn.Module, Tensor] = {}

    def ask_for_the_map(layer: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        return args, {**kwargs, "return_attn": True}

    def keep_the_map(layer: nn.Module, args: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> Tensor:
        out, attn = output
        kind = cast(AttentionKind, layer.attn_kind)
        mixed = kind in MIXED_KINDS
        records.append(AttentionMap(attn, layers[layer], kind, not mixed, unmixed.pop(layer) if mixed else None))
        return out

    def keep_the_softmax(layer: nn.Module) -> Any:
        def hook(mixing: nn.Module, args: tuple[Tensor, ...]) -> None:
            unmixed[layer] = args[0]

        return hook

    handles = []
    for layer in layers:
        handles.append(layer.register_forward_pre_hook(ask_for_the_map, with_kwargs=True))
        handles.append(layer.register_forward_hook(keep_the_map))
        if layer.attn_kind in MIXED_KINDS:
            mixing = layer.get_submodule(getattr(layer, "unmixed_input"))
            handles.append(mixing.register_forward_pre_hook(keep_the_softmax(layer)))
    try:
        with evaluating(model):
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return records
