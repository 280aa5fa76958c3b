"""CaiT: parameter formula, timm logits, LayerScale, talking heads, class attention, bad configs.

Checks shared by every family live in tests/test_contract.py.
"""

from __future__ import annotations

import pytest
import torch
from einops import rearrange
from torch import nn

import vitlab
from conftest import assert_same_logits, count_on_meta, load_reference, random_images, timm_model
from vitlab.layers import explicit_attention
from vitlab.models.cait import (
    CaiTConfig,
    ClassAttn,
    HeadMixing,
    LayerScale,
    LayerScaleBlock,
    TalkingHeadAttn,
    layer_scale_init_for_depth,
)

CAIT_NAMES = ["cait_xxs24_224", "cait_xs24_224", "cait_s24_224"]


def test_xs24_at_384_matches_timm_count() -> None:
    # book/reference_numbers.md: 26,670,088 for timm's cait_xs24_384 (24 x 24 = 576 position slots).
    with torch.device("meta"):
        model = vitlab.create_model("cait_xs24_224", img_size=384)
    assert vitlab.count_parameters(model) == 26_670_088
    assert vitlab.count_parameters(timm_model("cait_xs24_384", device="meta")) == 26_670_088


@pytest.mark.parametrize("name", CAIT_NAMES)
def test_parameter_count_matches_formula(name: str) -> None:
    # book/reference_numbers.md: SA block 12D^2 + 15D + 2(H^2 + H), CA block 12D^2 + 15D, pos-embed 196 D.
    config = vitlab.get_config(name)
    D, H, p = config.embed_dim, config.num_heads, config.patch_size
    formula = (
        3 * p * p * D
        + D  # patch embedding
        + D
        + 196 * D  # cls token, position embedding (patches only)
        + 24 * (12 * D * D + 15 * D + 2 * (H * H + H))
        + 2 * (12 * D * D + 15 * D)
        + 2 * D
        + 1000 * D
        + 1000  # final norm, head
    )
    assert formula == count_on_meta(name)


def _exercise_every_branch(reference: torch.nn.Module) -> torch.nn.Module:
    """Make every residual branch count in the logits.

    At timm's init, LayerScale is 1e-5 and every bias 0, so a block's output barely moves
    the residual stream: a wrong talking-heads or class-attention layer would change the
    logits by less than the 1e-4 tolerance, and with timm's weights (std 0.02) the
    attention logits are so small that every map is near uniform, mixed or not. Random
    gammas (about 0.3), biases, and linear weights at fan-in scale make it show.
    """
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if param.ndim == 2:  # a linear layer's weight (C_out, C_in): O(1) activations, sharp maps
                param.copy_(torch.randn(param.shape, generator=generator) * param.shape[1] ** -0.5)
            elif "gamma" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
            elif name.endswith("bias"):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return reference


def test_timm_weights_give_same_logits_on_both_paths() -> None:
    # The reference test of the family: timm's CaiT-XXS cut to 2 + 2 blocks, every weight
    # perturbed and the gammas random, so each branch moves the logits. Both our paths
    # (class-attention fused or explicit) must give timm's logits.
    reference = _exercise_every_branch(timm_model("cait_xxs24_224", depth=2))
    model = load_reference("cait_xxs24_224", reference, depth=2)
    images = random_images(2)
    assert_same_logits(vitlab.set_fused_attention(model, True), reference, images)
    assert_same_logits(vitlab.set_fused_attention(model, False), reference, images)
    with torch.no_grad():
        gammas = [p for n, p in model.named_parameters() if n.endswith("gamma")]
        assert len(gammas) == 8 and min(g.abs().max().item() for g in gammas) > 0.1  # the branches matter


def test_convert_timm_renames_only_layer_scale() -> None:
    reference = timm_model("cait_xxs24_224", depth=2)
    converted = vitlab.convert_state_dict("cait_xxs24_224", reference.state_dict())
    renamed = sorted(set(converted) - set(reference.state_dict()))
    assert renamed == sorted(
        f"{stage}.{i}.ls{j}.gamma" for stage in ("blocks", "blocks_token_only") for i in range(2) for j in (1, 2)
    )
    official = {f"module.{k}": v for k, v in reference.state_dict().items()}  # DDP-saved checkpoint
    assert vitlab.convert_state_dict("cait_xxs24_224", official).keys() == converted.keys()


