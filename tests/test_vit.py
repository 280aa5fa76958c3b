"""ViT: parameter formula, timm weight equivalence, ViT's own options and errors.

Checks shared by every family (the contract, fused == explicit, reference parameter counts,
backward, bad images) live in tests/test_contract.py.
"""

from __future__ import annotations

import pytest
import torch

import vitlab
from conftest import assert_same_logits, count_on_meta, load_reference, random_images, timm_model
from vitlab.models.vit import ViTConfig

VIT_NAMES = ["vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224", "vit_base_patch32_224"]


def test_parameter_count_matches_formula() -> None:
    # book/reference_numbers.md: 3p^2 D + D + D + 197 D + L(12 D^2 + 13 D) + 2D + 1000 D + 1000, ViT-B.
    D, L, p = 768, 12, 16
    formula = 3 * p * p * D + D + D + 197 * D + L * (12 * D * D + 13 * D) + 2 * D + 1000 * D + 1000
    assert formula == count_on_meta("vit_base_patch16_224")


# The one reference run of ViT, for both heads: depth cut to 2, every weight perturbed. timm's
# global_pool="avg" pools the patch tokens, then applies fc_norm (its norm is the identity),
# so a LayerNorm before the pooling would show. That every preset's state dict maps onto
# timm's, key by key and shape by shape: tests/test_contract.py.
@pytest.mark.parametrize("global_pool", ["token", "avg"])
def test_timm_weights_give_same_logits(global_pool: str) -> None:
    reference = timm_model("vit_tiny_patch16_224", global_pool=global_pool, depth=2)
    model = load_reference("vit_tiny_patch16_224", reference, global_pool=global_pool, depth=2)  # strict
    assert_same_logits(model, reference, random_images(2), atol=1e-4)


def test_logits_shape_and_attention_maps() -> None:
    model = vitlab.create_model("vit_tiny_patch16_224", num_classes=10).eval()
    images = random_images(3)
    assert model(images).shape == (3, 10)
    maps = [record.attn for record in vitlab.attention_maps(model, images)]
    assert len(maps) == 12 and maps[0].shape == (3, 3, 197, 197)
    torch.testing.assert_close(maps[0].sum(-1), torch.ones(3, 3, 197))


def test_sincos_position_embedding_is_a_fixed_buffer() -> None:
    model = vitlab.create_model("vit_tiny_patch16_224", pos_embed="sincos")
    assert "pos_embed" not in dict(model.named_parameters())
    assert model.pos_embed.shape == (1, 197, 192)
    learned = vitlab.create_model("vit_tiny_patch16_224")
    assert vitlab.count_parameters(learned) - vitlab.count_parameters(model) == 197 * 192


# ---------------------------------------------------------------- bad input


def test_image_not_divisible_by_patch_size() -> None:
    with pytest.raises(ValueError, match=r"img_size 225 is not divisible by patch_size 16"):
        vitlab.create_model("vit_tiny_patch16_224", img_size=225)


def test_embed_dim_not_divisible_by_heads() -> None:
    with pytest.raises(ValueError, match=r"embed dim 200 is not divisible by num_heads 3"):
        vitlab.create_model("vit_tiny_patch16_224", embed_dim=200)


def test_input_size_not_divisible_by_patch() -> None:
    model = vitlab.create_model("vit_tiny_patch16_224")
    with pytest.raises(ValueError, match=r"image size 230x230 is not divisible by the patch size 16x16"):
        model(random_images(1, 230))


def test_unknown_model_lists_close_names() -> None:
    with pytest.raises(KeyError, match=r"unknown model 'vit_base_patch16'.*close names: .*vit_base_patch16_224"):
        vitlab.create_model("vit_base_patch16")


def test_unknown_override() -> None:
    with pytest.raises(TypeError, match=r"ViTConfig has no field\(s\) \['embed_size'\]"):
        vitlab.create_model("vit_tiny_patch16_224", embed_size=10)


def test_unknown_source() -> None:
    with pytest.raises(ValueError, match=r"source must be one of"):
        vitlab.convert_state_dict("vit_tiny_patch16_224", {}, "keras")


def test_config_is_frozen_and_keyword_only() -> None:
    config = ViTConfig(embed_dim=192, num_heads=3)
    with pytest.raises(Exception):
        config.depth = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        ViTConfig(224)  # type: ignore[misc]


def test_list_models_has_the_vit_presets() -> None:
    names = vitlab.list_models("vit_")
    assert set(VIT_NAMES) <= set(names)
