"""Shared building blocks. Models compose these; a paper's own layer lives in its model file."""

from vitlab.layers.attention import Attention, check_heads, explicit_attention, fused_attention, with_attn
from vitlab.layers.block import Block, drop_path_rates, encoder_blocks
from vitlab.layers.drop_path import DropPath, drop_path
from vitlab.layers.head import check_num_classes, classifier_head
from vitlab.layers.mlp import Mlp
from vitlab.layers.patch_embed import (
    PatchEmbed,
    UnfoldPatchEmbed,
    check_image,
    check_patch_encoder_config,
    conv_output_size,
    patchify,
    to_2tuple,
    unpatchify,
)
from vitlab.layers.pos_embed import (
    learned_position_embedding,
    sincos_1d_position_embedding,
    sincos_2d_position_embedding,
)

__all__ = [
    "Attention",
    "Block",
    "DropPath",
    "Mlp",
    "PatchEmbed",
    "UnfoldPatchEmbed",
    "check_heads",
    "check_image",
    "check_num_classes",
    "check_patch_encoder_config",
    "classifier_head",
    "conv_output_size",
    "drop_path",
    "drop_path_rates",
    "encoder_blocks",
    "explicit_attention",
    "fused_attention",
    "learned_position_embedding",
    "patchify",
    "sincos_1d_position_embedding",
    "sincos_2d_position_embedding",
    "to_2tuple",
    "unpatchify",
    "with_attn",
]
