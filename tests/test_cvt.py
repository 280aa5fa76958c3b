"""CvT: parameter formula, HuggingFace weight equivalence, the attention-scale choice (qk_scale),
the last stage's tokens, and bad sizes. Checks shared by every family: tests/test_contract.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import vitlab
from conftest import assert_same_logits, count_on_meta, load_reference, random_images, require_reference
from references import hf_config_fields
from vitlab.models.cvt import ConvAttention, ConvProjection, CvTConfig, convert_hf

CVT_NAMES = ["cvt_13", "cvt_21", "cvt_w24_384"]

# The shallowest depths HF can build: CvtStage indexes its drop-path list by the *stage*
# index (`drop_path_rates[self.stage]`), so stage i needs more than i layers.
HF_SHALLOW = (1, 2, 3)


def randomize_norms_and_biases(model: nn.Module, seed: int = 0) -> None:
    """Make a freshly initialised model's "boring" tensors random, so the comparison can
    catch swapped norms, biases or BatchNorm statistics: HF starts with BN running stats
    0/1, every norm at weight 1 / bias 0, and zero linear biases."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.copy_(0.1 * torch.randn(module.running_mean.shape, generator=g))
                module.running_var.copy_(0.5 + torch.rand(module.running_var.shape, generator=g))
            if isinstance(module, (nn.BatchNorm2d, nn.LayerNorm)):
                module.weight.copy_(1 + 0.1 * torch.randn(module.weight.shape, generator=g))
            if isinstance(module, (nn.BatchNorm2d, nn.LayerNorm, nn.Linear, nn.Conv2d)) and module.bias is not None:
                module.bias.copy_(0.05 * torch.randn(module.bias.shape, generator=g))


def hf_cvt(name: str, **changes) -> nn.Module:
    """A randomly initialised HF CvtForImageClassification shaped like ``name``, eval mode."""
    transformers = require_reference("transformers")
    torch.manual_seed(0)
    config = transformers.CvtConfig(**{**hf_config_fields(vitlab.get_config(name)), **changes})
    model = transformers.CvtForImageClassification(config).eval()
    randomize_norms_and_biases(model)
    return model


def small_pair() -> tuple[nn.Module, nn.Module]:
    """(ours, HF) CvT-13 cut to depths ``HF_SHALLOW``, with the same randomized weights."""
    reference = hf_cvt("cvt_13", depth=list(HF_SHALLOW))
    return load_reference("cvt_13", reference, "hf", depth=HF_SHALLOW), reference


# ---------------------------------------------------------------- parameter counts


def test_parameter_count_matches_formula() -> None:
    # book/reference_numbers.md: block 12 D^2 + 46 D; stage embedding c_in D k^2 + D + 2D;
    # plus the cls token, the final norm and the head. CvT-13:
    dims, depths, kernels, c_in = (64, 192, 384), (1, 2, 10), (7, 3, 3), (3, 64, 192)
    total = sum(c * D * k * k + 3 * D + L * (12 * D * D + 46 * D) for c, D, k, L in zip(c_in, dims, kernels, depths))
    total += 384 + 2 * 384 + 384 * 1000 + 1000
    assert total == count_on_meta("cvt_13")


# ---------------------------------------------------------------- HuggingFace equivalence


def test_hf_weights_give_same_logits() -> None:
    # No position embedding: any size works, non-square too, and still equals HF.
    model, reference = small_pair()
    assert_same_logits(model, reference, random_images(2, (72, 104)))


