"""PiT: timm weight equivalence, stage sizes, the pooling layer, the last stage's tokens, bad configs.

Checks shared by every family live in tests/test_contract.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import vitlab
from conftest import assert_same_logits, load_reference, random_images, timm_model
from vitlab.models.pit import PiTConfig, Pooling

PIT_NAMES = ["pit_ti_224", "pit_xs_224", "pit_s_224", "pit_b_224"]


# PiT-Ti cut to one block per stage: the overlapping stem, both pooling layers, the cls
# token's Linear. The state-dict keys and shapes of every preset are compared elsewhere.
SMALL = dict(depth=(1, 1, 1))


def perturbed_small_pair() -> tuple[nn.Module, nn.Module]:
    """(ours, timm) small PiT-Ti with the same perturbed weights, eval mode.

    timm initialises every bias to 0 and every LayerNorm to 1, so a bias loaded into the
    wrong place (the pooling conv's or the cls Linear's) would not show: all are moved."""
    reference = timm_model("pit_ti_224", depth=[1, 1, 1])
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in reference.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    return load_reference("pit_ti_224", reference, **SMALL), reference


def test_timm_weights_give_same_logits() -> None:
    model, reference = perturbed_small_pair()
    assert_same_logits(model, reference, random_images(2))


def test_fused_and_explicit_attention_agree() -> None:
    model, _ = perturbed_small_pair()
    images = random_images(2)
    tokens = torch.randn(2, 1 + 7 * 7, 256)  # stage 3: cls + 7x7 map
    outputs = {}
    for fused in (True, False):
        vitlab.set_fused_attention(model, fused)
        assert {m.fused_attn for m in model.modules() if hasattr(m, "fused_attn")} == {fused}
        with torch.no_grad():
            outputs[fused] = (model(images), model.transformers[2].blocks[0].attn(tokens))
    assert outputs[True][1].abs().amax() > 0.1  # the attention's output is not ~0
    torch.testing.assert_close(outputs[True][1], outputs[False][1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outputs[True][0], outputs[False][0], atol=1e-4, rtol=0)


def test_convert_timm_renames_only_the_stem() -> None:
    state_dict = timm_model("pit_ti_224").state_dict()
    converted = vitlab.convert_state_dict("pit_ti_224", state_dict, "timm")
    renamed = {k for k in state_dict if k not in converted}
    assert renamed == {"patch_embed.conv.weight", "patch_embed.conv.bias"}
    assert {"patch_embed.weight", "patch_embed.bias"} <= set(converted)


# Ti and S cover both head layouts (2/4/8 and 3/6/12); 112 px (13 -> 7 -> 4 tokens a side)
# keeps it fast, and the attention code is the same at every size.
# ---------------------------------------------------------------- stages and pooling


@pytest.mark.parametrize(
    "name, sizes",
    [("pit_ti_224", [27, 14, 7]), ("pit_xs_224", [27, 14, 7]), ("pit_s_224", [27, 14, 7]), ("pit_b_224", [31, 16, 8])],
)
def test_stage_sizes(name: str, sizes: list[int]) -> None:
    # book/reference_numbers.md, Table 2: 27 -> 14 -> 7 (B: 31 -> 16 -> 8).
    assert vitlab.get_config(name).stage_sizes == sizes


def test_stage_shapes_in_the_forward_pass() -> None:
    model = vitlab.create_model("pit_ti_224").eval()
    shapes = []
    with torch.no_grad():
        x = model.patch_embed(random_images(1)) + model.pos_embed
        cls_token = model.cls_token.expand(1, -1, -1)
        for stage in model.transformers:
            x, cls_token = stage(x, cls_token)
            shapes.append((tuple(x.shape), tuple(cls_token.shape)))
    assert model.pos_embed.shape == (1, 64, 27, 27)
    assert shapes == [
        ((1, 64, 27, 27), (1, 1, 64)),
        ((1, 128, 14, 14), (1, 1, 128)),
        ((1, 256, 7, 7), (1, 1, 256)),
    ]


def test_features_are_the_last_stage_tokens_and_maps_cover_every_stage() -> None:
    model = vitlab.create_model("pit_ti_224").eval()
    images = random_images(1)
    with torch.no_grad():
        assert model.forward_features(images).shape == (1, 1 + 7 * 7, 256)
    maps = [record.attn for record in vitlab.attention_maps(model, images)]
    assert [tuple(m.shape) for m in maps] == ([(1, 2, 730, 730)] * 2 + [(1, 4, 197, 197)] * 6 + [(1, 8, 50, 50)] * 4)


def test_other_image_size_builds_its_own_grid() -> None:
    model = vitlab.create_model("pit_ti_224", img_size=256).eval()
    assert model.config.stage_sizes == [31, 16, 8]
    assert model.pos_embed.shape == (1, 64, 31, 31)
    assert model(random_images(1, 256)).shape == (1, 1000)


def test_pooling_is_one_grouped_conv_without_a_pointwise_conv() -> None:
    # Pitfall 12: a common re-implementation adds a 1x1 conv after the depthwise conv; the official PiT has none.
    model = vitlab.create_model("pit_s_224")
    for stage, in_ch in zip(model.transformers[1:], (144, 288)):
        conv = stage.pool.conv
        assert (conv.in_channels, conv.out_channels, conv.groups) == (in_ch, 2 * in_ch, in_ch)
        assert (conv.kernel_size, conv.stride, conv.padding) == ((3, 3), (2, 2), (1, 1))
        assert conv.weight.shape == (2 * in_ch, 1, 3, 3)  # every output channel sees one input channel
        assert (stage.pool.fc.in_features, stage.pool.fc.out_features) == (in_ch, 2 * in_ch)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 3  # the stem and the two pooling convs
    assert all(c.kernel_size != (1, 1) for c in convs)


def test_pooling_parameter_count() -> None:
    # conv 2C * 3 * 3 + 2C bias, cls Linear C * 2C + 2C: 44,640 for C = 144 (PiT-S, stage 1 -> 2).
    C = 144
    pool = Pooling(C, 2 * C)
    assert vitlab.count_parameters(pool) == 2 * C * 9 + 2 * C + C * 2 * C + 2 * C == 44_640
    # A depthwise conv + 1x1 conv (pitfall 12) would add a (2C x 2C) pointwise layer: 83,232 more.
    pointwise = nn.Conv2d(2 * C, 2 * C, kernel_size=1)
    assert vitlab.count_parameters(pointwise) == 83_232


def test_pooling_conv_is_two_filters_per_channel() -> None:
    # Output channel j is computed from input channel j // 2 alone (groups = in_ch, 2 per group).
    pool = Pooling(4, 8)
    x = torch.randn(1, 4, 7, 7)
    out, _ = pool(x, torch.zeros(1, 1, 4))
    j = 5
    by_hand = nn.functional.conv2d(
        x[:, j // 2 : j // 2 + 1], pool.conv.weight[j : j + 1], pool.conv.bias[j : j + 1], stride=2, padding=1
    )
    torch.testing.assert_close(out[:, j : j + 1], by_hand)
    assert out.shape == (1, 8, 4, 4)


# ---------------------------------------------------------------- bad input


def test_heads_must_be_positive_and_divide_the_channels() -> None:
    with pytest.raises(ValueError, match=r"num_heads must be positive, got 0"):
        PiTConfig(num_heads=(3, 0, 12))
    with pytest.raises(ValueError, match=r"embed dim 288 is not divisible by num_heads 5"):
        PiTConfig(num_heads=(3, 5, 12))


def test_mismatched_stage_tuples() -> None:
    with pytest.raises(ValueError, match=r"one entry per stage, got lengths 3, 2, 3"):
        PiTConfig(depth=(2, 6))


def test_non_positive_sizes() -> None:
    with pytest.raises(ValueError, match=r"must be positive, got patch_stride=8, embed_dim=\(144, 0, 576\)"):
        PiTConfig(embed_dim=(144, 0, 576))


def test_image_smaller_than_the_stem() -> None:
    with pytest.raises(ValueError, match=r"img_size 8 is smaller than the stem's kernel 16"):
        vitlab.create_model("pit_ti_224", img_size=8)


def test_list_models_has_the_pit_presets() -> None:
    assert set(PIT_NAMES) <= set(vitlab.list_models("pit_"))
