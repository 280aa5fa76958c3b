"""CrossViT: timm weight equivalence, token counts, cross-attention, bad configs.

Checks shared by every family live in tests/test_contract.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vitlab
from conftest import assert_same_logits, load_reference, random_images, timm_model
from vitlab.models.crossvit import CrossAttention, CrossViTConfig, resize_image

CROSSVIT_NAMES = [
    "crossvit_tiny_240",
    "crossvit_small_240",
    "crossvit_base_240",
    "crossvit_9_240",
    "crossvit_15_240",
    "crossvit_18_240",
    "crossvit_9_dagger_240",
]


# CrossViT-9-dagger cut to one encoder of one S block and one L block: the 3-conv stems,
# both branches, f, cross-attention and g each way, both heads. timm writes the depth as
# [N, M, fusion blocks] per encoder.
SMALL = dict(num_encoders=1, depth=(1, 1))


def perturbed_small_pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    """(ours, timm) small CrossViT-9-dagger with the same perturbed weights, eval mode.

    timm initialises biases to 0 and LayerNorms to 1, so a LayerNorm of f or g, or a bias of
    wq/wk/wv loaded into the wrong place, would not show: every parameter is moved off it."""
    reference = timm_model("crossvit_9_dagger_240", depth=[[1, 1, 0]])
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in reference.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    return load_reference("crossvit_9_dagger_240", reference, **SMALL), reference


def test_timm_weights_give_same_logits() -> None:
    model, reference = perturbed_small_pair()
    assert_same_logits(model, reference, random_images(2, 240))


def test_convert_timm_renames_only_the_branch_parameters_and_cross_attention() -> None:
    state_dict = timm_model("crossvit_tiny_240", depth=[[1, 1, 0]]).state_dict()
    converted = vitlab.convert_state_dict("crossvit_tiny_240", state_dict, "timm")
    renamed = {k for k in state_dict if k not in converted}
    branch = {"pos_embed_0", "pos_embed_1", "cls_token_0", "cls_token_1"}
    assert branch <= renamed
    assert all(".attn.w" in k for k in renamed - branch)  # the cross-attention's wq/wk/wv
    assert {"pos_embed.0", "pos_embed.1", "cls_token.0", "cls_token.1"} <= set(converted)
    assert len(converted) == len(state_dict)


def test_fused_and_explicit_attention_agree() -> None:
    model, _ = perturbed_small_pair()
    images = random_images(2, 240)
    outputs = {}
    for fused in (True, False):
        vitlab.set_fused_attention(model, fused)
        assert {m.fused_attn for m in model.modules() if hasattr(m, "fused_attn")} == {fused}
        with torch.no_grad():
            xs = model.embed(images)
            block = model.blocks[0]
            xs = [branch(x) for branch, x in zip(block.blocks, xs)]  # what the fusion sees
            tokens = torch.cat([block.projs[0](xs[0][:, :1]), xs[1][:, 1:]], dim=1)
            outputs[fused] = (model(images), block.fusion[0].attn(block.fusion[0].norm1(tokens)))
    (fused_logits, fused_cross), (explicit_logits, explicit_cross) = outputs[True], outputs[False]
    assert fused_cross.abs().amax() > 0.1  # the cross-attention's output is not ~0
    torch.testing.assert_close(fused_cross, explicit_cross, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused_logits, explicit_logits, atol=1e-4, rtol=0)


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
    attn = CrossAttention(64, num_heads=4, fused_attn=False).eval()
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
    records = vitlab.attention_maps(model, random_images(1, 240))
    cross = [record.attn for record in records if record.kind == "cross"]
    assert len(cross) == 2 * 3  # two directions in each of the K encoders
    assert [r.path for r in records if r.kind == "cross"][:2] == ["blocks.0.fusion.0.attn", "blocks.0.fusion.1.attn"]
    for s_over_l, l_over_s in zip(cross[::2], cross[1::2]):
        assert s_over_l.shape == (1, 3, 1, 1 + 196)  # S's cls among L's tokens: linear in N_L
        assert l_over_s.shape == (1, 3, 1, 1 + 400)
        for weights in (s_over_l, l_over_s):
            torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))


def test_fusion_changes_only_the_cls_tokens() -> None:
    model = vitlab.create_model("crossvit_tiny_240", **SMALL).eval()
    block = model.blocks[0]
    with torch.no_grad():
        xs = model.embed(random_images(1, 240))
        after_blocks = [branch(x) for branch, x in zip(block.blocks, xs)]
        outs = block(xs)
    for before, after in zip(after_blocks, outs):
        torch.testing.assert_close(after[:, 1:], before[:, 1:], atol=0, rtol=0)
        assert not torch.allclose(after[:, :1], before[:, :1])


def test_output_is_the_mean_of_the_two_heads() -> None:
    model = vitlab.create_model("crossvit_tiny_240", **SMALL).eval()
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
