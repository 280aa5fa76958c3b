"""The interface every ``vitlab`` model keeps, and what each family says about itself.

:class:`VisionModel` is written once here; ``tests/test_contract.py`` checks it for every
family, and :mod:`vitlab.rollout` and :mod:`vitlab.family` rely on it (no ``hasattr``).
:class:`FamilyProperties` is what each paper file states about its family in ``FAMILY``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from torch import Tensor, nn

Features = Tensor | list[Tensor]
RolloutRule = Literal["blocks", "class_attention", "cross_attention", "squeezed_keys"]
Logits = Tensor | tuple[Tensor, Tensor]


@runtime_checkable
class VisionModel(Protocol):
    """What every registered model offers (timm's names and meanings).

    * ``forward_features(x)``: the tokens after the final norm, not pooled: ``(B, N, D)``;
      one tensor per branch for a multi-branch model (CrossViT, a list); the last stage's
      tokens for a staged model (PiT, LeViT, CvT).
    * ``forward_head(features, pre_logits=False)``: features -> logits; with
      ``pre_logits=True`` the pooled vector the classifier reads, ``(B, D)``.
    * ``forward(x) == forward_head(forward_features(x))`` (in eval mode; a distilled model
      returns a pair of logits in training mode, as its ``forward``).
    * ``get_attention_maps(x)``: one ``(B, heads, N_q, N_k)`` tensor per attention layer, in
      forward order, each row a distribution over the keys (the explicit path's softmax
      output, or what the layer multiplies its values with). Each model's docstring says
      what the rows (queries) and columns (keys) index.

    Shape: x (B, C, H, W).
    """

    def forward_features(self, x: Tensor) -> Any: ...

    def forward_head(self, x: Any, pre_logits: bool = False) -> Any: ...

    def get_attention_maps(self, x: Tensor) -> list[Tensor]: ...

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
        rollout: how :func:`vitlab.rollout.model_rollout` reads the family's attention maps:
            ``"blocks"`` (square maps, the last stage's rolled out), ``"class_attention"``
            (CaiT), ``"cross_attention"`` (CrossViT) or ``"squeezed_keys"`` (CvT).
        benchmark_preset: the preset ``benchmarks/throughput.py --all`` times against the
            family's reference (timm, or HuggingFace where the file has only ``convert_hf``);
            ``None`` for a family without a reference.
    """

    chapter: int
    properties: FamilyProperties
    token_mixers: tuple[type[nn.Module], ...]
    tiny: tuple[str, dict[str, Any]] = field(default=("", {}))
    rollout: RolloutRule = "blocks"
    benchmark_preset: str | None = None