def test_fused_and_explicit_attention_agree() -> None:
    model, _ = small_pair()  # randomized norms, biases and BatchNorm statistics
    images, tokens = random_images(2, (72, 104)), torch.randn(2, 1 + 4 * 5, 384)  # stage 3: cls + 4x5 map
    outputs = {}
    for fused in (True, False):
        vitlab.set_fused_attention(model, fused)
        assert {m.fused_attn for m in model.modules() if isinstance(m, ConvAttention)} == {fused}
        with torch.no_grad():
            outputs[fused] = (model(images), model.stages[2].blocks[0].attn(tokens, (4, 5)))
    assert outputs[True][1].abs().amax() > 0.1  # the attention's output is not ~0
    torch.testing.assert_close(outputs[True][1], outputs[False][1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outputs[True][0], outputs[False][0], atol=1e-4, rtol=0)


def test_hf_mean_pool_variant() -> None:
    # cls_token off in every stage: official and HF mean-pool the normed last-stage tokens.
    # HF's own forward crashes on that branch (`outputs[1]` of an output without a cls token),
    # so the reference logits are its encoder -> layernorm -> mean -> classifier, by hand.
    reference = hf_cvt("cvt_13", depth=list(HF_SHALLOW), cls_token=[False, False, False])
    model = load_reference("cvt_13", reference, "hf", depth=HF_SHALLOW, class_token=False)
    images = random_images(2, 64)
    with torch.no_grad():
        tokens = reference.cvt(images).last_hidden_state.flatten(2).transpose(1, 2)  # (B, N, D)
        expected = reference.classifier(reference.layernorm(tokens).mean(dim=1))
        torch.testing.assert_close(model(images), expected, atol=1e-4, rtol=0)


def test_convert_hf_rejects_unknown_keys() -> None:
    with pytest.raises(KeyError, match=r"unexpected key 'pooler.weight'"):
        convert_hf({"pooler.weight": torch.zeros(1)}, CvTConfig())


# ---------------------------------------------------------------- attention


def test_squeezed_keys_and_cls_token_shapes() -> None:
    # Stage 3 of CvT-13: 14x14 map + cls token; keys and values squeezed to 7x7 + cls.
    attn = ConvAttention(384, num_heads=6, with_cls_token=True).eval()
    x = torch.randn(2, 1 + 14 * 14, 384)
    with torch.no_grad():
        out, attn_map = attn(x, (14, 14), return_attn=True)
        fused = attn(x, (14, 14))
    assert out.shape == (2, 197, 384) and attn_map.shape == (2, 6, 197, 50)
    torch.testing.assert_close(attn_map.sum(-1), torch.ones(2, 6, 197))
    torch.testing.assert_close(out, fused, atol=1e-5, rtol=0)


def test_scale_is_embed_dim_and_head_dim_differs_only_with_heads() -> None:
    assert ConvAttention(384, num_heads=6).scale == pytest.approx(384**-0.5)
    assert ConvAttention(384, num_heads=6, qk_scale="head_dim").scale == pytest.approx(64**-0.5)
    images = random_images(1, 64)
    for heads, same in (((1, 1, 1), True), ((1, 3, 6), False)):
        a = vitlab.create_model("cvt_13", depth=(1, 1, 1), num_heads=heads).eval()
        b = vitlab.create_model("cvt_13", depth=(1, 1, 1), num_heads=heads, qk_scale="head_dim").eval()
        b.load_state_dict(a.state_dict())
        with torch.no_grad():
            assert torch.allclose(a(images), b(images), atol=1e-6) == same


def test_conv_projection_is_depthwise() -> None:
    # Pitfall 17: output channel c depends on input channel c only.
    proj = ConvProjection(8).eval()
    x = torch.randn(1, 8, 5, 5)
    bumped = x.clone()
    bumped[:, 3] += 1.0
    with torch.no_grad():
        changed = (proj(bumped) - proj(x)).abs().sum(dim=(0, 1)) > 0  # (C,)
    assert changed.tolist() == [c == 3 for c in range(8)]


# ---------------------------------------------------------------- model behaviour


def test_stage_shapes_and_no_position_embedding() -> None:
    model = vitlab.create_model("cvt_13", depth=(1, 1, 1)).eval()
    assert not any("pos_embed" in name for name, _ in model.named_parameters())
    x = random_images(1, 224)
    shapes = []
    with torch.no_grad():
        for stage in model.stages:
            x, cls_token = stage(x)
            shapes.append(tuple(x.shape))
    assert shapes == [(1, 64, 56, 56), (1, 192, 28, 28), (1, 384, 14, 14)]
    assert cls_token.shape == (1, 1, 384)
    assert model.stages[0].cls_token is None and model.stages[1].cls_token is None


def test_features_are_the_last_stage_tokens_and_maps_cover_every_stage() -> None:
    model = vitlab.create_model("cvt_13", depth=(1, 2, 2)).eval()
    images = random_images(1, 224)
    with torch.no_grad():
        assert model.forward_features(images).shape == (1, 1 + 14 * 14, 384)
    maps = [record.attn for record in vitlab.attention_maps(model, images)]
    assert [tuple(m.shape) for m in maps] == [(1, 1, 3136, 784)] + [(1, 3, 784, 196)] * 2 + [(1, 6, 197, 50)] * 2


def test_mean_pool_model_has_no_cls_token() -> None:
    with_cls = vitlab.create_model("cvt_13", depth=(1, 1, 1))
    without = vitlab.create_model("cvt_13", depth=(1, 1, 1), class_token=False, num_classes=5).eval()
    assert vitlab.count_parameters(with_cls) - vitlab.count_parameters(without) == 384 + (1000 - 5) * 385
    assert without(random_images(1, 64)).shape == (1, 5)


def test_train_mode_with_drop_path_backprops() -> None:
    model = vitlab.create_model("cvt_13", depth=(1, 1, 2), drop_path_rate=0.1, drop_rate=0.1, num_classes=4).train()
    assert model.stages[2].blocks[1].drop_path1.drop_prob == pytest.approx(0.1)
    assert isinstance(model.stages[0].blocks[0].drop_path1, nn.Identity)
    model(random_images(2, 64)).logsumexp(-1).mean().backward()
    assert model.stages[2].cls_token.grad is not None
    assert model.stages[0].blocks[0].attn.conv_proj_k.conv.weight.grad is not None


def test_smallest_image_size_runs() -> None:
    config = CvTConfig()
    assert config.min_img_size == 11 and config.stage_sizes(11) == [3, 2, 1]
    model = vitlab.create_model("cvt_13", depth=(1, 1, 1)).eval()
    assert model(random_images(1, 11)).shape == (1, 1000)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("size, maps", [((8, 8), "2x2 -> 1x1 -> 1x1"), ((224, 9), "56x2 -> 28x1 -> 14x1")])
def test_image_too_small(size: tuple[int, int], maps: str) -> None:
    model = vitlab.create_model("cvt_13", depth=(1, 1, 1))
    msg = rf"image size {size[0]}x{size[1]} is too small .*would be {maps}.*smallest size is 11x11"
    with pytest.raises(ValueError, match=msg):
        model(random_images(1, size))


def test_config_errors() -> None:
    with pytest.raises(ValueError, match=r"embed dim 200 is not divisible by num_heads 3"):
        CvTConfig(embed_dim=(64, 200, 384))
    with pytest.raises(ValueError, match=r"one entry per stage.*'depth': 2"):
        CvTConfig(depth=(1, 2))
    with pytest.raises(ValueError, match=r"kernel_qkv must be odd .*got 4"):
        CvTConfig(kernel_qkv=4)
    with pytest.raises(ValueError, match=r"qk_scale must be 'embed_dim' or 'head_dim', got 'dim'"):
        CvTConfig(qk_scale="dim")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"qk_scale must be 'embed_dim' or 'head_dim', got 'dim'"):
        ConvAttention(64, num_heads=1, qk_scale="dim")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"img_size 8 is too small .*smallest size is 11"):
        CvTConfig(img_size=8)
    with pytest.raises(ValueError, match=r"patch_padding must be >= 0, got \(-1, 1, 1\)"):
        CvTConfig(patch_padding=(-1, 1, 1))


def test_unknown_override() -> None:
    # The per-stage fields once had plural names; the old name is rejected, not ignored.
    with pytest.raises(TypeError, match=r"CvTConfig has no field\(s\) \['embed_dims'\]"):
        vitlab.create_model("cvt_13", embed_dims=(64, 192, 384))


def test_list_models_has_the_cvt_presets() -> None:
    assert set(CVT_NAMES) <= set(vitlab.list_models("cvt"))
