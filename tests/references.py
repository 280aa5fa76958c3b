"""Helpers to build the reference implementations ``vitlab`` is checked against.

Used by the tests (``from references import hf_config_fields``: pytest puts ``tests/`` on
``sys.path``, as for ``conftest``) and by ``benchmarks/throughput.py``, which adds
``tests/`` itself; never by the package, so it does not ship in it.
"""

from __future__ import annotations

from typing import Any

from vitlab.models.cvt import CvTConfig


def hf_config_fields(config: CvTConfig) -> dict[str, Any]:
    """Keyword arguments of HuggingFace's ``CvtConfig`` for the model ``config`` describes, so
    that ``CvtForImageClassification(CvtConfig(**hf_config_fields(config)))`` takes the weights
    of :func:`vitlab.models.cvt.convert_hf`.

    Only the fields that differ between the presets are set: patch sizes, strides and
    paddings, the qkv kernel and stride, the MLP ratio and qkv bias are the same in HF's
    defaults and in every preset.
    """
    n = len(config.depth)
    return dict(
        num_labels=config.num_classes, num_channels=config.in_chans, embed_dim=list(config.embed_dim),
        num_heads=list(config.num_heads), depth=list(config.depth),
        cls_token=[False] * (n - 1) + [config.class_token],  # vitlab: a class token in the last stage only
    )  # fmt: skip
