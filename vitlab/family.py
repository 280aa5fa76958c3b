"""The nine families side by side: properties, MACs, tokens per stage, tiny versions.

Everything here is derived from the models, on the ``meta`` device (shapes only): MACs
from a counted forward pass (``torch.utils.flop_counter``), token counts from forward hooks
on the attention layers. Each paper file declares its ``FAMILY``; the tables here gather
them from the registry in chapter order (:data:`FAMILY_PROPERTIES` extends the CvT paper's
comparison table to all nine). :data:`TINY_CONFIGS` are teaching-size versions (about 35k
parameters) for 32x32 digits.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from vitlab.contract import FamilyInfo, FamilyProperties
from vitlab.factory import create_model
from vitlab.registry import get_config, list_models, module_of, set_fused_attention
from vitlab.utils import count_parameters, evaluating


def _family_infos() -> dict[str, FamilyInfo]:
    """Family (model file) -> its ``FAMILY``, for every file in the registry, in chapter order."""
    infos = {}
    for name in list_models():
        module = module_of(name)
        infos[module.__name__.rsplit(".", 1)[-1]] = module.FAMILY
    return dict(sorted(infos.items(), key=lambda item: item[1].chapter))


FAMILIES: dict[str, FamilyInfo] = _family_infos()

FAMILY_PROPERTIES: dict[str, FamilyProperties] = {family: info.properties for family, info in FAMILIES.items()}

# The token mixers whose input length is "the tokens of a stage" (see attention_token_counts).
TOKEN_MIXERS: tuple[type[nn.Module], ...] = tuple(
    dict.fromkeys(mixer for info in FAMILIES.values() for mixer in info.token_mixers)
)


def family_of(model_name: str) -> str:
    """The family (model file) of a registered model: ``"pit"`` for ``"pit_s_224"``."""
    return module_of(model_name).__name__.rsplit(".", 1)[-1]


def input_size_of(model_name: str, batch: int = 1) -> tuple[int, int, int, int]:
    """The input a preset was built for: ``(batch, in_chans, img_size, img_size)``."""
    config = get_config(model_name)
    return (batch, config.in_chans, config.img_size, config.img_size)


def build_on_meta(model_name: str, **overrides: Any) -> nn.Module:
    """``create_model`` on the ``meta`` device: parameters with shapes and no data (eval mode)."""
    with torch.device("meta"):
        return create_model(model_name, **overrides).eval()


def _profile(model: nn.Module, input_size: tuple[int, ...]) -> tuple[Counter[str], list[int]]:
    """One forward pass of a zero batch: FLOPs per aten operator, and the input length of
    every token mixer in call order.

    It takes the explicit attention path (``FlopCounterMode`` counts the fused CPU kernel as
    0) in eval mode without gradients (the counter trips over views of parameters that
    require grad); all three are restored.
    """
    if len(input_size) != 4:
        raise ValueError(f"input_size must be (B, C, H, W), got {tuple(input_size)}")
    fused = {m: m.fused_attn for m in model.modules() if isinstance(getattr(m, "fused_attn", None), bool)}
    grads = {p: p.requires_grad for p in model.parameters()}
    tokens: list[int] = []
    hooks = [
        m.register_forward_pre_hook(lambda _, args: tokens.append(args[0].shape[1]))
        for m in model.modules()
        if isinstance(m, TOKEN_MIXERS)
    ]
    device = next(model.parameters()).device
    counter = FlopCounterMode(display=False)
    try:
        set_fused_attention(model, False)
        model.requires_grad_(False)
        x = torch.zeros(input_size, device=device)
        with evaluating(model), counter, torch.no_grad():
            model(x)
    finally:
        for handle in hooks:
            handle.remove()
        for module, flag in fused.items():
            module.fused_attn = flag
        for param, flag in grads.items():
            param.requires_grad_(flag)
    flops = Counter({str(op).split(".")[-1]: n for op, n in counter.get_flop_counts()["Global"].items()})
    return flops, tokens


def macs_by_operator(model: nn.Module, input_size: tuple[int, int, int, int]) -> dict[str, int]:
    """MACs of one forward pass per counted aten operator (``addmm``, ``mm``, ``bmm``,
    ``convolution``), sorted by name. See :func:`count_macs` for what is counted."""
    flops, _ = _profile(model, input_size)
    return {op: n // 2 for op, n in sorted(flops.items())}


def count_macs(model: nn.Module, input_size: tuple[int, int, int, int]) -> int:
    """Multiply-accumulates of one forward pass on a batch of shape ``input_size`` (B, C, H, W).

    Matrix products and convolutions are counted (what the papers call "FLOPs"); softmax,
    norms, activations, additions, pooling and biases are not.
    """
    flops, _ = _profile(model, input_size)
    return sum(flops.values()) // 2


def attention_token_counts(model: nn.Module, input_size: tuple[int, int, int, int]) -> list[int]:
    """How many tokens (keys) each token mixer reads, in call order (a forward hook on each)."""
    return _profile(model, input_size)[1]


def _stages(counts: list[int]) -> tuple[int, ...]:
    """Distinct token counts in order of first appearance: the stages (or branches)."""
    return tuple(dict.fromkeys(counts))


def tokens_per_stage(model_name: str) -> tuple[int, ...]:
    """Tokens the attention layers of each stage (or CrossViT branch) read, in order of first use:
    ``(197,)`` for ViT-B/16, ``(730, 197, 50)`` for PiT-S, ``(3136, 784, 197)`` for T2T-ViT.
    """
    return _stages(attention_token_counts(build_on_meta(model_name), input_size_of(model_name)))


def format_tokens(family: str, tokens: tuple[int, ...]) -> str:
    """``"730 → 197 → 50"`` for stages one after another, ``"401 ∥ 197"`` for branches."""
    separator = " ∥ " if FAMILY_PROPERTIES[family].branches > 1 else " → "
    return separator.join(str(n) for n in tokens)


def model_table(names: list[str] | None = None) -> list[dict[str, Any]]:
    """One row per model (all by default): ``model``, ``family``, ``img_size``, ``params``,
    ``macs`` (batch 1), ``tokens`` (:func:`tokens_per_stage`); by family, then MACs."""
    rows = []
    for name in list_models() if names is None else names:
        model, size = build_on_meta(name), input_size_of(name)
        flops, counts = _profile(model, size)
        rows.append({
            "model": name, "family": family_of(name), "img_size": size[-1], "params": count_parameters(model),
            "macs": sum(flops.values()) // 2, "tokens": _stages(counts),
        })  # fmt: skip
    order = list(FAMILY_PROPERTIES)
    return sorted(rows, key=lambda r: (order.index(r["family"]), r["macs"], r["model"]))


# ---------------------------------------------------------------- tiny versions for digits

TINY_IMAGE_SIZE = 32  # digits upsampled from 8x8 (vitlab.data.load_digits(image_size=32))
# family -> (preset, overrides), from each model file's ``FAMILY.tiny``: paper strides (a 2x2
# token grid at 32 px), widths and depths cut to about 35k parameters.
# NOTE(paper): CrossViT's small branch uses patch 8 and one multi-scale encoder instead of
# three. PiT's stem gives 3x3 -> 2x2 -> 1x1, LeViT's 2x2, 1x1, 1x1, CvT's 4x4 -> 2x2.
# DeepViT's stem has 6 channels, not 64 (64 would hold 4x the whole tiny model).
TINY_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {family: info.tiny for family, info in FAMILIES.items()}


def tiny_model(family: str, *, in_chans: int = 1, num_classes: int = 10) -> nn.Module:
    """A randomly initialised teaching-size model of ``family`` for ``TINY_IMAGE_SIZE`` px images.

    Shape: images (B, in_chans, 32, 32) -> logits (B, num_classes) [a pair for DeiT⚗ and LeViT in training].
    """
    if family not in TINY_CONFIGS:
        raise ValueError(f"unknown family {family!r}; expected one of {list(TINY_CONFIGS)}")
    preset, overrides = TINY_CONFIGS[family]
    return create_model(preset, img_size=TINY_IMAGE_SIZE, in_chans=in_chans, num_classes=num_classes, **overrides)
