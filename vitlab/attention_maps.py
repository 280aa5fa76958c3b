"""Attention maps collected during one forward pass, labelled with their layer and kind.

Every attention layer of a ``vitlab`` model says what kind of map it makes in a class
attribute ``attn_kind`` (:data:`vitlab.contract.AttentionKind`) and accepts
``return_attn=True``, which makes it take the explicit path and return ``(out, attn)``.
:func:`attention_maps` runs ``model(x)`` once and asks each such layer for its map
on the way, with two forward hooks per layer (PyTorch's own mechanism for looking inside
a module's call): one adds ``return_attn=True`` to the call, the other keeps the map and
passes ``out`` on, so the rest of the model runs exactly as in ``forward``. Nothing runs
twice, and the model code needs no second, map-collecting version of its forward.
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

    The pass runs in eval mode (no dropout; BatchNorm reads its running statistics and
    does not update them) and without gradients. Afterwards every module's ``training``
    flag is what it was before, set directly (``nn.Module.train`` is not called), and no
    parameter or buffer has changed. For the kinds that mix the heads (``"mixed"``,
    ``"re-attention"``) the layer names, in ``unmixed_input``, the submodule whose input
    is the heads' softmax maps; that input is kept too (:attr:`AttentionMap.unmixed`).

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