def test_class_attention_is_one_query_over_cls_and_patches_on_both_paths() -> None:
    torch.manual_seed(0)
    layer = ClassAttn(64, num_heads=4).eval()
    x = torch.randn(2, 1 + 49, 64)
    heads = "B n (h d) -> B h n d"
    q = rearrange(layer.q(x[:, :1]), heads, h=4)  # only the cls token asks
    k, v = (rearrange(f(x), heads, h=4) for f in (layer.k, layer.v))  # keys, values: [cls, patches]
    attn = (q @ k.transpose(-2, -1) * 16**-0.5).softmax(-1)  # (2, 4, 1, 50)
    expected = layer.proj(rearrange(attn @ v, "B h n d -> B n (h d)"))
    out_fused = layer(x)
    layer.fused_attn = False
    out_explicit, attn_explicit = layer(x, return_attn=True)
    assert out_fused.shape == (2, 1, 64)
    torch.testing.assert_close(out_explicit, expected)
    torch.testing.assert_close(attn_explicit, attn)
    torch.testing.assert_close(out_fused, expected, atol=1e-5, rtol=0)


def test_class_attention_blocks_leave_patches_unchanged() -> None:
    model = vitlab.create_model("cait_xxs24_224", depth=2).eval()
    images = random_images(1)
    with torch.no_grad():
        patches = model.forward_patches(images)
        features = model.norm(patches)
        torch.testing.assert_close(model.forward_features(images)[:, 1:], features)
    records = vitlab.attention_maps(model, images)  # 2 talking-heads maps over the patches, then class-attention
    assert [(r.kind, tuple(r.attn.shape)) for r in records] == [("mixed", (1, 4, 196, 196))] * 2 + [
        ("class", (1, 4, 1, 197))
    ] * 2


def _perturbed_talking_heads() -> TalkingHeadAttn:
    torch.manual_seed(0)
    layer = TalkingHeadAttn(64, num_heads=4).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return layer


def test_talking_heads_is_the_papers_mixing_before_and_after_the_softmax() -> None:
    layer = _perturbed_talking_heads()
    x = torch.randn(2, 10, 64)
    q, k, v = rearrange(layer.qkv(x), "B N (qkv h d) -> qkv B h N d", qkv=3, h=4)
    logits = q @ k.transpose(-2, -1) * 16**-0.5
    mixed = torch.einsum("gh,bhij->bgij", layer.proj_l.weight, logits) + layer.proj_l.bias[:, None, None]
    softmax = mixed.softmax(-1)
    weights = torch.einsum("gh,bhij->bgij", layer.proj_w.weight, softmax) + layer.proj_w.bias[:, None, None]
    out, attn = layer(x, return_attn=True)
    torch.testing.assert_close(attn, weights)
    torch.testing.assert_close(out, layer.proj(rearrange(weights @ v, "B h N d -> B N (h d)")))
    records = vitlab.attention_maps(layer, x)  # the map after proj_w, and the softmax maps before it
    torch.testing.assert_close(records[0].unmixed, softmax)


def test_talking_heads_has_only_the_explicit_path() -> None:
    layer = _perturbed_talking_heads()
    assert not hasattr(layer, "fused_attn")
    x = torch.randn(2, 10, 64)
    before = layer(x)
    vitlab.set_fused_attention(layer, True)  # nothing to switch: the output stays the same
    assert not hasattr(layer, "fused_attn")
    torch.testing.assert_close(layer(x), before)


def test_talking_heads_with_identity_mixing_is_standard_attention() -> None:
    layer = TalkingHeadAttn(64, num_heads=4).eval()
    with torch.no_grad():
        for proj in (layer.proj_l, layer.proj_w):
            proj.weight.copy_(torch.eye(4))
            proj.bias.zero_()
    x = torch.randn(2, 10, 64)
    out, attn = layer(x, return_attn=True)
    q, k, v = rearrange(layer.qkv(x), "B N (qkv h d) -> qkv B h N d", qkv=3, h=4)
    expected, expected_attn = explicit_attention(q, k, v, scale=16**-0.5)
    torch.testing.assert_close(attn, expected_attn)
    torch.testing.assert_close(out, layer.proj(rearrange(expected, "B h N d -> B N (h d)")))


