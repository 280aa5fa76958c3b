"""Automatic checks for the course's "implement it" exercises.

An exercise is a stub (``raise NotImplementedError``), the solution, and a check cell such
as ``vitlab.checks.scaled_dot_product_attention(my_attention);``. Each check runs the
function on seeded CPU cases against the reference, prints one line (``PASS``, ``FAIL``
naming the case and what differs, or ``TODO``) and returns a :class:`CheckResult`, truthy
only when passed (``result.fraction``: the share of cases that match). A known wrong answer
(a pitfall of book/pitfalls.md) is named; an answer that changes its inputs in place or
breaks or loses the gradient fails. A check never raises on the student's behalf (see
:mod:`vitlab.checks._core`). Each check's docstring defines the function it checks; the
signatures of ``scaled_dot_product_attention`` and ``t2t_token_count`` are fixed for graders.
"""

from vitlab.checks._core import CheckResult
from vitlab.checks.attention import (
    padded_cross_attention,
    qkv_weight_from_jax,
    scaled_dot_product_attention,
    split_heads,
)
from vitlab.checks.cait import class_attention, class_attention_tokens, layer_scale_init
from vitlab.checks.cvt import cvt_avg_attention, squeezed_kv_projection
from vitlab.checks.deepvit import re_attention_heads, re_attention_layernorm
from vitlab.checks.deit import (
    hard_distillation_loss,
    mixup_hard_distillation_loss,
    soft_distillation_from_probs,
    soft_distillation_loss,
)
from vitlab.checks.encoder import encoder_block, post_norm_block, vit_param_count
from vitlab.checks.family import attention_macs, encoder_block_macs, fusion_macs
from vitlab.checks.levit import levit_attention_logits, levit_bias_indices, levit_shrink_bias_indices
from vitlab.checks.patches import patchify, unpatchify
from vitlab.checks.pit import pit_pooling_stage
from vitlab.checks.t2t import soft_split, t2t_grids, t2t_token_count
from vitlab.checks.training import mean_pool_rollout, warmup_cosine

# The checks, and what they return.
__all__ = [
    "CheckResult", "attention_macs", "class_attention", "class_attention_tokens", "cvt_avg_attention", "encoder_block",
    "encoder_block_macs", "fusion_macs", "hard_distillation_loss", "layer_scale_init", "levit_attention_logits",
    "levit_bias_indices", "levit_shrink_bias_indices", "mean_pool_rollout", "mixup_hard_distillation_loss",
    "padded_cross_attention", "patchify", "pit_pooling_stage", "post_norm_block", "qkv_weight_from_jax",
    "re_attention_heads", "re_attention_layernorm", "scaled_dot_product_attention", "soft_distillation_from_probs",
    "soft_distillation_loss", "soft_split", "split_heads", "squeezed_kv_projection", "t2t_grids", "t2t_token_count",
    "unpatchify", "vit_param_count", "warmup_cosine",
]  # fmt: skip
