"""Automatic checks for the course's "implement it" exercises.

An exercise is three cells: a stub (``raise NotImplementedError``), the solution, and a
check cell such as ``vitlab.checks.scaled_dot_product_attention(my_attention);``. Each
check runs the function on a few seeded CPU cases against the reference, prints one
line (``PASS ...``, ``FAIL ...`` naming the case and what differs, or ``TODO ...: not
implemented yet``) and returns a :class:`CheckResult`, truthy only when passed. Every
case runs: ``result.fraction`` is the share that match, a grader's partial credit. A
wrong answer that matches a known one (a pitfall of book/pitfalls.md) is named. An answer
that changes its inputs in place, or breaks autograd with an in-place operation (one case
runs with gradients and a backward pass), fails. A check never raises on the student's
behalf. The result displays nothing, so a cell shows the line only.

The student's answers are computed first and the references after, never on one stack.
The instructor's grader (the separate package ``vitlab_grader``) does not run these
functions in the student's kernel: it takes a check's cases and reference, gets the
answers back as data and compares in its own process (:mod:`vitlab.checks._core`).

Signatures of the functions under test (two are fixed for graders and other tools:
``scaled_dot_product_attention`` and ``t2t_token_count``):

* ``patchify(fn)``: ``fn(images (B,C,H,W), patch_size) -> (B, N, P*P*C)``, pixels (p1 p2 c)
* ``unpatchify(fn)``: ``fn(patches, patch_size, grid_size (h, w)) -> (B, C, H, W)``
* ``scaled_dot_product_attention(fn)``: ``fn(q, k, v, mask=None) -> (B, h, N, d)``
* ``split_heads(fn)``: ``fn(x (B,N,C), num_heads) -> (B, h, N, d)``, channels (h d)
* ``qkv_weight_from_jax(fn)``: ``fn(query, key, value (C,h,d) each) -> (3C, C)``, fused qkv weight
* ``padded_cross_attention(fn)``: ``fn(q (B,h,M,d), k (B,h,N,d), v (B,h,N,d_v), key_lengths (B,)) -> (B, h, M, d_v)``
* ``encoder_block(fn)``: ``fn(x (B,N,C), block) -> (B, N, C)``, pre-norm, from the Block's sub-modules
* ``vit_param_count(fn)``: ``fn(embed_dim, depth, patch_size, num_classes, img_size) -> int``
* ``post_norm_block(fn)``: ``fn(x (B,N,C), block) -> (B, N, C)``, post-norm, LN(x + f(x))
* ``hard_distillation_loss(fn)``: ``fn(cls_logits, dist_logits, teacher_logits, labels, alpha=0.5)``
* ``soft_distillation_loss(fn)``: ``fn(cls_logits, dist_logits, teacher_logits, labels, alpha=, tau=)``
* ``mixup_hard_distillation_loss(fn)``: ``fn(cls_logits, dist_logits, teacher_logits, targets (B,K), alpha=0.5)``
* ``soft_distillation_from_probs(fn)``: ``fn(cls_logits, dist_logits, teacher_probs (B,K), labels, alpha=, tau=)``
* ``re_attention(fn)``: ``fn(attn (B,H,N,N), theta (H,H)) -> (B, H, N, N)``, before the norm
* ``re_attention_map(fn)``: ``fn(scores (B,H,N,N), theta (H,H), bn BatchNorm2d(H)) -> (B, H, N, N)``
* ``re_attention_heads(fn)``: ``fn(q, k (B,H_in,N,d_k), v (B,H_out,N,d_v), theta (H_in,H_out), bn) -> (B,N,H_out*d_v)``
* ``re_attention_layernorm(fn)``: ``fn(attn (B,H,N,N), theta (H,H), weight (H,), bias (H,)) -> (B, H, N, N)``
* ``layer_scale_init(fn)``: ``fn(layer_index, depth) -> float``
* ``class_attention(fn)``: ``fn(x (B,1+N,C), wq, wk, wv (C,C), num_heads) -> (B, 1, C)``
* ``class_attention_tokens(fn)``: ``fn(x (B,n+N,C), wq, wk, wv (C,C), num_heads, num_queries) -> (B, n, C)``
* ``cross_attention_fusion(fn)``: ``fn(x, other, f, g, wq, wk, wv, wo, num_heads) -> (B, 1+N_i, C_i)``
* ``fusion_macs(fn)``: ``fn(n_s, n_l, c_s, c_l) -> int``, MACs of CrossViT's fusion, both directions
* ``t2t_token_count(fn)``: ``fn(size, kernel, stride, padding) -> int``
* ``t2t_grids(fn)``: ``fn(height, width) -> (3, 2)`` integer tensor, (rows, cols) after each soft split
* ``soft_split(fn)``: ``fn(x (B,C,H,W), kernel, stride, padding) -> (B, L, C*k*k)``
* ``squeezed_kv_projection(fn)``: ``fn(x (B,H*W,C), grid_size, weight (C,1,k,k), stride) -> (B, H'*W', C)``
* ``cvt_conv_attention(fn)``: ``fn(x (B,T+H*W,C), grid_size, attn ConvAttention) -> (B, T+H*W, C)``
* ``cvt_avg_attention(fn)``: ``fn(x (B,T+H*W,C), grid_size, attn ConvAttention) -> (B, T+H*W, C)``, k, v average-pooled
* ``pit_pooling(fn)``: ``fn(x (B,C,H,W), weight (2C,1,3,3), bias (2C,)) -> (B, 2C, H', W')``
* ``pit_pooling_stage(fn)``: ``fn(tokens (B,1+H*W,C), grid_size, conv_w, conv_b, fc_w, fc_b) -> (B, 1+H'*W', 2C)``
* ``levit_bias_indices(fn)``: ``fn(resolution) -> (r*r, r*r)`` integer tensor
* ``levit_attention_logits(fn)``: ``fn(q, k, bias, scale) -> (B, h, N_q, N_k)``
* ``levit_shrink_bias_indices(fn)``: ``fn(resolution, stride) -> (ceil(r/s)**2, r*r)`` integer tensor
* ``encoder_block_macs(fn)``: ``fn(tokens, dim, mlp_ratio) -> int``, MACs of one ViT block
* ``attention_macs(fn)``: ``fn(n_queries, n_keys, qk_dim, v_dim) -> int``, MACs of q k^T and attn v
* ``warmup_cosine(fn)``: ``fn(step, *, total_steps, warmup_steps, min_ratio=0.0) -> float``
* ``attention_rollout(fn)``: ``fn(attn_maps depth x (B,h,N,N)) -> (B, N, N)``, later blocks on the left
* ``mean_pool_rollout(fn)``: ``fn(attn_maps depth x (B,h,N,N)) -> (B, N)``, the mean of the rollout's rows

Each check's docstring defines its function exactly.
"""