def test_layer_scale_is_a_diagonal_matrix() -> None:
    ls = LayerScale(4, init_values=0.5)
    with torch.no_grad():
        ls.gamma.copy_(torch.tensor([0.5, -1.0, 2.0, 0.1]))
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(ls(x), x @ torch.diag(ls.gamma))


def test_layer_scale_block_is_the_papers_equation() -> None:
    # CaiT eq.: x' = x + diag(γ1) SA(η(x)), then x' + diag(γ2) FFN(η(x')).
    torch.manual_seed(0)
    block = LayerScaleBlock(32, num_heads=4, init_values=1e-5).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.3 * torch.randn_like(p))
    x = torch.randn(2, 9, 32)
    g1, g2 = torch.diag(block.ls1.gamma), torch.diag(block.ls2.gamma)
    mid = x + block.attn(block.norm1(x)) @ g1
    torch.testing.assert_close(block(x), mid + block.mlp(block.norm2(mid)) @ g2)


def test_layer_scale_init_by_total_depth() -> None:
    # CaiT section 2: 0.1 up to depth 18, 1e-5 at 24, 1e-6 deeper; one value for every block.
    assert [layer_scale_init_for_depth(d) for d in (12, 18, 24, 36, 48)] == [0.1, 0.1, 1e-5, 1e-6, 1e-6]
    assert CaiTConfig(depth=12).layer_scale_init == 0.1
    assert CaiTConfig(depth=36).layer_scale_init == 1e-6
    with torch.device("meta"):
        assert vitlab.create_model("cait_xxs24_224").config.layer_scale_init == 1e-5
    model = vitlab.create_model("cait_xxs24_224", depth=3)
    gammas = [p for n, p in model.named_parameters() if n.endswith("gamma")]
    assert len(gammas) == 2 * (3 + 2)
    for gamma in gammas:
        torch.testing.assert_close(gamma.detach(), torch.full_like(gamma, 1e-5))


# ---------------------------------------------------------------- bad input


def test_image_not_divisible_by_patch_size() -> None:
    with pytest.raises(ValueError, match=r"img_size 225 is not divisible by patch_size 16"):
        vitlab.create_model("cait_xxs24_224", img_size=225)


def test_embed_dim_not_divisible_by_heads() -> None:
    with pytest.raises(ValueError, match=r"embed dim 192 is not divisible by num_heads 5"):
        vitlab.create_model("cait_xxs24_224", num_heads=5)


def test_layer_scale_init_out_of_range_names_paper_value() -> None:
    with pytest.raises(ValueError, match=r"init_values .* must be in \(0, 1\], got 0.0; .*depth 36 is 1e-06"):
        vitlab.create_model("cait_xxs24_224", depth=36, init_values=0.0)


@pytest.mark.parametrize("depth", [0, -3, 2.5])
def test_layer_scale_init_needs_a_positive_int_depth(depth: object) -> None:
    with pytest.raises(ValueError, match=rf"depth must be a positive int, got {depth}"):
        layer_scale_init_for_depth(depth)  # type: ignore[arg-type]


def test_no_class_attention_block() -> None:
    with pytest.raises(ValueError, match=r"depth_token_only must be >= 1 .*got 0"):
        vitlab.create_model("cait_xxs24_224", depth_token_only=0)


def test_list_models_has_the_cait_presets() -> None:
    assert set(CAIT_NAMES) <= set(vitlab.list_models("cait"))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("heads_out", [4, 6])
def test_head_mixing_is_a_linear_layer_on_the_head_axis(bias: bool, heads_out: int) -> None:
    # out[:, g] = sum_h W[g, h] maps[:, h] + b[g], at every (i, j).
    torch.manual_seed(0)
    mixing = HeadMixing(4, heads_out, bias=bias)
    maps = torch.randn(2, 4, 7, 5)
    expected = torch.einsum("gh,bhij->bgij", mixing.weight, maps)
    if bias:
        expected = expected + mixing.bias[:, None, None]
    torch.testing.assert_close(mixing(maps), expected)
    assert isinstance(mixing, nn.Linear)  # the same state dict as timm's nn.Linear
