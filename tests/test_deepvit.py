"""DeepViT: parameter formula, re-attention, scale adjustment, bad configs (shared checks:
tests/test_contract.py).

DeepViT is in neither timm nor HuggingFace, so there is no reference model to load here.
The official code (zhoudaquan/dvit_repo, commit 1ccb152c) was instantiated outside the
repository: its state dict loads into ours with ``strict=True`` and the logits agree to
7e-7 (deepvit_s and deepvit_l, eval, CPU). These tests pin down what that check showed.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import vitlab
from conftest import count_on_meta, perturb_, random_images
from vitlab.layers import Attention
from vitlab.models.deepvit import DeepViTConfig, ReAttention, ReAttentionBlock

DEEPVIT_NAMES = ["deepvit_s", "deepvit_l"]
# A small DeepViT for the tests that run forward passes (the stem needs 224 px).
SMALL = dict(embed_dim=48, depth=4, num_heads=4, num_reattention_blocks=2, num_classes=10)


@pytest.mark.parametrize("name", DEEPVIT_NAMES)
def test_parameter_count_matches_formula(name: str) -> None:
    c = vitlab.get_config(name)
    D, H, L, k = c.embed_dim, c.num_heads, c.depth, c.num_reattention_blocks
    stem = 3 * 64 * 7 * 7 + 2 * 64 + 64 * 64 * 3 * 3 + 2 * 64 + 64 * D * 8 * 8 + D
    tokens = D + 197 * D  # cls token, position embedding
    block = 10 * D * D + 12 * D  # qkv + proj + mlp (ratio 3) + two LayerNorms
    reattention = H * H + 3 * H  # 1x1 conv (H^2 + H) + BatchNorm2d (2H)
    formula = stem + tokens + L * block + k * reattention + 2 * D + 1000 * D + 1000
    assert formula == count_on_meta(name)


@pytest.mark.parametrize("name", DEEPVIT_NAMES)
def test_reattention_adds_h2_plus_3h_per_block(name: str) -> None:
    config = vitlab.get_config(name)
    H, k = config.num_heads, config.num_reattention_blocks
    plain = count_on_meta(name, num_reattention_blocks=0)
    assert count_on_meta(name) - plain == k * (H * H + 3 * H)  # 5 x 180 (S), 12 x 180 (L)


def test_transform_scale_is_a_constant_not_a_parameter() -> None:
    with_scale = ReAttention(396, num_heads=12, transform_scale=True)
    without = ReAttention(396, num_heads=12, transform_scale=False)
    assert vitlab.count_parameters(with_scale) == vitlab.count_parameters(without)
    assert with_scale.reatten_scale == pytest.approx(33**-0.5) and without.reatten_scale == 1.0


def test_reatten_matrix_is_theta_transposed_on_the_head_axis() -> None:
    module = ReAttention(48, num_heads=4)
    attn = torch.rand(2, 4, 5, 5)
    theta = module.reatten_matrix.weight[:, :, 0, 0].T  # (h, g): head h feeds mixed head g
    expected = torch.einsum("bhij,hg->bgij", attn, theta) + module.reatten_matrix.bias[:, None, None]
    torch.testing.assert_close(module.reatten_matrix(attn), expected)


def _identity_reattention(dim: int, num_heads: int) -> ReAttention:
    """θ = identity, zero bias; BatchNorm fresh (running mean 0, var 1), weight 1, bias 0; eval."""
    module = ReAttention(dim, num_heads=num_heads, transform_scale=False).eval()
    with torch.no_grad():
        module.reatten_matrix.weight.copy_(torch.eye(num_heads)[:, :, None, None])
        module.reatten_matrix.bias.zero_()
    return module


@pytest.mark.parametrize("fused", [True, False])
def test_identity_reattention_is_plain_attention(fused: bool) -> None:
    reattention = _identity_reattention(48, 4)
    attention = Attention(48, num_heads=4, fused_attn=fused).eval()
    attention.load_state_dict(
        {k: v for k, v in reattention.state_dict().items() if k.startswith(("qkv", "proj"))}, strict=True
    )
    x = torch.randn(2, 7, 48)
    with torch.no_grad():
        # BatchNorm in eval divides by sqrt(1 + eps): equal up to a relative 5e-6.
        torch.testing.assert_close(reattention(x), attention(x), atol=1e-5, rtol=1e-5)
        # The same module with a random θ, or in training mode (batch statistics), is not.
        assert not torch.allclose(reattention.train()(x), attention(x), atol=1e-3)
        reattention.eval()
        nn.init.normal_(reattention.reatten_matrix.weight)
        assert not torch.allclose(reattention(x), attention(x), atol=1e-3)


def test_reattended_maps_are_no_longer_probabilities() -> None:
    model = vitlab.create_model("deepvit_s", **SMALL).eval()
    records = vitlab.attention_maps(model, random_images(2))
    assert [r.kind for r in records] == ["self", "self", "re-attention", "re-attention"]
    maps = [r.attn for r in records]
    assert all(m.shape == (2, 4, 197, 197) for m in maps)
    torch.testing.assert_close(maps[1].sum(-1), torch.ones(2, 4, 197))  # plain attention
    assert not torch.allclose(maps[3].sum(-1), torch.ones(2, 4, 197))  # re-attention: mixed, normalised
    torch.testing.assert_close(records[3].unmixed.sum(-1), torch.ones(2, 4, 197))  # the softmax maps before


def _perturbed_reattention(transform_scale: bool) -> ReAttention:
    torch.manual_seed(0)
    layer = ReAttention(48, num_heads=4, transform_scale=transform_scale)
    perturb_(layer, std=0.3)
    return layer.eval()


@pytest.mark.parametrize("transform_scale", [True, False])
def test_reattention_is_the_papers_equation(transform_scale: bool) -> None:
    # DeepViT eq. 3: ReAttention(Q, K, V) = Norm(θ^T softmax(Q K^T / sqrt(d))) V, written out
    # with the BatchNorm in eval mode (running statistics, perturbed) and the official
    # transform_scale (DeepViT-S) as one more factor d^-1/2.
    module = _perturbed_reattention(transform_scale)
    x = torch.randn(2, 7, 48)
    d = 12
    q, k, v = module.qkv(x).reshape(2, 7, 3, 4, d).permute(2, 0, 3, 1, 4)  # each (B, h, N, d)
    softmax = (q @ k.transpose(-2, -1) / d**0.5).softmax(-1)
    theta = module.reatten_matrix.weight[:, :, 0, 0].T  # θ[h, g]: head h feeds new head g
    mixed = torch.einsum("bhij,hg->bgij", softmax, theta) + module.reatten_matrix.bias[:, None, None]
    bn = module.var_norm
    per_head = (slice(None), None, None)
    normed = (mixed - bn.running_mean[per_head]) / torch.sqrt(bn.running_var[per_head] + bn.eps)
    normed = normed * bn.weight[per_head] + bn.bias[per_head]
    if transform_scale:
        normed = normed * d**-0.5
    expected = module.proj((normed @ v).transpose(1, 2).reshape(2, 7, 48))
    with torch.no_grad():
        out, attn = module(x, return_attn=True)
    torch.testing.assert_close(attn, normed.detach())
    torch.testing.assert_close(out, expected.detach())


def test_reattention_block_is_the_pre_norm_equation() -> None:
    torch.manual_seed(0)
    block = perturb_(ReAttentionBlock(48, num_heads=4), std=0.3).eval()
    x = torch.randn(2, 7, 48)
    with torch.no_grad():
        mid = x + block.attn(block.norm1(x))
        torch.testing.assert_close(block(x), mid + block.mlp(block.norm2(mid)))
    assert isinstance(block.attn, ReAttention)


def test_fused_and_explicit_paths_agree_on_a_perturbed_model() -> None:
    # The plain blocks switch paths; the re-attention blocks have only the explicit one.
    torch.manual_seed(0)
    model = perturb_(vitlab.create_model("deepvit_s", **SMALL), std=0.1).eval()
    images = random_images(2)
    with torch.no_grad():
        fused = vitlab.set_fused_attention(model, True)(images)
        explicit = vitlab.set_fused_attention(model, False)(images)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def _official_form(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """The official block update, written literally: x + f(LN(a x)) / a for both branches."""
    a = model.config.scale_adjustment
    x = model.embed(images)
    for block in model.blocks:
        x = x + block.attn(block.norm1(x * a)) / a
        x = x + block.mlp(block.norm2(x * a)) / a
    return model.head(model.norm(x)[:, 0])


@pytest.mark.parametrize("scale_adjustment", [0.5, 1.0])
def test_scale_adjustment_equals_the_official_per_block_form(scale_adjustment: float) -> None:
    model = vitlab.create_model("deepvit_s", scale_adjustment=scale_adjustment, **SMALL).eval()
    images = random_images(2)
    with torch.no_grad():
        ours = model(images)
    # Scaling by a power of two is exact in floating point: bit-identical.
    assert torch.equal(ours, _official_form(model, images))


def test_set_fused_attention_flips_plain_blocks_and_skips_reattention() -> None:
    model = vitlab.create_model("deepvit_s", **SMALL)
    attns = [block.attn for block in model.blocks]
    assert [type(a).__name__ for a in attns] == ["Attention", "Attention", "ReAttention", "ReAttention"]
    vitlab.set_fused_attention(model, False)
    assert [a.fused_attn for a in attns[:2]] == [False, False]
    assert not any(hasattr(a, "fused_attn") for a in attns[2:])
    vitlab.set_fused_attention(model, True)
    assert [a.fused_attn for a in attns[:2]] == [True, True]


def test_train_mode_backprops_into_theta_and_batchnorm() -> None:
    model = vitlab.create_model("deepvit_s", drop_path_rate=0.1, drop_rate=0.1, **SMALL).train()
    loss = model(random_images(2)).logsumexp(-1).mean()
    loss.backward()
    attn = model.blocks[-1].attn
    assert attn.reatten_matrix.weight.grad is not None and attn.var_norm.weight.grad is not None
    assert model.cls_token.grad is not None and model.patch_embed.conv1.weight.grad is not None


def test_stem_gives_a_14x14_grid() -> None:
    model = vitlab.create_model("deepvit_s", **SMALL)
    assert model.patch_embed(random_images(1)).shape == (1, 196, 48)
    assert model.pos_embed.shape == (1, 197, 48)


# ---------------------------------------------------------------- bad input


def test_img_size_not_a_multiple_of_the_stem_stride() -> None:
    with pytest.raises(ValueError, match=r"img_size 200 is not a positive multiple of the stem's stride 16"):
        DeepViTConfig(img_size=200)


def test_embed_dim_not_divisible_by_heads() -> None:
    with pytest.raises(ValueError, match=r"embed dim 396 is not divisible by num_heads 10"):
        vitlab.create_model("deepvit_s", num_heads=10)
    with pytest.raises(ValueError, match=r"embed dim 48 is not divisible by num_heads 5"):
        ReAttention(48, num_heads=5)


def test_more_reattention_blocks_than_depth() -> None:
    with pytest.raises(ValueError, match=r"num_reattention_blocks must be between 0 and depth 16, got 17"):
        vitlab.get_config("deepvit_s", num_reattention_blocks=17)


def test_stem_width_is_a_config_field() -> None:
    model = vitlab.create_model("deepvit_s", **SMALL, stem_dim=6)
    assert model.config.stem_dim == 6
    assert [model.patch_embed.conv1.out_channels, model.patch_embed.proj.in_channels] == [6, 6]
    assert model.patch_embed(random_images(1)).shape == (1, 196, 48)
    with pytest.raises(ValueError, match=r"in_chans, stem_dim and depth must be positive, got 3, 0 and 16"):
        DeepViTConfig(stem_dim=0)


def test_non_positive_scale_adjustment() -> None:
    with pytest.raises(ValueError, match=r"scale_adjustment must be positive, got 0.0"):
        DeepViTConfig(scale_adjustment=0.0)


def test_list_models_has_the_deepvit_presets() -> None:
    assert vitlab.list_models("deepvit") == ["deepvit_l", "deepvit_s"]
