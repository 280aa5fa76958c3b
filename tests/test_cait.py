"""CaiT: parameter formula, timm weight equivalence, talking heads, class attention, bad configs.

Checks shared by every family live in tests/test_contract.py.
"""

from __future__ import annotations

import pytest
import torch
from einops import rearrange
from torch import nn

import vitlab
from conftest import assert_same_logits, count_on_meta, load_reference, random_images, timm_model
from vitlab.layers import ClassAttention, explicit_attention
from vitlab.models import cait
from vitlab.models.cait import (
    CaiTConfig,
    HeadMixing,
    TalkingHeadAttn,
    layer_scale_init_for_depth,
    mix_heads,
    mix_heads_fast,
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
    logits by less than the 1e-4 tolerance. Larger gammas and random biases make it show.
    """
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if "gamma" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
            elif name.endswith("bias"):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return reference


# CaiT-XS-24 is left out: timm has it only at 384 px, and its layers are the same code as
# XXS and S (it is checked by parameter count). XXS-24: tests/test_contract.py.
@pytest.mark.parametrize("name", ["cait_s24_224"])
@pytest.mark.slow
def test_timm_weights_give_same_logits(name: str) -> None:
    reference = _exercise_every_branch(timm_model(name))
    model = load_reference(name, reference)
    assert_same_logits(model, reference, random_images(2))


def test_convert_timm_renames_only_layer_scale() -> None:
    reference = timm_model("cait_xxs24_224", depth=2)
    converted = vitlab.convert_state_dict("cait_xxs24_224", reference.state_dict())
    renamed = sorted(set(converted) - set(reference.state_dict()))
    assert renamed == sorted(
        f"{stage}.{i}.ls{j}.gamma" for stage in ("blocks", "blocks_token_only") for i in range(2) for j in (1, 2)
    )
    official = {f"module.{k}": v for k, v in reference.state_dict().items()}  # DDP-saved checkpoint
    assert vitlab.convert_state_dict("cait_xxs24_224", official).keys() == converted.keys()


def test_class_attention_layer_paths_and_map_shape() -> None:
    layer = ClassAttention(64, num_heads=4).eval()
    x = torch.randn(2, 1 + 49, 64)
    out_fused = layer(x)
    layer.fused_attn = False
    out_explicit, attn = layer(x, return_attn=True)
    assert out_fused.shape == (2, 1, 64) and attn.shape == (2, 4, 1, 50)
    torch.testing.assert_close(out_fused, out_explicit, atol=1e-5, rtol=0)
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 4, 1))


def test_class_attention_blocks_leave_patches_unchanged() -> None:
    model = vitlab.create_model("cait_xxs24_224", depth=2).eval()
    images = random_images(1)
    with torch.no_grad():
        patches = model.forward_patches(images)
        features = model.norm(patches)
        torch.testing.assert_close(model.forward_features(images)[:, 1:], features)
    maps = model.get_class_attention_maps(images)
    assert len(maps) == 2 and maps[0].shape == (1, 4, 1, 197)
    every = model.get_attention_maps(images)  # 2 self-attention maps over the patches, then these
    assert [m.shape for m in every] == [(1, 4, 196, 196)] * 2 + [(1, 4, 1, 197)] * 2
    for a, b in zip(every[2:], maps):
        torch.testing.assert_close(a, b)


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


def test_the_switch_reaches_the_talking_heads_fast_mixing(monkeypatch: pytest.MonkeyPatch) -> None:
    # set_fused_attention(model, False) turns off the head mixing's speed path too; the
    # outputs stay the same (tests/test_contract.py checks every family).
    model = vitlab.create_model("cait_xxs24_224", depth=1, depth_token_only=1).eval()
    calls = []
    monkeypatch.setattr(cait, "mix_heads_fast", lambda *args: calls.append(1) or mix_heads(*args))
    images = random_images(1)
    with torch.no_grad():
        fast = vitlab.set_fused_attention(model, True)(images)
        assert len(calls) == 2  # proj_l and proj_w of the one talking-heads block
        plain = vitlab.set_fused_attention(model, False)(images)
        assert len(calls) == 2 and model.blocks[0].attn.fused_attn is False
    torch.testing.assert_close(plain, fast, atol=1e-5, rtol=1e-5)
    model.blocks[0].attn.fused_attn = True
    model.blocks[0].attn(torch.randn(1, 196, 192), return_attn=True)  # return_attn takes the plain path
    assert len(calls) == 2


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
    # The batched form must equal timm's "heads last, nn.Linear, heads back", values and gradients.
    torch.manual_seed(0)
    mixing = HeadMixing(4, heads_out, bias=bias)
    plain = nn.Linear(4, heads_out, bias=bias)
    plain.load_state_dict(mixing.state_dict())
    maps = torch.randn(2, 4, 7, 5, requires_grad=True)
    fast = mixing(maps, fast=True)
    slow = rearrange(plain(rearrange(maps, "B h i j -> B i j h")), "B i j h -> B h i j")
    assert fast.shape == (2, heads_out, 7, 5)
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-6)
    weights = torch.randn_like(fast)
    grads = [
        torch.autograd.grad((out * weights).sum(), [maps, layer.weight])
        for out, layer in ((fast, mixing), (slow, plain))
    ]
    for ours, reference in zip(*grads):
        torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)


def test_head_mixing_rejects_maps_with_another_head_count() -> None:
    with pytest.raises(ValueError, match=r"expected attention maps \(B, 4, N_q, N_k\), got shape \(2, 3, 5, 5\)"):
        HeadMixing(4, 4)(torch.randn(2, 3, 5, 5))
    with pytest.raises(ValueError, match=r"got shape \(3, 5, 5\)"):
        HeadMixing(4, 4)(torch.randn(3, 5, 5))


@pytest.mark.parametrize("bias", [True, False])
def test_head_mixing_fast_path_equals_the_plain_form(bias: bool) -> None:
    maps = torch.randn(2, 4, 9, 9)
    layer = HeadMixing(4, 6, bias=bias)
    b = layer.bias if bias else None
    torch.testing.assert_close(mix_heads_fast(maps, layer.weight, b), mix_heads(maps, layer.weight, b))
    torch.testing.assert_close(layer(maps, fast=True), layer(maps))
