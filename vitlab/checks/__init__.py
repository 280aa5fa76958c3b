"""Automatic checks for the course's "implement it" exercises.

An exercise is three cells: a stub (``raise NotImplementedError``), the solution, and a
check cell such as ``vitlab.checks.scaled_dot_product_attention(my_attention);``. Each
check runs the function on a few seeded CPU cases against the reference, prints one
line (``PASS ...``, ``FAIL ...`` naming the case and what differs, or ``TODO ...: not
implemented yet``) and returns a :class:`CheckResult`, truthy only when passed. Every
case runs: ``result.fraction`` is the share that match, a grader's partial credit. A
wrong answer that matches a known one (a pitfall of book/pitfalls.md) is named. An answer
that changes its inputs in place, breaks autograd with an in-place operation, or carries
no gradient where the reference does (one case runs with gradients and a backward pass),
fails. A check never raises on the student's behalf. The result displays nothing, so a
cell shows the line only.

The student's answers are computed first and the references after, never on one stack.
The instructor's grader (the separate package ``vitlab_grader``) does not run these
functions in the student's kernel: it takes a check's cases and reference, gets the
answers back as data and compares in its own process (:mod:`vitlab.checks._core`).

Each check's docstring defines the function it checks (``patchify(fn)``, ``unpatchify(fn)``,
``scaled_dot_product_attention(fn)``, ``split_heads(fn)``, ``qkv_weight_from_jax(fn)``,
``padded_cross_attention(fn)``, ``encoder_block(fn)``, ``vit_param_count(fn)``, ``post_norm_block(fn)``,
``hard_distillation_loss(fn)``, ``soft_distillation_loss(fn)``, ``mixup_hard_distillation_loss(fn)``,
``soft_distillation_from_probs(fn)``, ``re_attention_heads(fn)``, ``re_attention_layernorm(fn)``,
``layer_scale_init(fn)``, ``class_attention(fn)``, ``class_attention_tokens(fn)``, ``fusion_macs(fn)``,
``t2t_token_count(fn)``, ``t2t_grids(fn)``, ``soft_split(fn)``, ``squeezed_kv_projection(fn)``,
``cvt_avg_attention(fn)``, ``pit_pooling_stage(fn)``, ``levit_bias_indices(fn)``,
``levit_attention_logits(fn)``, ``levit_shrink_bias_indices(fn)``, ``encoder_block_macs(fn)``,
``attention_macs(fn)``, ``warmup_cosine(fn)``, ``mean_pool_rollout(fn)``); the signatures of
``scaled_dot_product_attention`` and ``t2t_token_count`` are fixed for graders.
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
    "CheckResult",
    "attention_macs",
    "class_attention",
    "class_attention_tokens",
    "cvt_avg_attention",
    "encoder_block",
    "encoder_block_macs",
    "fusion_macs",
    "hard_distillation_loss",
    "layer_scale_init",
    "levit_attention_logits",
    "levit_bias_indices",
    "levit_shrink_bias_indices",
    "mean_pool_rollout",
    "mixup_hard_distillation_loss",
    "padded_cross_attention",
    "patchify",
    "pit_pooling_stage",
    "post_norm_block",
    "qkv_weight_from_jax",
    "re_attention_heads",
    "re_attention_layernorm",
    "scaled_dot_product_attention",
    "soft_distillation_from_probs",
    "soft_distillation_loss",
    "soft_split",
    "split_heads",
    "squeezed_kv_projection",
    "t2t_grids",
    "t2t_token_count",
    "unpatchify",
    "vit_param_count",
    "warmup_cosine",
]
