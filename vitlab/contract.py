"""The interface every ``vitlab`` model keeps, and what each family says about itself.

:class:`VisionModel` is written once here; ``tests/test_contract.py`` checks it for every
family, and :mod:`vitlab.rollout` and :mod:`vitlab.family` rely on it (no ``hasattr``).
:class:`AttentionMap` labels one attention map (which layer, which kind, whether its rows
are distributions). :class:`FamilyProperties` is what each paper file states about its
family in ``FAMILY``.

Speed paths. The only code in the package that exists to make a model faster is PyTorch's
fused attention kernel, :func:`torch.nn.functional.scaled_dot_product_attention`. Every
attention layer that can use it has a bool attribute ``fused_attn``: ``True`` (the
default) calls the kernel, ``False`` takes the explicit path, ``softmax(q k^T * scale) v``
written out. :func:`vitlab.set_fused_attention` switches every such layer of a model at
once, and both paths give the same outputs for every family (``tests/test_contract.py``).
Layers whose paper changes the softmax itself (DeepViT's re-attention, CaiT's talking
heads) have only the explicit path. The maps of :func:`vitlab.attention_maps` always
come from the explicit path (``return_attn=True``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from torch import Tensor, nn

Features = Tensor | list[Tensor]
Logits = Tensor | tuple[Tensor, Tensor]
AttentionKind = Literal["self", "class", "cross", "re-attention", "mixed"]

# The kinds whose maps are not distributions: they mix the heads' softmax maps linearly
# (CaiT's talking heads after ``proj_w``, DeepViT's re-attention after its BatchNorm), so
# a row can have negative weights and need not sum to 1.
MIXED_KINDS: frozenset[str] = frozenset({"re-attention", "mixed"})


@dataclass(frozen=True)
class AttentionMap:
    """One attention layer's map, with what it is (:func:`vitlab.attention_maps`).

    * ``attn``: ``(B, h, N_q, N_k)``, the map the layer multiplies its values with.
    * ``path``: the layer's name in ``model.named_modules()``, e.g. ``"blocks.3.attn"``.
    * ``kind``: ``"self"`` (queries and keys from the same tokens; LeViT's shrink attention
      and CvT's squeezed keys included), ``"class"`` (CaiT: the class token is the one
      query), ``"cross"`` (CrossViT: one branch's class token over the other branch's
      patches), ``"re-attention"`` (DeepViT) or ``"mixed"`` (CaiT's talking heads).
    * ``is_distribution``: every row is a probability distribution over the keys (the
      softmax output); ``False`` for the kinds in :data:`MIXED_KINDS`.
    * ``unmixed``: for those, the heads' softmax maps before the layer mixed them (the
      input of ``proj_w`` or of ``reatten_matrix``), ``(B, h, N_q, N_k)``, rows that sum to
      1; ``None`` for the other kinds, whose ``attn`` is already the softmax output.
    """

    attn: Tensor
    path: str
    kind: AttentionKind
    is_distribution: bool
    unmixed: Tensor | None = None


@runtime_checkable
class VisionModel(Protocol):
    """What every registered model offers (timm's names and meanings).

    * ``forward_features(x)``: the tokens after the final norm, not pooled: ``(B, N, D)``;
      one tensor per branch for a multi-branch model (CrossViT, a list); the last stage's
      tokens for a staged model (PiT, LeViT, CvT). (A mean-pooled ViT normalises after the
      pooling, as timm: its ``norm`` is the identity and ``forward_head`` has ``fc_norm``.)
    * ``forward_head(features, pre_logits=False)``: features -> logits; with
      ``pre_logits=True`` the pooled vector the classifier reads, ``(B, D)``.
    * ``forward(x) == forward_head(forward_features(x))`` (in eval mode; a distilled model
      returns a pair of logits in training mode, as its ``forward``).
    * attention maps: every attention layer declares ``attn_kind`` and accepts
      ``return_attn=True``, so :func:`vitlab.attention_maps` collects one
      :class:`AttentionMap` per layer call, in forward order. Each model's docstring says
      what its maps' rows (queries) and columns (keys) index.

    Shape: x (B, C, H, W).
    """

    def forward_features(self, x: Tensor) -> Any: ...

    def forward_head(self, x: Any, pre_logits: bool = False) -> Any: ...

    def __call__(self, x: Tensor) -> Any: ...


@dataclass(frozen=True)
class FamilyProperties:
    """How a family turns an image into tokens and mixes them (CvT paper, Table 1, extended).

    ``main_model`` is the preset chapter 13 measures for speed; ``branches`` is 2 when
    the token sequences run side by side (CrossViT) rather than one after another.
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
    """Everything a paper file declares about its family (its module-level ``FAMILY``).

    Args:
        chapter: the book chapter of the family; families are listed in chapter order.
        properties: the comparison-table row (:class:`FamilyProperties`).
        token_mixers: the layer classes that mix tokens (each reads "the tokens of a
            stage"; :func:`vitlab.family.attention_token_counts` hooks them).
        tiny: ``(preset, overrides)`` of the teaching-size model for 32 px digits.
    """

    chapter: int
    properties: FamilyProperties
    token_mixers: tuple[type[nn.Module], ...]
    tiny: tuple[str, dict[str, Any]] = field(default=("", {}))
