"""The interface every ``vitlab`` model keeps (:class:`VisionModel`, checked for every family
by ``tests/test_contract.py``), the label of an attention map, and what each family says
about itself (``FAMILY``).

Speed: the only fast path is :func:`torch.nn.functional.scaled_dot_product_attention`,
used by every attention layer whose bool ``fused_attn`` is ``True`` (the default);
:func:`vitlab.set_fused_attention` switches them all. Layers whose paper changes the softmax
(DeepViT's re-attention, CaiT's talking heads) have only the explicit path, and
:func:`vitlab.attention_maps` always takes it (``return_attn=True``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from torch import Tensor, nn

Logits = Tensor | tuple[Tensor, Tensor]
AttentionKind = Literal["self", "class", "cross", "re-attention", "mixed"]

# Kinds whose maps mix the heads' softmax maps linearly: a row need not sum to 1.
MIXED_KINDS: frozenset[str] = frozenset({"re-attention", "mixed"})


@dataclass(frozen=True)
class AttentionMap:
    """One attention layer's map, with what it is (:func:`vitlab.attention_maps`).

    ``attn`` ``(B, h, N_q, N_k)`` is the map the layer multiplies its values with; ``path``
    its name in ``model.named_modules()``; ``kind`` ``"self"``, ``"class"`` (CaiT),
    ``"cross"`` (CrossViT), ``"re-attention"`` (DeepViT) or ``"mixed"`` (CaiT's talking
    heads). For the last two (:data:`MIXED_KINDS`) ``is_distribution`` is ``False`` and
    ``unmixed`` holds the softmax maps before the mixing; otherwise ``unmixed`` is ``None``.
    """

    attn: Tensor
    path: str
    kind: AttentionKind
    is_distribution: bool
    unmixed: Tensor | None = None


@runtime_checkable
class VisionModel(Protocol):
    """What every registered model offers (timm's names and meanings).

    * ``forward_features(x)``: the tokens after the final norm, not pooled, ``(B, N, D)``
      (a list, one per branch, for CrossViT; the last stage's for PiT, LeViT, CvT);
    * ``forward_head(features, pre_logits=False)``: logits, or the pooled ``(B, D)``;
    * ``forward(x) == forward_head(forward_features(x))`` in eval mode;
    * every attention layer declares ``attn_kind`` and accepts ``return_attn=True``.

    Shape: x (B, C, H, W).
    """

    def forward_features(self, x: Tensor) -> Any: ...

    def forward_head(self, x: Any, pre_logits: bool = False) -> Any: ...

    def __call__(self, x: Tensor) -> Any: ...


@dataclass(frozen=True)
class FamilyProperties:
    """How a family turns an image into tokens and mixes them (CvT paper, Table 1, extended);
    ``main_model`` is the preset chapter 13 times, ``branches`` 2 for CrossViT.
    """

    name: str
    position_embedding: str
    token_embedding: str
    attention_projection: str
    hierarchical: str
    cite: str
    main_model: str
    branches: int = 1


@dataclass(frozen=True)
class FamilyInfo:
    """What a paper file declares about its family (its module-level ``FAMILY``): its
    chapter, its comparison-table row, the layer classes that mix tokens
    (:func:`vitlab.family.attention_token_counts` hooks them) and ``tiny``, the
    ``(preset, overrides)`` of its teaching-size model for 32 px digits."""

    chapter: int
    properties: FamilyProperties
    token_mixers: tuple[type[nn.Module], ...]
    tiny: tuple[str, dict[str, Any]] = field(default=("", {}))