from vitlab.checks._core import CheckResult
from vitlab.checks.attention import (
    padded_cross_attention,
    qkv_weight_from_jax,
    scaled_dot_product_attention,
    split_heads,
)
from vitlab.checks.cait import class_attention, class_attention_tokens, layer_scale_init
from vitlab.checks.crossvit import cross_attention_fusion, fusion_macs
from vitlab.checks.cvt import cvt_avg_attention, cvt_conv_attention, squeezed_kv_projection
from vitlab.checks.deepvit import re_attention, re_attention_heads, re_attention_layernorm, re_attention_map
from vitlab.checks.deit import (
    hard_distillation_loss,
    mixup_hard_distillation_loss,
    soft_distillation_from_probs,
    soft_distillation_loss,
)
from vitlab.checks.encoder import encoder_block, post_norm_block, vit_param_count
from vitlab.checks.family import attention_macs, encoder_block_macs
from vitlab.checks.levit import levit_attention_logits, levit_bias_indices, levit_shrink_bias_indices
from vitlab.checks.patches import patchify, unpatchify
from vitlab.checks.pit import pit_pooling, pit_pooling_stage
from vitlab.checks.t2t import soft_split, t2t_grids, t2t_token_count
from vitlab.checks.training import attention_rollout, mean_pool_rollout, warmup_cosine

# The checks, and what they return.
__all__ = [
    "CheckResult",
    "attention_macs",
    "attention_rollout",
    "class_attention",
    "class_attention_tokens",
    "cross_attention_fusion",
    "cvt_avg_attention",
    "cvt_conv_attention",
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
    "pit_pooling",
    "pit_pooling_stage",
    "post_norm_block",
    "qkv_weight_from_jax",
    "re_attention",
    "re_attention_heads",
    "re_attention_layernorm",
    "re_attention_map",
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
