"""Output shapes of named submodules, from one forward pass on the meta device."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

import vitlab


def trace_shapes(model: nn.Module, input_size: Sequence[int], names: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """The output shape (batch included) of each submodule in ``names`` on a zero input of
    ``input_size``: its first call, the first element of a tuple."""
    modules = dict(model.named_modules())
    missing = [n for n in names if n not in modules]
    if missing:
        raise KeyError(f"not submodules of {type(model).__name__}: {missing}")
    shapes: dict[str, tuple[int, ...]] = {}
    handles = []

    def hook_for(name: str):
        def hook(_module: nn.Module, _inputs: object, output: object) -> None:
            if name in shapes:
                return
            out = output[0] if isinstance(output, (tuple, list)) else output
            if not isinstance(out, torch.Tensor):
                raise TypeError(f"{name} returned {type(out).__name__}, not a tensor")
            shapes[name] = tuple(out.shape)

        return hook

    for name in names:
        handles.append(modules[name].register_forward_hook(hook_for(name)))
    was_training = model.training
    try:
        model.eval()
        param = next(model.parameters(), None)
        device = param.device if param is not None else torch.device("cpu")
        with torch.no_grad():
            model(torch.zeros(tuple(input_size), device=device))
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    never = [n for n in names if n not in shapes]
    if never:
        raise RuntimeError(f"these modules were not called in the forward pass: {never}")
    return shapes


def trace_preset(
    name: str, names: Sequence[str], *, meta: bool = True
) -> tuple[nn.Module, tuple[int, int, int, int], dict[str, tuple[int, ...]]]:
    """Preset ``name``'s model (on the meta device unless ``meta=False``), its input size
    ``(1, C, H, W)`` and the output shapes of ``names`` traced on it."""
    from vitlab.family import build_on_meta, input_size_of  # imported here: family imports the models

    model = build_on_meta(name) if meta else vitlab.create_model(name)
    input_size = input_size_of(name)
    return model, input_size, trace_shapes(model, input_size, names)
