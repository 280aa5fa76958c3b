"""LeViT: timm weight equivalence, the attention bias, the two attention paths, the two heads, bad configs.

Checks shared by every family live in tests/test_contract.py.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import vitlab
from conftest import assert_same_logits, load_reference, random_images, timm_model
from vitlab.models.levit import LeViTAttention, LeViTConfig, attention_bias_index

LEVIT_NAMES = ["levit_128s", "levit_128", "levit_192", "levit_256", "levit_384"]


def randomize(model: nn.Module, inputs: torch.Tensor | None = None, seed: int = 1) -> nn.Module:
    """Random BatchNorm affine parameters and attention biases, then BatchNorm statistics
    measured on random images; returns the model in eval mode.

    At init every residual branch ends in a BN with weight 0, the biases are 0 and the
    running statistics are (0, 1): a wrongly loaded tensor would not show. Untrained
    statistics would also let the tokens collapse to one value by stage 3, which hides
    any mistake in the attention. Statistics measured on ``inputs`` (default: the test
    batch, ``random_images(2)``) keep the activations normalised. The variances are
    floored at 0.1: random images give some features (the pooled ones above all) almost
    no spread, and dividing by that would blow up rounding errors into large logits.
    """
    generator = torch.Generator().manual_seed(seed)
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    with torch.no_grad():
        for bn in norms:
            bn.weight.copy_(0.5 + torch.rand(bn.weight.shape, generator=generator))
            bn.bias.copy_(0.4 * torch.rand(bn.bias.shape, generator=generator) - 0.2)
            bn.reset_running_stats()
            bn.momentum = None  # running statistics = plain average over the calibration batch
        for name, param in model.named_parameters():
            if name.endswith("attention_biases"):
                param.copy_(torch.randn(param.shape, generator=generator))
        model.train()(random_images(2) if inputs is None else inputs)
        for bn in norms:
            bn.momentum = 0.1
            bn.running_var.clamp_(min=0.1)
    return model.eval()


# A depth-cut LeViT-128S at 128 px (8x8 -> 4x4 -> 2x2 maps): every kind of layer, with
# shrink attention twice; the state-dict keys and shapes of every preset are compared with
# timm's elsewhere. ``randomize`` makes every BatchNorm, bias and attention bias count.
SMALL = dict(depth=(1, 1, 1), img_size=128)


def small_model(seed: int = 1) -> nn.Module:
    """A randomized depth-cut LeViT-128S (``SMALL``), in eval mode."""
    return randomize(vitlab.create_model("levit_128s", **SMALL), random_images(2, 128), seed=seed)


def test_timm_weights_give_same_logits() -> None:
    reference = randomize(timm_model("levit_128s", **SMALL), random_images(2, 128))
    model = load_reference("levit_128s", reference, **SMALL)
    images = random_images(2, 128, seed=3)
    assert_same_logits(model, reference, images)
    with torch.no_grad():
        assert reference(images).abs().max() > 0.1  # the randomized model does not output ~0


def test_convert_timm_renames_three_things() -> None:
    state_dict = timm_model("levit_128s").state_dict()
    converted = vitlab.convert_state_dict("levit_128s", state_dict, "timm")
    assert len(converted) == len(state_dict)
    renamed = {k for k in state_dict if k not in converted}
    assert renamed == {
        k for k in state_dict if (k.startswith("stem.") and ".linear." in k) or ".proj.ln." in k or ".q.ln." in k
    }
    assert "stem.conv1.conv.weight" in converted and "stages.1.downsample.attn_downsample.q.linear.weight" in converted


def test_training_returns_both_heads_and_eval_averages_them() -> None:
    images = random_images(2, 128)
    reference = randomize(timm_model("levit_128s", **SMALL), images)
    model = load_reference("levit_128s", reference, **SMALL)
    model.train()
    reference.train()
    reference.set_distilled_training(True)
    with torch.no_grad():
        logits, dist_logits = model(images)  # batch statistics in training mode
        ref_logits, ref_dist_logits = reference(images)
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(dist_logits, ref_dist_logits, atol=1e-4, rtol=0)
    model.eval()
    with torch.no_grad():
        pooled = model.forward_features(images).mean(dim=1)
        torch.testing.assert_close(model(images), (model.head(pooled) + model.head_dist(pooled)) / 2)
        assert not torch.allclose(model.head(pooled), model.head_dist(pooled))


def attention_outputs(model: nn.Module, images: torch.Tensor) -> list[torch.Tensor]:
    """What every LeViTAttention layer returns during ``model(images)``."""
    outputs: list[torch.Tensor] = []
    layers = [m for m in model.modules() if isinstance(m, LeViTAttention)]
    handles = [m.register_forward_hook(lambda _m, _a, out: outputs.append(out)) for m in layers]
    try:
        with torch.no_grad():
            model(images)
    finally:
        for handle in handles:
            handle.remove()
    return outputs


def test_fused_and_explicit_attention_agree() -> None:
    # At initialisation every residual attention branch ends in a BatchNorm with weight 0 and
    # the biases are 0, so the attention outputs are 0 and the two paths would agree even if
    # one were wrong; randomize() moves every BatchNorm and bias off its initial value.
    images = random_images(2, 128, seed=3)
    model = small_model()
    per_layer = {}
    for fused in (True, False):
        vitlab.set_fused_attention(model, fused)
        assert all(m.fused_attn is fused for m in model.modules() if isinstance(m, LeViTAttention))
        with torch.no_grad():
            logits = model(images)
        per_layer[fused] = (logits, attention_outputs(model, images))
    (fused_logits, fused_layers), (explicit_logits, explicit_layers) = per_layer[True], per_layer[False]
    assert len(fused_layers) == 5 and all(out.abs().amax() > 0.1 for out in fused_layers)  # not all zero
    for a, b in zip(fused_layers, explicit_layers):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(fused_logits, explicit_logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("attn_ratio", [0.5, 1, 2, 4])  # values narrower than, as wide as, wider than keys
@pytest.mark.parametrize("stride", [1, 2])
def test_fused_and_explicit_layer_agree_for_any_value_width(attn_ratio: float, stride: int) -> None:
    x = torch.randn(2, 36, 16)
    layer = LeViTAttention(16, 16, key_dim=4, num_heads=2, attn_ratio=attn_ratio, resolution=6, stride=stride)
    randomize(layer, x)
    with torch.no_grad():
        fused = layer(x)
        layer.fused_attn = False
        assert fused.abs().amax() > 0.1
        torch.testing.assert_close(fused, layer(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("stride", [1, 2])
def test_both_paths_train_the_bias_alike(stride: int) -> None:
    # SDPA takes the bias as a float attn_mask; its gradient must reach the table as on the explicit path.
    x = torch.randn(2, 36, 16)
    layer = randomize(LeViTAttention(16, 16, key_dim=4, num_heads=2, attn_ratio=2, resolution=6, stride=stride), x)
    grads = []
    for fused in (True, False):
        layer.fused_attn = fused
        layer.zero_grad()
        layer(x).square().sum().backward()
        grads.append(layer.attention_biases.grad.clone())
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("fused", [True, False])
def test_editing_the_biases_through_data_changes_the_output(fused: bool) -> None:
    # Issue 27, bug 2: the default path cached the gathered bias keyed on the table's version
    # counter, which an edit through .data does not bump, so it kept returning the old output.
    images = random_images(2, 128, seed=3)
    model = vitlab.set_fused_attention(small_model(), fused)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        before = model(images)
        for name, param in model.named_parameters():
            if name.endswith("attention_biases"):
                param.data.add_(torch.randn(param.shape, generator=generator))
        after = model(images)
        fresh = vitlab.create_model("levit_128s", **SMALL).eval()
        fresh.load_state_dict(model.state_dict())
        expected = vitlab.set_fused_attention(fresh, fused)(images)
    assert not torch.allclose(after, before, atol=1e-3)
    torch.testing.assert_close(after, expected, atol=0, rtol=0)


# ---------------------------------------------------------------- the attention bias


def official_style_index(resolution: int, stride: int) -> torch.Tensor:
    """The official numbering, rewritten: offsets get an index in order of first appearance."""
    keys = list(itertools.product(range(resolution), range(resolution)))
    queries = list(itertools.product(range(0, resolution, stride), repeat=2))
    seen: dict[tuple[int, int], int] = {}
    rows = [[seen.setdefault((abs(qy - ky), abs(qx - kx)), len(seen)) for ky, kx in keys] for qy, qx in queries]
    return torch.tensor(rows)


@pytest.mark.parametrize("resolution, stride, shape", [(14, 1, (196, 196)), (14, 2, (49, 196)), (7, 2, (16, 49))])
def test_bias_index_table(resolution: int, stride: int, shape: tuple[int, int]) -> None:
    index = attention_bias_index(resolution, stride)
    assert index.shape == shape
    assert index.dtype == torch.long
    assert index.min() == 0 and index.max() == resolution**2 - 1  # every table entry is used
    torch.testing.assert_close(index, official_style_index(resolution, stride), rtol=0, atol=0)


def test_bias_index_values() -> None:
    index = attention_bias_index(14)
    # query (0, 0) vs key (1, 1) -> offset (1, 1) -> 1 * 14 + 1; key (13, 2) -> 13 * 14 + 2.
    assert index[0, 15] == 15 and index[0, 13 * 14 + 2] == 13 * 14 + 2
    assert (index.diagonal() == 0).all() and torch.equal(index, index.T)
    shrink = attention_bias_index(14, 2)
    # shrink query 1 sits at (0, 2); key (0, 0) is 2 columns away.
    assert shrink[1, 0] == 2 and shrink[8, 0] == 2 * 14 + 2  # query 8 sits at (2, 2)


def test_bias_tables_in_the_model_match_timm() -> None:
    model, reference = vitlab.create_model("levit_128s"), timm_model("levit_128s")
    ours = {k: v for k, v in model.named_buffers() if k.endswith("attention_bias_idxs")}
    theirs = {k.replace(".ln.", "."): v for k, v in reference.named_buffers() if k.endswith("attention_bias_idxs")}
    assert ours.keys() == theirs.keys() and len(ours) == 2 + 3 + 4 + 2
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    assert ours["stages.0.blocks.0.attn.attention_bias_idxs"].shape == (196, 196)
    assert ours["stages.1.downsample.attn_downsample.attention_bias_idxs"].shape == (49, 196)
    assert model.stages[1].downsample.attn_downsample.attention_biases.shape == (8, 196)  # C/D = 128/16 heads


@pytest.mark.parametrize("stride", [1, 2])
def test_bias_is_added_after_scaling(stride: int) -> None:
    # Pitfall 14: softmax(q k^T * D**-0.5 + B), not softmax((q k^T + B) / sqrt(D)), not ... + B / scale.
    D, h, r = 4, 2, 4
    layer = LeViTAttention(8, 8, key_dim=D, num_heads=h, attn_ratio=2, resolution=r, stride=stride)
    x = torch.randn(2, r * r, 8)
    randomize(layer, x)
    with torch.no_grad():
        if stride == 1:
            q, k, v = layer.qkv(x).view(2, r * r, h, -1).transpose(1, 2).split([D, D, 2 * D], dim=-1)
        else:
            k, v = layer.kv(x).view(2, r * r, h, -1).transpose(1, 2).split([D, 2 * D], dim=-1)
            x_q = x.view(2, r, r, 8)[:, ::2, ::2].reshape(2, -1, 8)
            q = layer.q(x_q).view(2, -1, h, D).transpose(1, 2)
        bias = layer.attention_biases[:, layer.attention_bias_idxs]
        assert bias.abs().max() > 0.5

        def output(logits: torch.Tensor) -> torch.Tensor:
            out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(2, -1, h * 2 * D)
            return layer.proj(layer.act(out))

        right = output(q @ k.transpose(-2, -1) / D**0.5 + bias)
        for fused in (True, False):
            layer.fused_attn = fused
            torch.testing.assert_close(layer(x), right, atol=1e-5, rtol=1e-5)
        note = output((q @ k.transpose(-2, -1) + bias) / D**0.5)
        lucidrains = output(q @ k.transpose(-2, -1) * D**-0.5 + bias / D**-0.5)
        assert not torch.allclose(note, right, atol=1e-3) and not torch.allclose(lucidrains, right, atol=1e-3)


def test_biases_start_at_zero() -> None:
    model = vitlab.create_model("levit_128s")
    biases = [p for n, p in model.named_parameters() if n.endswith("attention_biases")]
    assert len(biases) == 11 and all((b == 0).all() for b in biases)


# ---------------------------------------------------------------- shapes


def test_stem_and_stage_shapes() -> None:
    model = vitlab.create_model("levit_128s").eval()
    assert model.config.resolutions == [14, 7, 4]
    x = random_images(1)
    sides = []
    with torch.no_grad():
        for name, layer in model.stem.named_children():
            x = layer(x)
            if name.startswith("conv"):
                sides.append(tuple(x.shape[1:]))
        assert sides == [(16, 112, 112), (32, 56, 56), (64, 28, 28), (128, 14, 14)]
        x = x.flatten(2).transpose(1, 2)
        shapes = []
        for stage in model.stages:
            x = stage(x)
            shapes.append(tuple(x.shape))
    assert shapes == [(1, 196, 128), (1, 49, 256), (1, 16, 384)]


def test_hardswish_everywhere() -> None:
    model = vitlab.create_model("levit_128s")
    assert not any(isinstance(m, (nn.GELU, nn.ReLU)) for m in model.modules())  # Pitfall 15
    assert sum(isinstance(m, nn.Hardswish) for m in model.modules()) == 3 + 2 * (9 + 2)


# ---------------------------------------------------------------- bad input


def test_attention_maps_include_shrink_attention() -> None:
    model = vitlab.create_model("levit_128s").eval()
    maps = [record.attn for record in vitlab.attention_maps(model, random_images(1))]
    assert [tuple(m.shape[1:]) for m in maps] == (
        [(4, 196, 196)] * 2 + [(8, 49, 196)] + [(6, 49, 49)] * 3 + [(16, 16, 49)] + [(8, 16, 16)] * 4
    )
    for m in maps:  # softmax rows, the bias included
        torch.testing.assert_close(m.sum(-1), torch.ones(m.shape[:-1]))


def test_other_image_size_builds_its_own_tables() -> None:
    model = vitlab.create_model("levit_128s", img_size=128).eval()
    assert model.config.resolutions == [8, 4, 2]
    assert model.stages[0].blocks[0].attn.attention_biases.shape == (4, 64)
    assert model(random_images(1, 128)).shape == (1, 1000)


def test_embed_dim_not_divisible_by_key_dim() -> None:
    # Shrink attention has C / D heads: 200 / 16 is not a whole number of heads.
    with pytest.raises(ValueError, match=r"needs embed_dim\[0\] divisible by key_dim, got 200 and 16"):
        LeViTConfig(embed_dim=(200, 256, 384))


def test_value_dim_must_be_an_integer() -> None:
    with pytest.raises(ValueError, match=r"attn_ratio \* key_dim must be a positive integer, got 2.1 \* 16"):
        LeViTConfig(attn_ratio=2.1)


def test_image_size_not_a_multiple_of_the_stem_stride() -> None:
    with pytest.raises(ValueError, match=r"img_size must be a positive multiple of 16 \(the stem\), got 200"):
        vitlab.create_model("levit_128s", img_size=200)


def test_mismatched_stage_tuples() -> None:
    with pytest.raises(ValueError, match=r"one entry per stage, got lengths 3, 2, 3"):
        LeViTConfig(depth=(2, 3))


def test_non_positive_heads() -> None:
    with pytest.raises(ValueError, match=r"must be positive .* num_heads=\(4, 0, 8\)"):
        LeViTConfig(num_heads=(4, 0, 8))


def test_convert_refuses_a_checkpoint_without_head_dist() -> None:
    state_dict = {k: v for k, v in timm_model("levit_128s").state_dict().items() if not k.startswith("head_dist.")}
    with pytest.raises(ValueError, match=r"config has distilled=True but the state dict has no head_dist"):
        vitlab.convert_state_dict("levit_128s", state_dict, "timm")


def test_list_models_has_the_levit_presets() -> None:
    assert set(LEVIT_NAMES) == set(vitlab.list_models("levit"))
