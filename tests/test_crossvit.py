"""CrossViT: timm weight equivalence, token counts, cross-attention, bad configs.

Checks shared by every family live in tests/test_contract.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vitlab
from conftest import assert_same_logits, load_reference, random_images, timm_model
from vitlab.layers import ClassAttention
from vitlab.models.crossvit import CrossViTConfig, resize_image

CROSSVIT_NAMES = [
    "crossvit_tiny_240",
    "crossvit_small_240",
    "crossvit_base_240",
    "crossvit_9_240",
    "crossvit_15_240",
    "crossvit_18_240",
    "crossvit_9_dagger_240",
]


# Six against timm (crossvit_tiny_240: tests/test_contract.py). Batch 1 for the two largest.
@pytest.mark.parametrize("name", CROSSVIT_NAMES[1:])
@pytest.mark.slow
def test_timm_weights_give_same_logits(name: str) -> None:
    reference = timm_model(name)
    model = load_reference(name, reference)
    batch = 1 if name in ("crossvit_base_240", "crossvit_18_240") else 2
    assert_same_logits(model, reference, random_images(batch, 240))


@pytest.mark.parametrize("name", ["crossvit_tiny_240", "crossvit_9_dagger_240"])
@pytest.mark.slow
def test_timm_weights_with_random_biases_give_same_logits(name: str) -> None:
    # timm initialises biases to 0 and LayerNorms to 1, so a LayerNorm of f or g, or a bias
    # of wq/wk/wv loaded into the wrong place, would not show. Perturb every parameter.
    reference = timm_model(name)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in reference.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    model = load_reference(name, reference)
    assert_same_logits(model, reference, random_images(2, 240))


def test_convert_timm_renames_only_the_branch_parameters_and_cross_attention() -> None:
    state_dict = timm_model("crossvit_tiny_240").state_dict()
    converted = vitlab.convert_state_dict("crossvit_tiny_240", state_dict, "timm")
    renamed = {k for k in state_dict if k not in converted}
    branch = {"pos_embed_0", "pos_embed_1", "cls_token_0", "cls_token_1"}
    assert branch <= renamed
    assert all(".attn.w" in k for k in renamed - branch)  # the cross-attention's wq/wk/wv
    assert {"pos_embed.0", "pos_embed.1", "cls_token.0", "cls_token.1"} <= set(converted)
    assert len(converted) == len(state_dict)


@pytest.mark.parametrize("name", ["crossvit_tiny_240", "crossvit_9_dagger_240"])
def test_fused_and_explicit_attention_agree(name: str) -> None:
    model = vitlab.create_model(name).eval()
    images = random_images(2, 240)
    with torch.no_grad():
        fused = vitlab.set_fused_attention(model, True)(images)
        explicit = vitlab.set_fused_attention(model, False)(images)
    torch.testing.assert_close(fused, explicit, atol=1e-4, rtol=0)
    flags = {m.fused_attn for m in model.modules() if isinstance(m, ClassAttention)}
    assert flags == {False}  # set_fused_attention reaches the cross-attention too


# ---------------------------------------------------------------- two branches, two token sequences


def test_token_counts() -> None:
    # book/reference_numbers.md, Table 2: S = patch 12 on 240 px (400 tokens), L = patch 16 on 224 px (196).
    config = vitlab.get_config("crossvit_tiny_240")
    assert config.grid_size == (20, 14)
    assert config.num_patches == (400, 196)


@pytest.mark.parametrize("name", ["crossvit_tiny_240", "crossvit_9_dagger_240"])
def test_embedded_sequences(name: str) -> None:
    model = vitlab.create_model(name).eval()
    C_S, C_L = model.config.embed_dim
    with torch.no_grad():
        small, large = model.embed(random_images(1, 240))
    assert small.shape == (1, 1 + 400, C_S)
    assert large.shape == (1, 1 + 196, C_L)


def test_dagger_stem_is_three_convs() -> None:
    model = vitlab.create_model("crossvit_9_dagger_240")
    expected = [  # (kernel, stride, padding, out_channels) of convs 0, 2, 4
        [(7, 4, 3, 32), (3, 3, 0, 64), (3, 1, 1, 128)],  # S: 240 -> 60 -> 20 -> 20
        [(7, 4, 3, 64), (3, 2, 1, 128), (3, 2, 1, 256)],  # L: 224 -> 56 -> 28 -> 14
    ]
    for stem, convs in zip(model.patch_embed, expected):
        got = [(c.kernel_size[0], c.stride[0], c.padding[0], c.out_channels) for c in stem.proj[::2]]
        assert got == convs


def test_large_branch_resize_matches_timm() -> None:
    # Bicubic, align_corners=False, no antialiasing: exactly timm's scale_image.
    crossvit = pytest.importorskip("timm.models.crossvit")
    images = random_images(2, 240)
    torch.testing.assert_close(resize_image(images, 224), crossvit.scale_image(images, (224, 224)), atol=0, rtol=0)
    antialiased = F.interpolate(images, size=(224, 224), mode="bicubic", align_corners=False, antialias=True)
    assert not torch.allclose(resize_image(images, 224), antialiased, atol=1e-3)
    assert resize_image(images, 240) is images  # the S branch is not resampled


# ---------------------------------------------------------------- cross-attention


def test_cross_attention_by_hand() -> None:
    attn = ClassAttention(64, num_heads=4, fused_attn=False).eval()
    x = torch.randn(2, 1 + 10, 64)
    out, weights = attn(x, return_attn=True)
    q = attn.q(x[:, :1]).view(2, 1, 4, 16).transpose(1, 2)  # (B, h, 1, d)
    k = attn.k(x).view(2, 11, 4, 16).transpose(1, 2)  # (B, h, 1 + N, d)
    v = attn.v(x).view(2, 11, 4, 16).transpose(1, 2)
    expected_weights = (q @ k.transpose(-2, -1) / 16**0.5).softmax(dim=-1)  # (B, h, 1, 1 + N)
    expected = attn.proj((expected_weights @ v).transpose(1, 2).reshape(2, 1, 64))
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(out, expected)
    assert out.shape == (2, 1, 64) and weights.shape == (2, 4, 1, 11)


def test_cross_attention_maps_are_one_row_per_head() -> None:
    model = vitlab.create_model("crossvit_tiny_240").eval()
    maps = model.get_cross_attention_maps(random_images(1, 240))
    assert len(maps) == 3  # K encoders
    for s_over_l, l_over_s in maps:
        assert s_over_l.shape == (1, 3, 1, 1 + 196)  # S's cls among L's tokens: linear in N_L
        assert l_over_s.shape == (1, 3, 1, 1 + 400)
        for weights in (s_over_l, l_over_s):
            torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))


def test_fusion_changes_only_the_cls_tokens() -> None:
    model = vitlab.create_model("crossvit_tiny_240").eval()
    block = model.blocks[0]
    with torch.no_grad():
        xs = model.embed(random_images(1, 240))
        after_blocks = [branch(x) for branch, x in zip(block.blocks, xs)]
        outs = block(xs)
    for before, after in zip(after_blocks, outs):
        torch.testing.assert_close(after[:, 1:], before[:, 1:], atol=0, rtol=0)
        assert not torch.allclose(after[:, :1], before[:, :1])


def test_output_is_the_mean_of_the_two_heads() -> None:
    model = vitlab.create_model("crossvit_tiny_240").eval()
    with torch.no_grad():
        small, large = model.forward_features(random_images(2, 240))
        logits_s, logits_l = model.head[0](small[:, 0]), model.head[1](large[:, 0])
        torch.testing.assert_close(model.forward_head([small, large]), (logits_s + logits_l) / 2)


# ---------------------------------------------------------------- bad input


def test_wrong_image_size() -> None:
    model = vitlab.create_model("crossvit_tiny_240")
    with pytest.raises(ValueError, match=r"expected image size 240x240 .*got 224x224"):
        model(random_images(1, 224))


def test_width_not_divisible_by_heads() -> None:
    with pytest.raises(ValueError, match=r"embed dim 100 is not divisible by num_heads 6"):
        CrossViTConfig(embed_dim=(100, 384), num_heads=(6, 6))


def test_branch_size_not_divisible_by_patch() -> None:
    with pytest.raises(ValueError, match=r"branch L: image size 224 is not divisible by its patch size 15"):
        CrossViTConfig(patch_size=(12, 15))


def test_per_branch_fields_need_two_entries() -> None:
    with pytest.raises(ValueError, match=r"needs 2 entries \(S, L\), got lengths .*'num_heads': 3"):
        CrossViTConfig(num_heads=(6, 6, 6))


def test_dagger_stem_needs_patch_12_or_16() -> None:
    with pytest.raises(ValueError, match=r"branch S: the 3-conv stem needs patch size 12 or 16 .* got patch size 8"):
        CrossViTConfig(patch_size=(8, 16), multi_conv=True)


def test_list_models_has_the_crossvit_presets() -> None:
    assert set(vitlab.list_models("crossvit_")) == set(CROSSVIT_NAMES)
